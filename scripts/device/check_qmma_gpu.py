"""qmma_kernel (the verify's quantised GEMM, q4_K / q6_K at 5..72 rows), before and after, on one card (run on the
device machine from the repository root, PYTHONPATH=.). SYNTHETIC weights: speed figures only.

"Before" is the engines/ tree of BEFORE_COMMIT (default ed21b94: main before the qmma branch's q4_K dequantisation
by nibble position and last-round split over warps), from .carry/qmma/before/engines when its COMMIT matches,
else `git archive`; "after" is this tree. Both CUDA builds, the synthetic 27B Q4_K_M GGUF and its random DFlash
draft in parallel at the start (check_dec_gpu.py's helpers), then, most important first:
  1. lucebench-gpu-op-check --qmma (after): qmma_kernel on the 27B's shapes at 9 / 23 / 41 rows and odd shapes
     at 5..72 rows, against the CPU reference (2e-2) and its bf16 contract (5e-4), run to run bitwise, in one
     K split (the graph-capture path), the last round's groups split over warps, and the two q4_K routes'
     weights equal (bitwise);
  2. --time-quant of both builds: per matrix ms and weight GB/s, before / after (time_quant_cmp.md), and
     qmma at 4 / 9 / 17 / 23 / 33 / 65 rows before / after and against the same build's one-row qmv_kernel,
     and qmv against qmma at 2 / 3 / 4 rows (the dispatch's crossover; qmma_vs_qmv.md, printed);
  3. lucebench-verify-gpu-check (after): the GPU verify + commit equal to AR decoding;
  4. the verify cost of B + 1 rows against a decode step on the 27B (--time-model, after);
  5. as time allows (DEADLINE_S): DFlash forced AL 8.31 at budgets 8 and 22 (after), the whole op check
     (after), the verify cost of the before build.
Writes $OUT/qmma/: check_qmma_gpu.json, op_check_qmma.md, time_quant{,_before,_cmp}.md, qmma_vs_qmv.md,
verify_time_27b{,_before}.txt, dflash_speed.log, op_check.md, table.md (also printed last), build logs. About
6-7 minutes on an H100 (at most ~8).
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
os.environ.setdefault("BEFORE_COMMIT", "ed21b94")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_dec_gpu as cd  # noqa: E402  (builds, synthetic models, verify timing, DFlash speed)

OUT, R = cd.OUT, cd.R
AFTER_BUILD, BEFORE_BUILD = cd.AFTER_BUILD, cd.BEFORE_BUILD
DEADLINE_S = float(os.environ.get("DEADLINE_S", "430"))
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
            kind = ("the q4_K routes' weights (values differing)" if "= the first of" in c[1] else
                    next((k for k in ("one K split, bf16 contract", "bf16 contract", "run to run (values differing)")
                          if c[1].endswith(": " + k)), "against the CPU reference"))
            try:
                worst[kind] = max(worst.get(kind, 0.0), float(c[3]))
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


NS = (4, 9, 17, 23, 33, 65)  # a verify's row counts (DFlash budget 8: 9; DDTree 22: 23) and around them


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
        for n in (2, 3, 4):
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
        return 1

    steps = [(op_check_qmma,), (time_quant,)]
    rc_qmma = 1
    for fn, *a in steps:
        try:
            r = fn(*a)
            if fn is op_check_qmma:
                rc_qmma = r
        except Exception as exc:
            errors.append(f"{fn.__name__}: {exc!r}")
            log(f"FAILED {fn.__name__}: {exc!r}")
    vc = subprocess.run([str(AFTER_BUILD / "lucebench-verify-gpu-check")], capture_output=True, text=True, timeout=240)
    (OUT / "verify_gpu_check.txt").write_text(vc.stdout + vc.stderr)
    R["verify_gpu_check"] = {"rc": vc.returncode, "tail": vc.stdout.strip().splitlines()[-6:]}
    log(f"lucebench-verify-gpu-check (verify == AR, after): rc {vc.returncode}\n"
        + "\n".join(R["verify_gpu_check"]["tail"]))
    save()
    try:
        cd.verify_time(paths["27b"], AFTER_BUILD, "after")
    except Exception as exc:
        errors.append(f"verify_time after: {exc!r}")
        log(f"FAILED verify_time after: {exc!r}")
    save()
    # as time allows, most useful first: DFlash at forced AL (~90 s), the whole op check (~40 s: the qmv rows and
    # qmma's default rows), the verify cost of the before build (~30 s)
    if left() > 130:
        try:
            cd.dflash_speed(paths)
        except Exception as exc:
            log(f"DFlash speed failed: {exc!r}")
    else:
        log("skipped DFlash speed (time)")
    if left() > 50:
        oc = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check")], capture_output=True, text=True,
                            timeout=max(60.0, left() + 60))
        (OUT / "op_check.md").write_text(oc.stdout + oc.stderr)
        R["op_check"] = {"rc": oc.returncode, "summary": oc.stdout.strip().splitlines()[-1:],
                         "rows": [ln for ln in oc.stdout.splitlines() if "qmma" in ln or "FAIL" in ln]}
        print("\n".join(R["op_check"]["rows"]), flush=True)
        log(f"op check (after, all ops): rc {oc.returncode}, {R['op_check']['summary']}")
        save()
    else:
        log("skipped the whole op check (time)")
    if left() > 30:
        try:
            cd.verify_time(paths["27b"], BEFORE_BUILD, "before")
        except Exception as exc:
            log(f"verify_time before failed: {exc!r}")
        save()
    else:
        log("skipped the before build's verify cost (time)")
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
    return 1 if errors or rc_qmma or R["verify_gpu_check"]["rc"] or R.get("op_check", {}).get("rc") else 0


if __name__ == "__main__":
    sys.exit(main())
