"""The quantised decode step on CUDA, before and after, on one card (run on the device machine from the
repository root, PYTHONPATH=.). All model figures are on SYNTHETIC (random) weights: speed only; the token
comparisons are of two builds of the same engine, not of text.

"Before" is the engines/ tree of a named commit (default 5ad8b41), taken from .carry/dec/before/engines when
carried, else from `git archive`; "after" is this tree. In parallel at the start: both CUDA builds, the
synthetic GGUF files (qwen3.5-0.8b, qwen3.5-27b, Q4_K_M as llama.cpp's recipe types them), the random
z-lab-shaped draft for the 27B, and the CUPTI injection library. Then, after against before where both apply:
  1. lucebench-gpu-op-check (after): every op against its CPU reference; its quantised / norm rows printed;
     then --time-quant (matmul_quant alone on the 27B shapes: ms and weight GB/s per n and kernel), of both
     builds, joined in time_quant_cmp.md;
  2. 0.8B Q4_K_M `ar` greedy tokens, before = after (2 prompts x 32 tokens; bitwise-equal sums give equal
     tokens, so any difference is reported with the before build's top-2 margin there);
  3. 27B Q4_K_M `ar` decode (prompt 32, 128 tokens, 1 warm-up, 5 reps: median tok/s, roofline % against the
     measured copy bandwidth), before and after, and their 128 tokens compared;
  4. DFlash at forced AL 8.31 on the 27B (check_dflash_gpu.sh PARTS=speed, budgets 8 and 22, after);
  5. the verify cost of B + 1 rows against a decode step (lucebench-verify-gpu-check --time-model, after);
  6. as time allows (DEADLINE_S): a decode step's kernels on the GPU clock (CUPTI, after;
     check_quant_gpu.timeline_27b), then the verify cost and the CUPTI step of the before build.
(lucebench-verify-gpu-check, GPU verify + commit == AR, runs before step 2.)
Writes $OUT/$DEC_NAME/ (default dec): check_dec_gpu.json, op_check.md, time_quant{,_before,_cmp}.md,
verify_time_27b{,_before}.txt, timeline_27b{,_before}.md/csv, dg/ (the DFlash part), table.md (before /
after, also printed last), build logs. About 7 minutes on an H100/H200.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))
NAME = os.environ.get("DEC_NAME", "dec")  # the output folder under $OUT and the carried before tree's
OUT = Path(os.environ.get("OUT", "/tmp/out")) / NAME
OUT.mkdir(parents=True, exist_ok=True)
import check_quant_gpu as cq  # noqa: E402  (its synth, timeline and CUPTI helpers; it sets OUT to .../gq)

os.environ["OUT"] = str(OUT)  # engine_client's logs
cq.OUT = OUT
ARCH = os.environ.get("ARCH", "90")
BEFORE_COMMIT = os.environ.get("BEFORE_COMMIT", "5ad8b41")
AFTER_BUILD, BEFORE_BUILD = Path("/tmp/lb-dflash-build"), Path("/tmp/dec-before-build")  # after: the dflash script's
DEADLINE_S = float(os.environ.get("DEADLINE_S", "420"))  # step 6's parts start only 45 s or more before this
T0 = time.time()
R = cq.R
R.update({"label": "SYNTHETIC weights (random): speed figures only", "before_commit": BEFORE_COMMIT})
cq.T0 = T0


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "check_dec_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def left() -> float:
    return DEADLINE_S - (time.time() - T0)


def before_source() -> Path:
    carried = ROOT / ".carry" / NAME / "before" / "engines"
    mark = carried.parent / "COMMIT"  # the commit the carried tree is of, where written: it must be BEFORE_COMMIT's
    made = mark.read_text().strip() if mark.is_file() else ""
    if (carried / "CMakeLists.txt").is_file() and (not made or made.startswith(BEFORE_COMMIT)
                                                    or BEFORE_COMMIT.startswith(made)):
        return carried
    dst = Path("/tmp/dec-before-src")
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    arch = subprocess.run(["git", "archive", BEFORE_COMMIT, "engines"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dst)], input=arch.stdout, check=True)
    return dst / "engines"


def build(src: Path, dst: Path, hash_: str, targets: list[str], jobs: int, key: str) -> None:
    R[f"build_{key}_s"] = cq.cmake_build(src, dst, targets, jobs, OUT / f"build_{key}.log", hash_)


def synth_all(paths: dict) -> None:
    paths["0.8b"] = cq.synth("qwen3.5-0.8b")
    paths["27b"] = cq.synth("qwen3.5-27b")
    paths["draft"] = cq.synth_draft("qwen3.5-27b")


def synth_08b() -> None:
    """check_dflash_gpu.sh's synthetic 0.8B (its speed part writes a draft for it), made during the builds."""
    cq.synth_08b_checkpoint(OUT / "synth_08b.log")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return cq.first_divergence(a, b)


def tokens_08b(path: Path) -> None:
    from engine_client import Engine

    prompts = [[(i * 7919 + 11 * k) % 240000 + 100 for i in range(n)] for k, n in enumerate((8, 64))]
    kv = ["--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "256"]
    runs = {}
    engines = {}
    try:
        for name, exe in (("before", BEFORE_BUILD / "lucebench-ar"), ("after", AFTER_BUILD / "lucebench-ar")):
            e = engines[name] = Engine(exe, path, *kv)
            runs[name] = [e.gen(p, 32, ignore_eos=True)["output_ids"] for p in prompts]
        rows = []
        for i, p in enumerate(prompts):
            a, b = runs["after"][i], runs["before"][i]
            d = first_divergence(a, b)
            row = {"prompt_len": len(p), "identical": a == b, "first_divergence": d}
            if d is not None and d < min(len(a), len(b)):
                lr = engines["before"].gen(p + b[:d], 1, return_logits=True)
                row["before_rel_margin"] = cq.rel_margin(lr["last_logits"])
            rows.append(row)
    finally:
        for e in engines.values():
            e.close()
    R["tokens_08b"] = {"rows": rows, "runs": runs}
    log("0.8B Q4_K_M greedy tokens, after vs before: " + "; ".join(
        f"prompt {r['prompt_len']}: {'identical' if r['identical'] else 'DIFFER'}"
        + ("" if r["identical"] else f" (first divergence {r['first_divergence']}, before's top-2 margin "
                                     f"{r.get('before_rel_margin', float('nan')):.1e})") for r in rows))
    save()


def decode_27b(path: Path, bw: float) -> None:
    from engine_client import Engine

    V = 248320 - 300
    prompt = [(i * 7919) % V + 100 for i in range(32)]
    R["prompt_27b"] = prompt
    for name, exe in (("before", BEFORE_BUILD / "lucebench-ar"), ("after", AFTER_BUILD / "lucebench-ar")):
        t = time.time()
        e = Engine(exe, path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "4096")
        try:
            load_s = time.time() - t
            e.gen(prompt, 16, ignore_eos=True)  # warm-up (graph capture)
            dec, ids, bpt = [], None, None
            for _ in range(5):
                r = e.gen(prompt, 128, ignore_eos=True)
                dec.append(r["decode_steps"] / (r["timing"]["decode_ms"] / 1e3))
                ids, bpt = r["output_ids"], r.get("bytes_per_token")
        finally:
            e.close()
        med = statistics.median(dec)
        R[f"decode_27b_{name}"] = {"tok_s": dec, "median": med, "bytes_per_token": bpt, "load_s": round(load_s, 1),
                                   "output_ids": ids, "step_ms": 1e3 / med,
                                   "roofline_pct": 100.0 * bpt * med / bw if bpt and bw else None}
        log(f"27B Q4_K_M decode, {name}: median {med:.1f} tok/s (min {min(dec):.1f}, max {max(dec):.1f}, 5 reps), "
            f"{1e3 / med:.2f} ms a step, {(bpt or 0) / 1e9:.2f} GB a token, roofline "
            f"{R[f'decode_27b_{name}']['roofline_pct'] or 0:.1f}% of the copy bandwidth")
        save()
    a, b = R["decode_27b_after"]["output_ids"], R["decode_27b_before"]["output_ids"]
    R["tokens_27b_identical"] = a == b
    log(f"27B Q4_K_M 128 greedy tokens after vs before: "
        f"{'identical' if a == b else 'DIFFER at ' + str(first_divergence(a, b))}; speed-up "
        f"{R['decode_27b_after']['median'] / R['decode_27b_before']['median']:.2f}x")


def dflash_speed(paths: dict) -> None:
    env = dict(os.environ, OUT=str(OUT), PARTS="speed", DFLASH_TARGET=str(paths["27b"]),
               DFLASH_DRAFT=str(paths["draft"]), DFLASH_BUDGETS="8,22", DFLASH_N_GEN="256", ARCH=ARCH)
    with (OUT / "dflash_speed.log").open("w") as f:
        rc = subprocess.run(["bash", "scripts/device/check_dflash_gpu.sh"], cwd=ROOT, env=env, stdout=f,
                            stderr=subprocess.STDOUT, timeout=max(60.0, left() + 60)).returncode
    txt = (OUT / "dflash_speed.log").read_text()
    rows = [ln for ln in txt.splitlines() if ln.strip().startswith("|") or " ar: " in ln or "FAIL" in ln]
    print("\n".join(rows), flush=True)
    R["dflash_speed"] = {"rc": rc, "rows": rows}
    log(f"DFlash forced-AL speed (after): rc {rc}")
    save()


def verify_time(path: Path, build_dir: Path, key: str) -> None:
    name = f"verify_time_27b{'' if key == 'after' else '_' + key}.txt"
    with (OUT / name).open("w") as f:
        subprocess.run([str(build_dir / "lucebench-verify-gpu-check"), "--time-model", str(path)], stdout=f,
                       stderr=subprocess.STDOUT, check=False, timeout=240)
    txt = (OUT / name).read_text()
    R[f"verify_27b_{key}"] = txt
    rows = [ln for ln in txt.splitlines() if ln.startswith("|") or "decode step" in ln]
    log(f"27B Q4_K_M verify cost ({key}):\n" + "\n".join(rows))
    save()


def timeline(path: Path, build_dir: Path, key: str) -> None:
    cq.GPU_BUILD = build_dir
    prompt = R["prompt_27b"]
    cq.timeline_27b(path, prompt)
    tl = cq.R.pop("timeline_27b", None)
    R[f"timeline_27b_{key}"] = tl
    for ext in ("md", "csv"):
        p = OUT / f"timeline_27b.{ext}"
        if p.exists():
            p.rename(OUT / f"timeline_27b_{key}.{ext}")
    save()


def time_quant_before(after: str) -> None:
    """--time-quant of the before build (time_quant_before.md), and the rows both builds time as one table of
    GB/s before / after (time_quant_cmp.md, printed)."""
    exe = BEFORE_BUILD / "lucebench-gpu-op-check"
    if not exe.is_file():
        log("no before op check: time_quant before skipped")
        return
    try:
        tq = subprocess.run([str(exe), "--time-quant"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        log("time_quant before: timed out")
        return
    (OUT / "time_quant_before.md").write_text(tq.stdout + tq.stderr)

    def rows(txt: str) -> dict:
        out = {}
        for ln in txt.splitlines():
            c = [x.strip() for x in ln.strip().strip("|").split("|")]
            if len(c) == 5 and c[0] not in ("matrix", "---") and not c[0].startswith("-"):
                out[(c[0], c[1], c[2])] = (c[3], c[4])
        return out

    b, a = rows(tq.stdout), rows(after)
    keys = [k for k in a if k in b and ("(qmv" in k[2] or "(qmma)" in k[2])]
    txt = ("| matrix | out x in | n (kernel) | before ms | after ms | before GB/s | after GB/s |\n|---|---|---|---|---|---|---|\n"
           + "\n".join(f"| {k[0]} | {k[1]} | {k[2]} | {b[k][0]} | {a[k][0]} | {b[k][1]} | {a[k][1]} |" for k in keys)
           + "\n" + "\n".join(f"| {k[0]} | {k[1]} | {k[2]} | - | {a[k][0]} | - | {a[k][1]} |" for k in a
                                 if k not in b and "rmsnorm" in k[2]) + "\n")
    (OUT / "time_quant_cmp.md").write_text(txt)
    R["time_quant_cmp"] = txt
    print(txt, flush=True)
    save()


def table(a: dict, b: dict, ta: dict, tb: dict) -> None:
    """The before / after figures as one compact markdown table on stdout (and table.md)."""
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    def cls(t, k):
        return (t or {}).get("classes_us", {}).get(k, None) if isinstance(t, dict) else None

    rows = [("27B ar decode, median of 5 (tok/s)", f(b.get("median"), ".1f"), f(a.get("median"), ".1f")),
            ("roofline (% of copy bandwidth)", f(b.get("roofline_pct"), ".1f"), f(a.get("roofline_pct"), ".1f")),
            ("step on the GPU clock (ms, CUPTI)", f((tb or {}).get("step_us_median", 0) / 1e3 if tb else None, ".2f"),
             f((ta or {}).get("step_us_median", 0) / 1e3 if ta else None, ".2f")),
            ("kernels a step", f((tb or {}).get("kernels_per_step"), "d"), f((ta or {}).get("kernels_per_step"), "d")),
            ("qmv_kernel (ms a step)", f((cls(tb, "quantised GEMV (qmv)") or 0) / 1e3 if tb else None, ".2f"),
             f((cls(ta, "quantised GEMV (qmv)") or 0) / 1e3 if ta else None, ".2f")),
            ("norms, silu, embed (ms a step)", f((cls(tb, "norms, silu, embed") or 0) / 1e3 if tb else None, ".2f"),
             f((cls(ta, "norms, silu, embed") or 0) / 1e3 if ta else None, ".2f"))]
    txt = (f"| {R.get('card', '?').split(',')[0]}, SYNTHETIC 27B Q4_K_M | before ({BEFORE_COMMIT}) | after |\n"
           "|---|---|---|\n" + "\n".join(f"| {k} | {x} | {y} |" for k, x, y in rows) +
           f"\n\n27B greedy tokens identical: {R.get('tokens_27b_identical')}; 0.8B: "
           f"{[r['identical'] for r in R.get('tokens_08b', {}).get('rows', [])]}; op check rc "
           f"{R.get('op_check', {}).get('rc')}; verify B = 22 / step and DFlash: the verify_time_27b and dflash rows above\n")
    (OUT / "table.md").write_text(txt)
    print(txt, flush=True)


def main() -> int:
    log(f"card: {cq.record_card()}")
    errors: list[str] = []

    def guarded(fn, *a):
        return cq.start_guarded(errors, fn, *a)

    try:
        src = before_source()
    except (OSError, subprocess.CalledProcessError) as exc:
        log(f"FAILED: no before tree (carry .carry/dec/before/engines, or run in a git checkout): {exc!r}")
        return 1
    R["before_source"] = str(src)
    paths: dict = {}
    nproc = os.cpu_count() or 16
    threads = [guarded(build, ROOT / "engines", AFTER_BUILD, "dflash",
                       ["lucebench-ar", "lucebench-dflash", "lucebench-gpu-op-check", "lucebench-verify-gpu-check"],
                       max(2, nproc * 5 // 8), "after"),
               guarded(build, src, BEFORE_BUILD, "before",
                       ["lucebench-ar", "lucebench-verify-gpu-check", "lucebench-gpu-op-check"],
                       max(2, nproc * 3 // 8), "before"),
               guarded(synth_all, paths), guarded(cq.build_timeline_lib), guarded(synth_08b)]
    for th in threads:
        th.join()
    log(f"builds done (after {R.get('build_after_s')} s, before {R.get('build_before_s')} s), synth done")
    save()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1

    rc = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check")], capture_output=True, text=True)
    (OUT / "op_check.md").write_text(rc.stdout + rc.stderr)
    rows = [ln for ln in rc.stdout.splitlines()
            if any(k in ln for k in ("qmv", "qmma", "rmsnorm", "heads_to_tiled", "add_pos", "FAIL", "fail"))]
    print("\n".join(rows), flush=True)
    R["op_check"] = {"rc": rc.returncode, "summary": rc.stdout.strip().splitlines()[-1:], "rows": rows}
    log(f"op check (after): rc {rc.returncode}, {R['op_check']['summary']}")
    tq = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check"), "--time-quant"], capture_output=True, text=True,
                        timeout=120)
    (OUT / "time_quant.md").write_text(tq.stdout + tq.stderr)
    print("\n".join(ln for ln in tq.stdout.splitlines() if "(qmv" in ln or "(qmma)" in ln or ln.startswith("| matrix")), flush=True)
    save()
    time_quant_before(tq.stdout)

    from lucebench.measure.bandwidth import measure_copy_bandwidth

    bw = measure_copy_bandwidth(0, size_bytes=2 << 30, repeats=10)
    R["copy_bandwidth_Bps"] = bw
    log(f"device copy bandwidth (read + write, 2 GiB): {bw / 1e9:.0f} GB/s" if bw else "no copy bandwidth")

    vc = subprocess.run([str(AFTER_BUILD / "lucebench-verify-gpu-check")], capture_output=True, text=True, timeout=240)
    (OUT / "verify_gpu_check.txt").write_text(vc.stdout + vc.stderr)
    R["verify_gpu_check"] = {"rc": vc.returncode, "tail": vc.stdout.strip().splitlines()[-6:]}
    log(f"lucebench-verify-gpu-check (verify == AR, after): rc {vc.returncode}\n" + "\n".join(R["verify_gpu_check"]["tail"]))
    save()
    steps = [(tokens_08b, paths["0.8b"]), (decode_27b, paths["27b"], bw), (dflash_speed, paths),
             (verify_time, paths["27b"], AFTER_BUILD, "after")]
    for fn, *a in steps:
        try:
            fn(*a)
        except Exception as exc:
            errors.append(f"{fn.__name__}: {exc!r}")
            log(f"FAILED {fn.__name__}: {exc!r}")
        save()
    # diagnosis, as time allows (each ~30-45 s)
    for fn, *a in ((timeline, paths["27b"], AFTER_BUILD, "after"), (verify_time, paths["27b"], BEFORE_BUILD, "before"),
                   (timeline, paths["27b"], BEFORE_BUILD, "before")):
        if left() < 45:
            log(f"skipped {fn.__name__} ({a[-1]}): {time.time() - T0:.0f} s gone")
            continue
        try:
            fn(*a)
        except Exception as exc:
            log(f"{fn.__name__} ({a[-1]}) failed: {exc!r}")
    R["errors"] = errors
    R["wall_s"] = round(time.time() - T0, 1)
    save()
    a, b = R.get("decode_27b_after", {}), R.get("decode_27b_before", {})
    ta, tb = R.get("timeline_27b_after") or {}, R.get("timeline_27b_before") or {}

    def tl(t: dict) -> str:
        if not isinstance(t, dict) or not t:
            return "n/a"
        c = t.get("classes_us", {})
        return (f"step {t['step_us_median'] / 1e3:.2f} ms, {t['kernels_per_step']} kernels, qmv "
                f"{c.get('quantised GEMV (qmv)', 0) / 1e3:.2f} ms, norms/silu/embed {c.get('norms, silu, embed', 0) / 1e3:.2f} ms, "
                f"heads_to_tiled {c.get('heads_to_tiled', 0) / 1e3:.2f} ms, before the first kernel "
                f"{t['between_steps_gap_us'] / 1e3:.2f} ms")
    log("SUMMARY (SYNTHETIC weights, {}): op check rc {}; 27B Q4_K_M decode {:.1f} tok/s = {:.1f}% roofline (before "
        "{:.1f} tok/s = {:.1f}%), tokens identical: 27B {}, 0.8B {}; CUPTI after: {}; before: {}; verify-gpu-check rc {}; "
        "errors {}; {:.0f} s".format(
            R.get("card", "?").split(",")[0], R["op_check"]["rc"], a.get("median", 0), a.get("roofline_pct") or 0,
            b.get("median", 0), b.get("roofline_pct") or 0, R.get("tokens_27b_identical"),
            [r["identical"] for r in R.get("tokens_08b", {}).get("rows", [])], tl(ta), tl(tb),
            R["verify_gpu_check"]["rc"], errors, time.time() - T0))
    table(a, b, ta, tb)
    return 1 if errors or R["op_check"]["rc"] or R["verify_gpu_check"]["rc"] else 0


if __name__ == "__main__":
    sys.exit(main())
