"""Which cells measure the same workload. A speculative or compressed cell and the autoregressive cell its
speedup is taken against share every param but the engine-specific axes; the runner's speedups
(`lucebench.runner.run.baseline_pairs`) and the report's AR columns (`lucebench.reports.tables.ar_partners`)
both pair by this key, and both prefer a partner of the same KV-cache types."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The axes that belong to one engine's way of running a workload, not to the workload.
ENGINE_AXES = frozenset({"engine", "engine_type", "budget", "keep_ratio", "kv_k", "kv_v"})


def hashable(value: Any) -> Any:
    """A param value as a hashable, order-stable equivalent (lists as tuples, dicts as sorted item tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(hashable(x) for x in value)
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(x)) for k, x in value.items()))
    return value


def pairing_key(params: Mapping[str, Any]) -> tuple[Any, ...]:
    """The workload a cell measures: its params without the engine axes, hashable."""
    return tuple(sorted((k, hashable(v)) for k, v in params.items() if k not in ENGINE_AXES))


def kv_types(params: Mapping[str, Any]) -> tuple[Any, Any]:
    """The KV-cache types (K, V) a cell ran with; (None, None) for the engine's default."""
    return params.get("kv_k"), params.get("kv_v")
