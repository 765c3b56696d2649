"""A streaming safetensors writer: the header first, then each tensor's bytes as they are produced.

The safetensors format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets; plus ``__metadata__``) and the raw little-endian tensor data. Writing it by hand lets the
synthesiser emit a 54 GB checkpoint one chunk at a time without holding any tensor in memory, and
without torch (bf16 has no numpy dtype, so it is produced as uint16 bit patterns).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

# lucebench dtype name -> (safetensors dtype, bytes per element, HF config "dtype")
DTYPES: dict[str, tuple[str, int, str]] = {
    "bf16": ("BF16", 2, "bfloat16"),
    "fp16": ("F16", 2, "float16"),
    "fp32": ("F32", 4, "float32"),
}


def to_dtype_bytes(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as the on-disk element type (bf16 by round-to-nearest-even on the bit pattern)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "fp32":
        return x
    if dtype == "fp16":
        return x.astype(np.float16)
    if dtype == "bf16":
        u = x.view(np.uint32)
        # Round to nearest even: add 0x7FFF plus the lowest kept bit, then drop the low 16 bits.
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return rounded.astype(np.uint16)
    raise ValueError(f"unknown dtype {dtype}")


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Inverse of the bf16 encoding above (for tests and readers without torch)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def write_safetensors(
    path: Path,
    tensors: Iterable[tuple[str, tuple[int, ...]]],
    dtype: str,
    produce: Callable[[str], Iterator[np.ndarray]],
    *,
    metadata: dict[str, str] | None = None,
) -> int:
    """Write one safetensors file. ``produce(name)`` yields the tensor's values in row-major chunks
    (already converted by :func:`to_dtype_bytes`). Returns the number of data bytes written.
    """
    st_dtype, esize, _ = DTYPES[dtype]
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    entries = list(tensors)
    offset = 0
    for name, shape in entries:
        nbytes = math.prod(shape) * esize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # pad so that the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in entries:
            expected = math.prod(shape) * esize
            written = 0
            for chunk in produce(name):
                f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                written += chunk.nbytes
            if written != expected:
                raise RuntimeError(f"{name}: produced {written} bytes, expected {expected}")
    return offset
