"""Results: the `lucebench.result/v1` schema, storage, loading and validation."""

from lucebench.results.schema import SCHEMA_ID, Cell, Result

__all__ = ["SCHEMA_ID", "Cell", "Result"]
