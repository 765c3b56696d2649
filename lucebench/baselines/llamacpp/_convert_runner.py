"""Run llama.cpp's own convert_hf_to_gguf.py from a source tree, unchanged, with one policy of ours added.

Invoked as a script (not through the lucebench package, so it runs with any Python that has torch and
transformers, e.g. on a GPU box without lucebench installed):

    python _convert_runner.py --src LLAMACPP_TREE --report OUT.json [--pre-tokenizer NAME] -- CONVERTER_ARGS...

The converter identifies a BPE pre-tokenizer by hashing how the tokenizer splits a fixed text and refuses
any hash it does not list. A tokenizer trained locally (synthetic checkpoints) always has an unknown hash.
Only in that case, and only when --pre-tokenizer is given, we answer with that name instead of failing,
and record it in the report. Pre-tokenization only matters for turning text into ids inside llama.cpp;
lucebench always sends token ids, so the measured work does not depend on it. Known hashes are untouched.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, type=Path, help="llama.cpp source tree")
    ap.add_argument("--report", required=True, type=Path, help="where to write what happened (JSON)")
    ap.add_argument("--pre-tokenizer", default=None, help="name to use when the pre-tokenizer hash is unknown")
    ap.add_argument("converter_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    conv_args = [a for a in args.converter_args if a != "--"] if args.converter_args[:1] == ["--"] else args.converter_args

    src: Path = args.src.resolve()
    # The tree's own gguf-py comes first: it matches the converter of this commit, whatever `gguf` is installed.
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))
    import conversion.base as conv_base  # type: ignore[import-not-found]  # from the llama.cpp tree

    report: dict[str, object] = {"pre_tokenizer_fallback": False, "pre_tokenizer": None}
    original = conv_base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):  # type: ignore[no-untyped-def]
        try:
            res = original(self, tokenizer)
        except NotImplementedError:
            if not args.pre_tokenizer:
                raise
            print(f"lucebench: unknown BPE pre-tokenizer hash; using {args.pre_tokenizer!r} for this "
                  "(locally trained) tokenizer", file=sys.stderr, flush=True)
            report["pre_tokenizer_fallback"] = True
            res = args.pre_tokenizer
        report["pre_tokenizer"] = res
        return res

    conv_base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    import convert_hf_to_gguf  # type: ignore[import-not-found]  # from the llama.cpp tree

    sys.argv = [str(src / "convert_hf_to_gguf.py"), *conv_args]
    t0 = time.monotonic()
    status = 0
    try:
        convert_hf_to_gguf.main()
    except SystemExit as e:  # the converter calls sys.exit(1) on unsupported models
        status = int(e.code) if isinstance(e.code, int) else (0 if e.code is None else 1)
    report["seconds"] = round(time.monotonic() - t0, 3)
    report["status"] = status
    args.report.write_text(json.dumps(report) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
