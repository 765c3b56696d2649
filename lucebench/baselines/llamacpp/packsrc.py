"""``python -m lucebench.baselines.llamacpp.packsrc``: show the llama.cpp source in use, or pack it (stripped,
~8 MB) for carrying to a machine without network access (see scripts/device/check_llamacpp.sh)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lucebench.baselines.llamacpp.source import locate_source, pack_source
from lucebench.errors import UserError


def main(argv: list[str] | None = None) -> int:
    """``python -m lucebench.baselines.llamacpp.packsrc (show | pack OUT.tar.xz) [--src PATH]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lucebench.baselines.llamacpp.packsrc")
    ap.add_argument("action", choices=("show", "pack"))
    ap.add_argument("out", nargs="?", type=Path, help="archive to write (pack)")
    ap.add_argument("--src", type=Path, default=None, help="llama.cpp tree or archive (default: the pinned sdist)")
    args = ap.parse_args(argv)
    try:
        src = locate_source(args.src)
        if args.action == "show":
            print(json.dumps(src.to_dict(), indent=1))
            return 0
        if args.out is None:
            raise UserError("pack needs an output path", where="OUT", hint="e.g. .cache/llamacpp/llama.cpp-0c1e570.tar.xz")
        out = pack_source(src, args.out)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{out} ({out.stat().st_size / 1e6:.1f} MB, llama.cpp {src.commit_short}, source {src.source_hash[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
