"""The HF baseline process: argument parsing and the request loop (protocol: lucebench.engines.protocol)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path

from lucebench.baselines.hf import ATTN_IMPLEMENTATIONS, DTYPES, KERNELS
from lucebench.engines.protocol import ProtocolWriter, RequestError, Shutdown, parse_request


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lucebench.baselines.hf",
                                description="PyTorch HF baseline engine (lucebench engine protocol v1)")
    p.add_argument("--model", required=True, type=Path, help="Hugging Face checkpoint folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step over a StaticCache")
    p.add_argument("--attn", choices=ATTN_IMPLEMENTATIONS, default=None, help="attention implementation")
    p.add_argument("--kernels", choices=KERNELS, default="auto",
                   help="auto: flash-linear-attention / causal-conv1d where installed; torch: hide them")
    return p


def _hide_optional_kernels() -> None:
    """Make fla and causal_conv1d unimportable, so transformers falls back to its PyTorch DeltaNet path.

    Must run before transformers' Qwen3.5 module is imported: it picks its kernels at import time.
    """
    for name in ("fla", "causal_conv1d"):
        sys.modules[name] = None  # type: ignore[assignment]  # an import of a None entry raises ImportError


def main(argv: list[str] | None = None) -> int:
    """Run the engine: exit 0 after a shutdown request or end of input, 1 when loading fails."""
    out = ProtocolWriter.isolate_stdout()
    try:
        return _serve(out, argv)
    finally:
        out.close()


def _serve(out: ProtocolWriter, argv: list[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse already explained on stderr
        out.error("load", "bad command line (see stderr)")
        return int(exc.code or 2)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.kernels == "torch":
        _hide_optional_kernels()

    try:
        from lucebench.baselines.hf.engine import HFEngine, LoadError

        engine = HFEngine(args.model, device=args.device, dtype=args.dtype, compile=args.compile, attn=args.attn)
    except LoadError as exc:
        out.error("load", str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - a load failure of any kind is reported, then we exit
        traceback.print_exc(file=sys.stderr)
        out.error("load", f"{type(exc).__name__}: {exc}")
        return 1
    out.send(engine.ready_message())

    for line in sys.stdin:
        if not line.strip():
            continue
        rid = None
        try:
            req = parse_request(line, vocab_size=engine.vocab_size)
            if isinstance(req, Shutdown):
                return 0
            rid = req.id
            out.send(engine.generate(req))
        except RequestError as exc:
            out.error(exc.kind, exc.message, exc.request_id)
        except Exception as exc:  # noqa: BLE001 - report, keep serving; the harness decides
            traceback.print_exc(file=sys.stderr)
            out.error("internal", f"{type(exc).__name__}: {exc}", rid)
    return 0
