"""Derived metrics: defined once in `definitions`, summarised by `stats`."""

from lucebench.metrics.definitions import (
    METRICS_VERSION,
    MetricDef,
    all_definitions,
    compute_cell_metrics,
    compute_speedups,
    definition,
)
from lucebench.metrics.stats import summarize

__all__ = ["METRICS_VERSION", "MetricDef", "all_definitions", "compute_cell_metrics", "compute_speedups",
           "definition", "summarize"]
