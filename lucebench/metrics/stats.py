"""Summary statistics of repeated measurements: median first, spread always."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from lucebench.results.schema import MetricSummary

DEFAULT_NOISY_COV = 0.05  # optimum-benchmark and Phoronix use a few percent; 5% is a loud warning


def summarize(values: Sequence[float | None], unit: str, *, noisy_cov: float = DEFAULT_NOISY_COV,
              note: str | None = None) -> MetricSummary:
    """Median, mean, stddev (sample), min, max and CoV of the finite values; `noisy` when CoV > noisy_cov.

    Missing values (None, NaN, inf) are dropped, never turned into 0: a metric with no finite value has
    `n == 0` and None statistics, which reports render as "n/a".
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return MetricSummary(unit=unit, n=0, median=None, mean=None, stddev=None, min=None, max=None,
                             cov=None, noisy=False, samples=[], note=note)
    mean = statistics.fmean(finite)
    stddev = statistics.stdev(finite) if len(finite) > 1 else 0.0
    cov = stddev / abs(mean) if mean else None
    return MetricSummary(
        unit=unit, n=len(finite), median=statistics.median(finite), mean=mean, stddev=stddev,
        min=min(finite), max=max(finite), cov=cov, noisy=bool(cov is not None and cov > noisy_cov),
        samples=finite, note=note,
    )


def geometric_mean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values; None if any is missing or non-positive."""
    if not values or any(v is None or not v > 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
