"""`python -m lucebench.models.train --out DIR [--recipe reference|tiny] [--datasets DIR] [--device cuda]`.

The device script (scripts/device/train_reference.sh) uses this entry point: it needs only torch,
transformers, tokenizers, safetensors and numpy, not the CLI's dependencies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lucebench.models.train.pipeline import RECIPES, train_reference


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lucebench.models.train", description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="reference")
    ap.add_argument("--datasets", type=Path, default=Path("../shared/datasets"))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    train_reference(args.out, recipe=RECIPES[args.recipe], datasets_dir=args.datasets, device=args.device,
                    log=lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
