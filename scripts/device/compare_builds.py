"""Same-card timing of engine binaries built from different trees (run on the device machine from the
repository root, PYTHONPATH=.): tg128, tg128 at context 520 and pp520 of each binary (check_megakernel.py's
`timing`, on its synthetic full-shape Qwen3.5-0.8B, SYNTHETIC weights), the binaries interleaved for ROUNDS
rounds so that drift of the card hits every one alike; and whether each pair's tokens on the 520-token prompt
are identical.

    PYTHONPATH=. python3 scripts/device/compare_builds.py NAME=EXE [NAME=EXE ...]
    (env: ROUNDS=2, MK_REPS=5; the checkpoint is written by build_engines.sh's synth_08b)

Prints a table; writes $OUT/compare_builds.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_megakernel import OUT, timing  # noqa: E402


def main() -> None:
    exes = dict(a.split("=", 1) for a in sys.argv[1:])
    rounds, reps = int(os.environ.get("ROUNDS", "2")), int(os.environ.get("MK_REPS", "5"))
    p520 = torch.randint(0, 248320, (520,), generator=torch.Generator().manual_seed(2)).tolist()
    runs: dict[str, list[dict]] = {name: [] for name in exes}
    for r in range(rounds):
        for name, exe in exes.items():
            res = timing(Path(exe), None, reps, p520, p520)
            runs[name].append(res)
            print(f"round {r + 1} {name}: tg128 {res['tg128_tok_s']['median']} tok/s, tg@520 "
                  f"{res['tg128_at_ctx520_tok_s']['median']}, pp520 {res['pp520_tok_s']['median']}", flush=True)
    print(f"\n{torch.cuda.get_device_name(0)}, SYNTHETIC weights (Qwen3.5-0.8B shape, bf16); medians of {reps} "
          f"runs a round, {rounds} rounds interleaved")
    print("| binary | tg128 tok/s (each round) | tg128 at ctx 520 | pp520 tok/s (each round) |")
    print("|---|---|---|---|")
    summary = {}
    for name, rs in runs.items():
        tg = [x["tg128_tok_s"]["median"] for x in rs]
        tl = [x["tg128_at_ctx520_tok_s"]["median"] for x in rs]
        pp = [x["pp520_tok_s"]["median"] for x in rs]
        summary[name] = {"tg128": tg, "tg128_ctx520": tl, "pp520": pp, "ctx520_output_ids": rs[0]["ctx520_output_ids"],
                         "ready_options": rs[0]["ready_options"]}
        print(f"| {name} | {' / '.join(f'{v:,.1f}' for v in tg)} (median {statistics.median(tg):,.1f}) | "
              f"{' / '.join(f'{v:,.1f}' for v in tl)} | {' / '.join(f'{v:,.1f}' for v in pp)} |")
    names = list(exes)
    same = {f"{a} = {b}": summary[a]["ctx520_output_ids"] == summary[b]["ctx520_output_ids"]
            for i, a in enumerate(names) for b in names[i + 1:]}
    print(f"tokens on the 520-token prompt + 128 identical: {same}")
    (OUT / "compare_builds.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "runs": summary,
                                                          "same_tokens": same}, indent=1))


if __name__ == "__main__":
    main()
