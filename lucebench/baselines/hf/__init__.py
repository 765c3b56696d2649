"""The PyTorch Hugging Face baseline engine: transformers' own model behind the engine protocol.

Run as ``python -m lucebench.baselines.hf --model DIR --device cpu|cuda[:N] [--dtype fp32|bf16|fp16]
[--compile] [--attn eager|sdpa]``; it prints one ``ready`` line and serves ``generate`` requests
(docs/protocol.md, docs/models.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

ENGINE_NAME = "hf"
DTYPES = ("fp32", "bf16", "fp16")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


KERNELS = ("auto", "torch")


def command(model_dir: Path, *, device: str, dtype: str, compile: bool = False, attn: str | None = None,
            kernels: str = "auto") -> list[str]:
    """The argv that starts the HF baseline on ``model_dir`` with this interpreter.

    ``device``: ``cpu``, ``cuda`` or ``cuda:N``; ``dtype``: fp32, bf16 or fp16; ``attn``: eager or sdpa
    (None: transformers' default); ``kernels``: ``auto`` lets transformers use flash-linear-attention and
    causal-conv1d where installed, ``torch`` hides them so its pure-PyTorch DeltaNet path runs.
    """
    argv = [sys.executable, "-m", "lucebench.baselines.hf", "--model", str(model_dir), "--device", device,
            "--dtype", dtype, "--kernels", kernels]
    if compile:
        argv.append("--compile")
    if attn is not None:
        argv += ["--attn", attn]
    return argv
