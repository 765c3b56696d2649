"""Shared synthetic checkpoints for the model tests (written once per session, fp32 for exact comparisons)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebench.models.shapes import get_shape
from lucebench.models.synth import synthesize


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory):
    """Factory: synth_dir(shape, seed=0, dtype="fp32", layout="text") -> folder, cached per arguments."""
    made: dict[tuple, Path] = {}

    def make(shape: str, seed: int = 0, dtype: str = "fp32", layout: str = "text") -> Path:
        key = (shape, seed, dtype, layout)
        if key not in made:
            out = tmp_path_factory.mktemp(f"synth-{shape}-{seed}-{dtype}-{layout}")
            synthesize(get_shape(shape), out, seed=seed, dtype=dtype, layout=layout)
            made[key] = out
        return made[key]

    return make
