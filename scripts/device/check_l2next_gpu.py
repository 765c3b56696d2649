"""The decode GEMV asking L2 for the next matrix's first bytes (L2Next, LB_GPU_L2_NEXT) on one card, one
build (run on the device machine from the repository root, PYTHONPATH=.). SYNTHETIC weights: speed figures
only; token comparisons are of one engine under two settings of a knob that changes no sums.

  1. build lucebench-ar, -gpu-op-check, -verify-gpu-check (CUDA, ARCH) while the synthetic 0.8B and 27B Q4_K_M
     GGUFs are written;
  2. the op check (every op against its CPU reference; its L2-next and GrowBuffer capture rows printed);
  3. the 27B `ar` decode (prompt 32, 128 tokens, 1 warm-up, 5 reps, median) for each LB_GPU_L2_NEXT in
     L2NEXT_MB (default "0,-1,8,48,0,-1": interleaved, so drift shows), tokens compared with the first setting's,
     roofline % against the copy bandwidth measured in the call;
  4. GrowBuffer under capture: the 0.8B Q4_K_M with LB_GPU_FUSED_DELTA=0 (the unfused delta rule, whose
     scratch a captured graph must never hold): a short prompt, a 3,000-token one, the short one again; the two
     short runs must give the same tokens;
  5. the verify cost of B + 1 rows against a decode step (lucebench-verify-gpu-check --time-model).
Writes $OUT/l2next/: check_l2next_gpu.json, op_check.md, verify_time_27b.txt, build logs; a table last.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))
OUT = Path(os.environ.get("OUT", "/tmp/out")) / "l2next"
OUT.mkdir(parents=True, exist_ok=True)
import check_quant_gpu as cq  # noqa: E402  (cmake_build, synth, record_card, start_guarded)

os.environ["OUT"] = str(OUT)  # engine_client's logs
cq.OUT = OUT
ARCH = os.environ.get("ARCH", "90")
BUILD = Path("/tmp/l2next-build")
SETTINGS = [int(v) for v in os.environ.get("L2NEXT_MB", "0,-1,8,48,0,-1").split(",")]
DEADLINE_S = float(os.environ.get("DEADLINE_S", "540"))
T0 = time.time()
R = cq.R
R.update({"label": "SYNTHETIC weights (random): speed figures only", "settings_mb": SETTINGS})


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "check_l2next_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def left() -> float:
    return DEADLINE_S - (time.time() - T0)


def build() -> None:
    R["build_s"] = cq.cmake_build(ROOT / "engines", BUILD, ["lucebench-ar", "lucebench-gpu-op-check",
                                                            "lucebench-verify-gpu-check"],
                                  os.cpu_count() or 16, OUT / "build.log")


def synth_all(paths: dict) -> None:
    paths["0.8b"] = cq.synth("qwen3.5-0.8b")
    paths["27b"] = cq.synth("qwen3.5-27b")


def op_check() -> None:
    rc = subprocess.run([str(BUILD / "lucebench-gpu-op-check")], capture_output=True, text=True, timeout=300)
    (OUT / "op_check.md").write_text(rc.stdout + rc.stderr)
    rows = [ln for ln in rc.stdout.splitlines() if any(k in ln for k in ("L2 next", "capture", "FAIL"))]
    print("\n".join(rows), flush=True)
    R["op_check"] = {"rc": rc.returncode, "summary": rc.stdout.strip().splitlines()[-1:], "rows": rows}
    log(f"op check: rc {rc.returncode}, {R['op_check']['summary']}")


def decode_27b(path: Path, bw: float) -> None:
    from engine_client import Engine

    prompt = [(i * 7919) % (248320 - 300) + 100 for i in range(32)]
    runs = []
    for mb in SETTINGS:
        if left() < 60:
            log(f"deadline: LB_GPU_L2_NEXT={mb} and later settings skipped")
            break
        e = Engine(BUILD / "lucebench-ar", path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "4096",
                   env=dict(os.environ, LB_GPU_L2_NEXT=str(mb)))
        try:
            e.gen(prompt, 16, ignore_eos=True)  # warm-up (graph capture)
            tok_s, ids, bpt = [], None, None
            for _ in range(5):
                r = e.gen(prompt, 128, ignore_eos=True)
                tok_s.append(r["decode_steps"] / (r["timing"]["decode_ms"] / 1e3))
                ids, bpt = r["output_ids"], r.get("bytes_per_token")
            tuning = e.ready.get("engine", {}).get("tuning", {}) if isinstance(e.ready, dict) else {}
        finally:
            e.close()
        med = statistics.median(tok_s)
        row = {"l2_next_mb": mb, "tok_s": tok_s, "median": med, "step_ms": 1e3 / med, "bytes_per_token": bpt,
               "roofline_pct": 100.0 * bpt * med / bw if bpt and bw else None, "output_ids": ids,
               "tuning_l2_next": tuning.get("gpu_l2_next_mb")}
        row["tokens_as_first"] = ids == runs[0]["output_ids"] if runs else True
        runs.append(row)
        R["decode_27b"] = runs
        save()
        log(f"27B Q4_K_M decode, LB_GPU_L2_NEXT={mb}: median {med:.1f} tok/s (min {min(tok_s):.1f}, max "
            f"{max(tok_s):.1f}), {1e3 / med:.2f} ms a step, roofline {row['roofline_pct'] or 0:.1f}%, tokens as "
            f"the first setting's: {row['tokens_as_first']}")


def growbuffer_capture(path: Path) -> None:
    from engine_client import Engine

    short = [(i * 7919) % 240000 + 100 for i in range(8)]
    long = [(i * 104729) % 240000 + 100 for i in range(3000)]
    e = Engine(BUILD / "lucebench-ar", path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "4096",
               env=dict(os.environ, LB_GPU_FUSED_DELTA="0"))
    try:
        a = e.gen(short, 32, ignore_eos=True)["output_ids"]
        b = e.gen(long, 32, ignore_eos=True)["output_ids"]
        c = e.gen(short, 32, ignore_eos=True)["output_ids"]
    finally:
        e.close()
    R["growbuffer_capture"] = {"short_before": a, "long": b, "short_after": c, "identical": a == c}
    log(f"GrowBuffer under capture (0.8B Q4_K_M, LB_GPU_FUSED_DELTA=0): short prompt before and after a 3,000-token "
        f"one: {'identical' if a == c else 'DIFFER at ' + str(cq.first_divergence(a, c))}")


def verify_time(path: Path) -> None:
    with (OUT / "verify_time_27b.txt").open("w") as f:
        subprocess.run([str(BUILD / "lucebench-verify-gpu-check"), "--time-model", str(path)], stdout=f,
                       stderr=subprocess.STDOUT, check=False, timeout=max(30.0, left()))
    txt = (OUT / "verify_time_27b.txt").read_text()
    R["verify_27b"] = txt
    log("27B Q4_K_M verify cost:\n" + "\n".join(ln for ln in txt.splitlines() if ln.startswith("|") or "step" in ln))


def main() -> int:
    log(f"card: {cq.record_card()}")
    errors: list[str] = []
    paths: dict = {}
    threads = [cq.start_guarded(errors, build), cq.start_guarded(errors, synth_all, paths)]
    for th in threads:
        th.join()
    log(f"build {R.get('build_s')} s, synth done")
    if errors:
        log("FAILED: " + "; ".join(errors))
        save()
        return 1
    from lucebench.measure.bandwidth import measure_copy_bandwidth

    bw = measure_copy_bandwidth(0, size_bytes=2 << 30, repeats=10)
    R["copy_bandwidth_Bps"] = bw
    log(f"device copy bandwidth (read + write, 2 GiB): {bw / 1e9:.0f} GB/s" if bw else "no copy bandwidth")
    for fn, *a in ((decode_27b, paths["27b"], bw), (growbuffer_capture, paths["0.8b"]), (op_check,),
                   (verify_time, paths["27b"])):
        if left() < 30:
            log(f"deadline: {fn.__name__} skipped")
            continue
        try:
            fn(*a)
        except Exception as exc:
            errors.append(f"{fn.__name__}: {exc!r}")
            log(f"FAILED {fn.__name__}: {exc!r}")
        save()
    rows = R.get("decode_27b", [])
    print(f"\n| {R.get('card', '?').split(',')[0]}, SYNTHETIC 27B Q4_K_M | tok/s (median of 5) | step ms | roofline % | "
          "tokens as first |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| LB_GPU_L2_NEXT={r['l2_next_mb']} | {r['median']:.1f} | {r['step_ms']:.2f} | "
              f"{r['roofline_pct'] or 0:.1f} | {r['tokens_as_first']} |")
    save()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
