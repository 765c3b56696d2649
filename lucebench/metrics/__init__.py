"""Derived metrics: defined once in `definitions`, summarised by `stats`."""

from lucebench.metrics.definitions import (
    METRICS_VERSION,
    MetricDef,
    acceptance_per_depth,
    al_histogram,
    all_definitions,
    compute_cell_metrics,
    compute_speedups,
    definition,
    pool_prefill,
    pool_spec,
)
from lucebench.metrics.stats import summarize

__all__ = ["METRICS_VERSION", "MetricDef", "acceptance_per_depth", "al_histogram", "all_definitions",
           "compute_cell_metrics", "compute_speedups", "definition", "pool_prefill", "pool_spec", "summarize"]
