"""Full prefill speed of lucebench-ar on one model, for each build given (before / after a kernel change), in
one process per build: load, a 512-token warm-up, then one generation of one token per length (random token
ids, the reply's prefill_ms). A length that would end past --deadline-s is skipped; one that runs past its
time limit is recorded as "killed" with the time it had run. Writes --out (JSON) and prints one line a run.

  python3 scripts/device/gemm_prefill.py --model M.gguf --build before=/tmp/a --build after=/tmp/b \
      --lengths 512,8192,32768 --out prefill.json --deadline-s 200
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from engine_client import Engine

from lucebench.errors import EngineError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--build", action="append", required=True, help="label=build_dir (lucebench-ar in it)")
    ap.add_argument("--lengths", default="512,8192,32768")
    ap.add_argument("--kv", default="bf16")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline-s", type=float, default=300.0, help="seconds from start for all builds")
    ap.add_argument("--limit-s", type=float, default=90.0, help="the most one generation may take")
    args = ap.parse_args()
    t_start = time.monotonic()
    lengths = [int(v) for v in args.lengths.split(",")]
    res: dict = {"model": str(args.model), "kv": args.kv, "label": "SYNTHETIC (random weights, random token ids)",
                 "runs": {}}
    builds = [b.split("=", 1) for b in args.build]
    for i, (label, build) in enumerate(builds):
        # each build gets an equal share of the time that is left
        share = (args.deadline_s - (time.monotonic() - t_start)) / (len(builds) - i)
        t_end = time.monotonic() + share
        rows: dict = {}
        res["runs"][label] = rows
        if share < 30:
            rows["skipped"] = f"{share:.0f} s left for this build"
            print(f"[{label}] skipped: {share:.0f} s left", flush=True)
            continue
        t = time.monotonic()
        try:
            ar = Engine(Path(build) / "lucebench-ar", args.model, "--max-ctx", str(max(lengths) + 64),
                        "--kv-k", args.kv, "--kv-v", args.kv)
        except EngineError as e:
            rows["error"] = f"load: {e}"
            print(f"[{label}] load failed: {e}", flush=True)
            continue
        rows["load_s"] = round(time.monotonic() - t, 1)
        vocab = ar.ready["model"]["vocab_size"]
        rng = random.Random(0)
        ar.gen([rng.randrange(vocab) for _ in range(512)], 1, ignore_eos=True)
        for L in lengths:
            left = t_end - time.monotonic()
            if left < 10:
                rows[str(L)] = {"skipped": f"{left:.0f} s left of this build's share"}
                print(f"[{label}] L={L}: skipped ({left:.0f} s left)", flush=True)
                continue
            limit = min(args.limit_s, left)
            ids = [rng.randrange(vocab) for _ in range(L)]
            t0 = time.monotonic()
            try:
                rep = ar.gen(ids, 1, timeout_s=limit, ignore_eos=True)
            except EngineError as e:
                if e.kind != "timeout":
                    raise
                ms = (time.monotonic() - t0) * 1e3
                rows[str(L)] = {"killed_after_ms": ms}
                print(f"[{label}] L={L}: killed after {ms / 1e3:.0f} s", flush=True)
                break  # the engine is gone
            ms = rep["timing"]["prefill_ms"]
            rows[str(L)] = {"prefill_ms": ms, "tok_s": L / (ms / 1e3)}
            print(f"[{label}] full prefill L={L}: {ms:.0f} ms, {L / (ms / 1e3):.0f} tok/s", flush=True)
            args.out.write_text(json.dumps(res, indent=1))
        else:
            ar.close()
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
