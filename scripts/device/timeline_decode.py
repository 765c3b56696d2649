"""Where a decode step's time goes on the GPU's own clock, kernel by kernel (run on the device machine).

  timeline_decode.py <build dir> <libkernel_timeline.so>     (timeline_decode.sh builds both)

Each engine runs twice on the synthetic 0.8B (/tmp/qwen35-0.8b-synth): without and with the CUPTI injection
library (kernel_timeline.cpp), 2 warm-up generations then a 1-token prompt + 129 decode steps, so that the
engine's own decode tok/s shows what recording costs. For `ar`, whose decode step is a CUDA graph of ~105
kernels chained by programmatic dependent launch, the recorded generation is cut into steps at its
embed_decode kernels; in every steady-state step (all but the first and last 10) each kernel gets:
  start_gap  its first block's start minus the previous kernel's end (negative: it started early, under PDL)
  dur        its last block's end minus its first block's start
  adds       its end minus the previous kernel's end: the time it adds to the step (the adds sum to the step)
Medians over the steps, per position in the step, then summed by kernel role. The
megakernel (one launch a token) gets its launch duration and the gap between launches.
TL_VARIANTS (JSON {name: {env}}) picks the runs (see main). Writes $OUT/timeline.json and
$OUT/timeline_<name>.csv (the raw records).
"""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from engine_client import Engine

OUT = Path(os.environ.get("OUT", "/tmp/out"))
CKPT = Path("/tmp/qwen35-0.8b-synth")
N_GEN = 129
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def short(name: str) -> str:
    """Kernel name without namespaces and parameters, template arguments kept (they name the role):
    CUPTI gives mangled names, e.g. ..._17gemv_fused_kernelILi2ELi1EEEvNS0_9FusedGemvEiii -> gemv_fused_kernel<2,1>."""
    if name.startswith("_ZN"):  # Itanium mangling: a run of length-prefixed identifiers, then template args
        pos, ident = 3, ""
        while pos < len(name) and name[pos].isdigit():
            m = re.match(r"\d+", name[pos:])
            pos += m.end()
            ident = name[pos:pos + int(m.group())]
            pos += int(m.group())
        args = re.match(r"I((?:Lin?\d+E)+)E", name[pos:])
        vals = re.findall(r"Li(n?\d+)E", args.group(1)) if args else []
        return ident + ("<" + ",".join(vals) + ">" if vals else "")
    m2 = re.search(r"(\w+_kernel\w*(?:<[^()]*>)?)", name)  # already readable
    return (m2.group(1) if m2 else name)[:60]


def run(exe: Path, env: dict | None) -> float:
    """Warm-up, then one recorded generation; returns the engine's decode tok/s of that generation."""
    eng = Engine(exe, CKPT, "--max-ctx", "1024", env=env)
    try:
        for _ in range(2):
            eng.gen([1000], N_GEN)
        r = eng.gen([1000], N_GEN)
    finally:
        eng.close()
    return (N_GEN - 1) / (r["timing"]["decode_ms"] / 1e3)


def records(path: Path) -> list[dict]:
    with open(path) as f:
        rows = [{"start": int(r["start_ns"]), "end": int(r["end_ns"]), "grid": int(r["grid"]), "block": int(r["block"]),
                 "name": short(r["name"])} for r in csv.DictReader(f)]
    return sorted(rows, key=lambda r: r["start"])


def ar_steps(rows: list[dict]) -> list[list[dict]]:
    """Decode steps of the last generation: runs of kernels that each begin with embed_decode."""
    starts = [i for i, r in enumerate(rows) if r["name"].startswith("embed_decode")]
    steps = [rows[a:b] for a, b in zip(starts, starts[1:])]
    if len(steps) < N_GEN - 1:
        sys.exit(f"timeline: {len(steps)} decode steps recorded, {N_GEN - 1} expected (kernel names: "
                 f"{sorted({r['name'] for r in rows})[:8]})")
    return steps[-(N_GEN - 1):]


def ar_table(steps: list[list[dict]]) -> dict:
    common = statistics.mode(len(s) for s in steps)
    # steady state (no start-up, no tail), each step with the end of the step before it
    pairs = [(a[-1]["end"], b) for a, b in zip(steps, steps[1:]) if len(b) == common][10:-10]
    per_pos = []
    for i in range(common):
        gaps, durs, adds = [], [], []
        for before, s in pairs:
            prev_end = s[i - 1]["end"] if i else before
            gaps.append((s[i]["start"] - prev_end) / 1e3)
            adds.append((s[i]["end"] - prev_end) / 1e3)
            durs.append((s[i]["end"] - s[i]["start"]) / 1e3)
        first = pairs[0][1][i]
        per_pos.append({"pos": i, "kernel": first["name"], "grid": first["grid"], "block": first["block"],
                        "start_gap_us": round(statistics.median(gaps), 2), "dur_us": round(statistics.median(durs), 2),
                        "adds_us": round(statistics.median(adds), 2)})
    step_us = [(s[-1]["end"] - before) / 1e3 for before, s in pairs]
    by_role: dict[str, dict] = {}
    for p in per_pos:
        a = by_role.setdefault(f"{p['kernel']} grid={p['grid']}", {"n": 0, "adds_us": 0.0, "dur_us": 0.0, "gap_us": 0.0})
        a["n"] += 1
        a["adds_us"] += p["adds_us"]
        a["dur_us"] += p["dur_us"]
        a["gap_us"] += p["start_gap_us"]
    roles = sorted(([k, v["n"], round(v["adds_us"], 1), round(v["adds_us"] / v["n"], 2), round(v["dur_us"] / v["n"], 2),
                     round(v["gap_us"] / v["n"], 2)] for k, v in by_role.items()), key=lambda x: -x[2])
    return {"steps_used": len(pairs), "kernels_per_step": common,
            "step_us": {"median": round(statistics.median(step_us), 2), "min": round(min(step_us), 2),
                        "max": round(max(step_us), 2)},
            "sum_of_adds_us": round(sum(p["adds_us"] for p in per_pos), 2),
            "by_role_columns": ["kernel", "count", "adds us total", "adds us each", "dur us each", "start gap us each"],
            "by_role": roles, "per_position": per_pos}


def mk_table(rows: list[dict]) -> dict:
    ks = [r for r in rows if r["name"].startswith("decode_kernel")][-(N_GEN - 1):][10:-10]
    durs = [(k["end"] - k["start"]) / 1e3 for k in ks]
    gaps = [(b["start"] - a["end"]) / 1e3 for a, b in zip(ks, ks[1:])]
    return {"launches": len(ks), "dur_us_median": round(statistics.median(durs), 2),
            "gap_us_median": round(statistics.median(gaps), 2), "gap_us_max": round(max(gaps), 2)}


def main() -> None:
    """TL_VARIANTS (JSON {name: {env}}, default {"ar": {}, "megakernel": {}}): the runs; a name starting with
    "megakernel" runs the megakernel binary, any other `ar`."""
    build, lib = Path(sys.argv[1]), Path(sys.argv[2])
    variants = json.loads(os.environ.get("TL_VARIANTS", '{"ar": {}, "megakernel": {}}'))
    res: dict = {}
    for name, env in variants.items():
        engine = "megakernel" if name.startswith("megakernel") else "ar"
        exe = build / f"lucebench-{engine}"
        csv_path = OUT / f"timeline_{name}.csv"
        plain = run(exe, env or None)
        traced = run(exe, {**env, "CUDA_INJECTION64_PATH": str(lib), "LB_TIMELINE_OUT": str(csv_path)})
        rows = records(csv_path)
        log(f"{name}: {plain:.1f} tok/s plain, {traced:.1f} recorded; {len(rows)} kernel records")
        r = {"env": env, "tok_s_plain": round(plain, 1), "tok_s_recorded": round(traced, 1)}
        r.update(ar_table(ar_steps(rows)) if engine == "ar" else mk_table(rows))
        res[name] = r
        if engine == "ar":
            log(f"{name}: step {r['step_us']} us (sum of adds {r['sum_of_adds_us']}), {r['kernels_per_step']} kernels")
            log("| kernel | count | adds us total | adds us each | dur us each | start gap us each |")
            for row in r["by_role"]:
                log("| " + " | ".join(str(x) for x in row) + " |")
        else:
            log(f"{name}: {r}")
    (OUT / "timeline.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
