"""qmma_kernel (the verify's quantised GEMM, q4_K / q6_K at 5..72 rows), before and after, on one card (run on the
device machine from the repository root, PYTHONPATH=.). SYNTHETIC weights: speed figures only.

"Before" is the engines/ tree of BEFORE_COMMIT (default d1d2484: main before q4_K's exact fp16 route), from
.carry/qmma/before/engines when its COMMIT matches, else `git archive`; "after" is this tree. Both CUDA builds,
the synthetic 27B Q4_K_M GGUF and its random DFlash draft in parallel at the start (check_dec_gpu.py's
helpers), then, most important first:
  1. lucebench-gpu-op-check --qmma (after): qmma_kernel on the 27B's shapes at 9 / 23 / 41 rows, odd shapes at
     5..72 rows and decode's 1 / 2 / 4, activations of every magnitude (1e4, 1e-4, zero rows), per element
     against sum |w| |x|: the CPU reference (q4_K 1e-3: fp16 x; q6_K 1e-2: bf16) and each type's contract
     (2e-5), run to run bitwise, one K split (the graph-capture path), the last round split over warps, a
     token's sums independent of the tile count (bitwise);
  2. the whole op check (after);
  3. --time-quant of both builds: per matrix ms and weight GB/s, before / after (time_quant_cmp.md), qmma at
     1 / 4 / 9 / 17 / 23 / 33 / 65 rows before / after and against the same build's one-row qmv_kernel, and
     qmv against qmma at 1..4 rows (qmma_vs_qmv.md, printed);
  4. lucebench-verify-gpu-check (after): the GPU verify + commit equal to AR decoding;
  5. the verify cost of B + 1 rows against a decode step on the 27B (--time-model), after and before;
  6. as time allows (DEADLINE_S): DFlash forced AL 8.31 at budgets 8 and 22 (after: tok/s and against ar),
     then DFlash == AR greedy on the synthetic 0.8B Q4_K_M GGUF (check_dflash_gpu.sh's lossless-synth part:
     chain, budgets 8 / 22 / 40, KV bf16 and q8_0; the verify's rows through qmma_kernel, AR's through qmv).
Writes $OUT/qmma/: check_qmma_gpu.json, op_check_qmma.md, op_check.md, time_quant{,_before,_cmp}.md,
qmma_vs_qmv.md, verify_time_27b{,_before}.txt, dflash_speed.log, dflash_lossless.log, table.md (also printed),
build logs; the last line printed is SUMMARY. About 6-7 minutes on an H100 (at most ~8).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("DEC_NAME", "qmma")
os.environ.setdefault("BEFORE_COMMIT", "d1d2484")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_dec_gpu as cd  # noqa: E402  (builds, synthetic models, verify timing, DFlash speed)

OUT, R = cd.OUT, cd.R
AFTER_BUILD, BEFORE_BUILD = cd.AFTER_BUILD, cd.BEFORE_BUILD
DEADLINE_S = float(os.environ.get("DEADLINE_S", "450"))
cd.DEADLINE_S = DEADLINE_S
log, left = cd.log, cd.left


def save() -> None:
    (OUT / "check_qmma_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def op_check_qmma() -> int:
    rc = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check"), "--qmma"], capture_output=True, text=True,
                        timeout=300)
    (OUT / "op_check_qmma.md").write_text(rc.stdout + rc.stderr)
    lines = rc.stdout.strip().splitlines()
    bad = [ln for ln in lines if "FAIL" in ln]
    worst: dict[str, float] = {}
    for ln in lines:  # the largest error of each kind of row
        c = [x.strip() for x in ln.strip().strip("|").split("|")]
        if len(c) == 6 and c[0] == "matmul_quant":
            typ = c[1].split(",")[0]
            if "= the first of" in c[1]:
                kind = "tile count (values differing)"
            else:
                kind = next((k for k in ("one K split, fp16 x contract", "one K split, bf16 contract",
                                         "fp16 x contract", "bf16 contract", "run to run (values differing)")
                             if c[1].endswith(": " + k)), "against the CPU reference")
            try:
                worst[f"{typ} {kind}"] = max(worst.get(f"{typ} {kind}", 0.0), float(c[3]))
            except ValueError:
                pass
    R["op_check_qmma"] = {"rc": rc.returncode, "summary": lines[-1:], "failed": bad, "worst": worst}
    log(f"op check --qmma (after): rc {rc.returncode}, {lines[-1:] if lines else rc.stderr[-400:]}; largest errors "
        + ", ".join(f"{k}: {v:.2e}" for k, v in worst.items()))
    if bad:
        print("\n".join(bad[:40]), flush=True)
    save()
    return rc.returncode


def time_quant() -> None:
    tq = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check"), "--time-quant"], capture_output=True, text=True,
                        timeout=150)
    (OUT / "time_quant.md").write_text(tq.stdout + tq.stderr)
    cd.time_quant_before(tq.stdout)  # time_quant_before.md, time_quant_cmp.md (printed)
    qmma_vs_qmv()


NS = (1, 4, 9, 17, 23, 33, 65)  # a verify's row counts (DFlash budget 8: 9; DDTree 22: 23) and around them


def qmma_vs_qmv() -> None:
    """qmma at NS rows, before / after, and against the same build's one-row qmv_kernel (qmma_vs_qmv.md)."""
    rows: dict[str, dict[tuple[str, str], float]] = {}
    for key, name in (("after", "time_quant.md"), ("before", "time_quant_before.md")):
        p = OUT / name
        d: dict[tuple[str, str], float] = {}
        for ln in (p.read_text() if p.is_file() else "").splitlines():
            c = [x.strip() for x in ln.strip().strip("|").split("|")]
            if len(c) == 5 and c[0] not in ("matrix", "---"):
                try:
                    d[(c[0], c[2])] = float(c[3])
                except ValueError:
                    pass
        rows[key] = d
    mats = list(dict.fromkeys(m for (m, _) in rows["after"]))  # in the table's order
    fmt = lambda v: f"{v * 1e3:.1f}" if v else "-"  # noqa: E731
    out = ["| matrix | qmv 1 row us (before / after) | rows | qmma us before | after | after / before | "
           "before / qmv | after / qmv |", "|---|---|---|---|---|---|---|---|"]
    summary = {}
    for m in mats:
        qa, qb = rows["after"].get((m, "1 (qmv)")), rows["before"].get((m, "1 (qmv)"))
        for n in NS:
            b, a = rows["before"].get((m, f"{n} (qmma)")), rows["after"].get((m, f"{n} (qmma)"))
            ratio = lambda u, v: f"{u / v:.2f}x" if u and v else "-"  # noqa: E731
            out.append(f"| {m} | {fmt(qb)} / {fmt(qa)} | {n} | {fmt(b)} | {fmt(a)} | {ratio(a, b)} | "
                       f"{ratio(b, qb)} | {ratio(a, qa)} |")
            if a and qa:
                summary[f"{m} n={n}"] = round(a / qa, 3)
    # the dispatch's crossover: qmv_kernel (the engines' kernel up to kQuantGemvMax = 4 rows) against qmma_kernel
    out += ["", "| matrix (after) | qmv 1 row us | rows | qmv us | qmma us | qmma / qmv |", "|---|---|---|---|---|---|"]
    for m in mats:
        qa = rows["after"].get((m, "1 (qmv)"))
        for n in (1, 2, 3, 4):
            v, a = rows["after"].get((m, f"{n} (qmv)")), rows["after"].get((m, f"{n} (qmma)"))
            out.append(f"| {m} | {fmt(qa)} | {n} | {fmt(v)} | {fmt(a)} | {f'{a / v:.2f}x' if a and v else '-'} |")
    txt = "\n".join(out) + "\n"
    (OUT / "qmma_vs_qmv.md").write_text(txt)
    R["qmma_vs_qmv"] = txt
    R["qmma_over_qmv_after"] = summary
    print(txt, flush=True)
    save()


def verify_ratio(key: str, b: int) -> str:
    txt = R.get(f"verify_27b_{key}") or ""
    m = re.search(rf"^\| {b} \| {b + 1} \| ([0-9.]+) \| ([0-9.]+) \|", txt, re.M)
    step = re.search(r"decode step \(\w+ graph\) ([0-9.]+) ms", txt)
    return (f"{m.group(1)} ms = {m.group(2)}x the {step.group(1) if step else '?'} ms step" if m else "n/a")


def main() -> int:
    log(f"card: {cd.cq.record_card()}; before = {cd.BEFORE_COMMIT}")
    errors: list[str] = []
    try:
        src = cd.before_source()
    except (OSError, subprocess.CalledProcessError) as exc:
        log(f"FAILED: no before tree (carry .carry/qmma/before/engines, or run in a git checkout): {exc!r}")
        return 1
    R["before_source"] = str(src)
    paths: dict = {}
    nproc = os.cpu_count() or 16
    threads = [cd.cq.start_guarded(errors, cd.build, cd.ROOT / "engines", AFTER_BUILD, "dflash",
                                   ["lucebench-ar", "lucebench-dflash", "lucebench-gpu-op-check",
                                    "lucebench-verify-gpu-check"], max(2, nproc * 5 // 8), "after"),
               cd.cq.start_guarded(errors, cd.build, src, BEFORE_BUILD, "before",
                                   ["lucebench-gpu-op-check", "lucebench-verify-gpu-check"], max(2, nproc * 3 // 8),
                                   "before"),
               cd.cq.start_guarded(errors, cd.synth_all, paths), cd.cq.start_guarded(errors, cd.synth_08b)]
    for th in threads:
        th.join()
    log(f"builds done (after {R.get('build_after_s')} s, before {R.get('build_before_s')} s), synth done")
    save()
    if errors:
        log("FAILED: " + "; ".join(errors))
        print(f"SUMMARY rc 1 | builds / synthetic models FAILED: {'; '.join(errors)}", flush=True)
        return 1

    rc_qmma = 1
    try:
        rc_qmma = op_check_qmma()
    except Exception as exc:
        errors.append(f"op_check_qmma: {exc!r}")
        log(f"FAILED op_check_qmma: {exc!r}")
    op_check_all()
    try:
        time_quant()
    except Exception as exc:
        errors.append(f"time_quant: {exc!r}")
        log(f"FAILED time_quant: {exc!r}")
    vc = subprocess.run([str(AFTER_BUILD / "lucebench-verify-gpu-check")], capture_output=True, text=True, timeout=240)
    (OUT / "verify_gpu_check.txt").write_text(vc.stdout + vc.stderr)
    R["verify_gpu_check"] = {"rc": vc.returncode, "tail": vc.stdout.strip().splitlines()[-6:]}
    log(f"lucebench-verify-gpu-check (verify == AR, after): rc {vc.returncode}\n"
        + "\n".join(R["verify_gpu_check"]["tail"]))
    save()
    for build_dir, key in ((AFTER_BUILD, "after"), (BEFORE_BUILD, "before")):
        try:
            cd.verify_time(paths["27b"], build_dir, key)
        except Exception as exc:
            errors.append(f"verify_time {key}: {exc!r}")
            log(f"FAILED verify_time {key}: {exc!r}")
        save()
    # as time allows: DFlash at forced AL (~90 s), then DFlash == AR on the 0.8B Q4_K_M (~60 s)
    if left() > 100:
        try:
            cd.dflash_speed(paths)
        except Exception as exc:
            log(f"DFlash speed failed: {exc!r}")
    else:
        log("skipped DFlash speed (time)")
    if left() > 70:
        try:
            dflash_lossless(paths)
        except Exception as exc:
            log(f"DFlash lossless failed: {exc!r}")
    else:
        log("skipped DFlash lossless on the 0.8B Q4_K_M (time)")
    R["errors"] = errors
    R["wall_s"] = round(time.time() - cd.T0, 1)
    save()
    oq = R.get("op_check_qmma", {})
    txt = (f"| {R.get('card', '?').split(',')[0]}, SYNTHETIC 27B Q4_K_M | before ({cd.BEFORE_COMMIT}) | after |\n"
           "|---|---|---|\n"
           f"| verify B = 8 (9 rows), context 512 | {verify_ratio('before', 8)} | {verify_ratio('after', 8)} |\n"
           f"| verify B = 22 (23 rows), context 512 | {verify_ratio('before', 22)} | {verify_ratio('after', 22)} |\n\n"
           f"op check --qmma rc {oq.get('rc')} ({oq.get('summary')}); largest errors {oq.get('worst')}; "
           f"verify-gpu-check rc {R['verify_gpu_check']['rc']}; whole op check rc "
           f"{R.get('op_check', {}).get('rc', 'not run')}; errors {errors}; {R['wall_s']:.0f} s\n\n"
           + R.get("qmma_vs_qmv", ""))
    (OUT / "table.md").write_text(txt)
    print(txt, flush=True)
    rc = 1 if errors or rc_qmma or R["verify_gpu_check"]["rc"] or R.get("op_check", {}).get("rc") else 0
    print(summary_line(rc), flush=True)
    return rc


def op_check_all() -> None:
    """The whole op check (after): every op, qmma's default rows and the qmv kernels included (~40 s)."""
    oc = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check")], capture_output=True, text=True, timeout=240)
    (OUT / "op_check.md").write_text(oc.stdout + oc.stderr)
    R["op_check"] = {"rc": oc.returncode, "summary": oc.stdout.strip().splitlines()[-1:],
                     "failed": [ln for ln in oc.stdout.splitlines() if "FAIL" in ln]}
    if R["op_check"]["failed"]:
        print("\n".join(R["op_check"]["failed"][:40]), flush=True)
    log(f"op check (after, all ops): rc {oc.returncode}, {R['op_check']['summary']}")
    save()


def dflash_lossless(paths: dict) -> None:
    """check_dflash_gpu.sh's lossless-synth part on the synthetic 0.8B Q4_K_M GGUF (a verify's rows through
    qmma_kernel) with a random draft of its shape: dflash == ar greedy, chain and trees, KV bf16 and q8_0."""
    env = dict(os.environ, OUT=str(OUT), PARTS="lossless-synth", DFLASH_LOSSLESS_TARGET=str(paths["0.8b"]),
               DFLASH_LOSSLESS_DRAFT=str(cd.cq.synth_draft("qwen3.5-0.8b")), ARCH=cd.ARCH)
    with (OUT / "dflash_lossless.log").open("w") as f:
        rc = subprocess.run(["bash", "scripts/device/check_dflash_gpu.sh"], cwd=cd.ROOT, env=env, stdout=f,
                            stderr=subprocess.STDOUT, timeout=max(60.0, left() + 60)).returncode
    txt = (OUT / "dflash_lossless.log").read_text()
    rows = [ln for ln in txt.splitlines() if "lossless" in ln.lower() or "FAIL" in ln or "diverg" in ln]
    print("\n".join(rows[-30:]), flush=True)
    R["dflash_lossless"] = {"rc": rc, "rows": rows}
    log(f"DFlash == AR on the 0.8B Q4_K_M (after): rc {rc}")
    save()


def summary_line(rc: int) -> str:
    """One line of the key numbers: the checks' results, the verify / step ratios, qmma against qmv at 1 and 4
    rows (gate_up), DFlash tok/s against ar where it ran."""
    oq = R.get("op_check_qmma", {})

    def ratio(key: str, b: int) -> str:
        m = re.search(rf"^\| {b} \| {b + 1} \| [0-9.]+ \| ([0-9.]+) \|", R.get(f"verify_27b_{key}") or "", re.M)
        return m.group(1) if m else "?"

    qv = R.get("qmma_over_qmv_after", {})
    gu = {n: qv.get(f"ffn gate_up q4_K n={n}") for n in (1, 4, 9, 23)}
    ds = R.get("dflash_speed", {}).get("rows", [])
    ar = next((ln.split("ar:")[1].split("tok/s")[0].strip() for ln in ds if " ar: " in ln), "?")
    # the speed part's rows: | budget | mode | forced AL | AL | tok/s | x ar | ... (check_dflash_gpu.py)
    sp = []
    for ln in ds:
        c = [x.strip() for x in ln.strip().strip("|").split("|")]
        if len(c) >= 6 and c[0].isdigit():
            sp.append(f"B{c[0]} {c[1]} {c[4]} tok/s {c[5]}x ar")
    dl = R.get("dflash_lossless", {})
    return (f"SUMMARY rc {rc} | op check --qmma rc {oq.get('rc')} failed {len(oq.get('failed', []))} | whole op check "
            f"rc {R.get('op_check', {}).get('rc', 'not run')} | verify==AR rc {R.get('verify_gpu_check', {}).get('rc')}"
            f" | verify/step B8 {ratio('before', 8)}x -> {ratio('after', 8)}x, B22 {ratio('before', 22)}x -> "
            f"{ratio('after', 22)}x | gate_up qmma/qmv(1 row) at n=1,4,9,23: {gu} | DFlash forced AL 8.31 (after, rc "
            f"{R.get('dflash_speed', {}).get('rc', 'not run')}): ar {ar} tok/s, {'; '.join(sp) or '-'} | 0.8B "
            f"Q4_K_M DFlash == AR rc {dl.get('rc', 'not run')}")


if __name__ == "__main__":
    sys.exit(main())
