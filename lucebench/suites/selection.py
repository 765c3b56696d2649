"""Deterministic row selection, identical on every machine and Python version.

`shuffle` is numpy's PCG64 permutation seeded with `seed`: exactly what `datasets.Dataset.shuffle(seed)`
does, so `shuffle(seed=42)` then the first 10 reproduces upstream's prompts. numpy pins this stream
(default_rng(seed).permutation); a unit test pins the chosen ids so a change cannot pass unnoticed.
`sha256` orders rows by sha256("<seed>:<row id>"), independent of the row count and of numpy.
"""

from __future__ import annotations

import hashlib

import numpy as np


def select_indices(row_ids: list[str], *, method: str, seed: int, sample_size: int | None) -> list[int]:
    """Indices into `row_ids` of the selected rows, in run order."""
    n = len(row_ids)
    if method == "shuffle":
        order = np.random.default_rng(seed).permutation(n).tolist()
    elif method == "sha256":
        order = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}:{row_ids[i]}".encode()).hexdigest())
    elif method == "first":
        order = list(range(n))
    else:
        raise ValueError(f"unknown selection method {method!r}")
    k = n if sample_size is None else min(sample_size, n)
    return [int(i) for i in order[:k]]
