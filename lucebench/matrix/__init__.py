"""The matrix: a config expanded into cells."""

from lucebench.matrix.expand import CellSpec, expand, select

__all__ = ["CellSpec", "expand", "select"]
