"""Number formatting for reports: every value with its spread, missing values as "n/a", never 0."""

from __future__ import annotations

import math

from lucebench.reports.metric_info import info
from lucebench.results.schema import MetricSummary

NA = "n/a"
NOISY_MARK = "⚠"


def _num(value: float, digits: int) -> str:
    if abs(value) >= 1e4 and digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def fmt_bytes(value: float) -> str:
    """Bytes in binary units (GiB/MiB/KiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def fmt_value(value: float | None, metric: str = "", digits: int | None = None) -> str:
    """One number in the metric's precision; None or non-finite is "n/a"."""
    if value is None or not math.isfinite(value):
        return NA
    if metric == "peak_mem_bytes":
        return fmt_bytes(value)
    d = info(metric).digits if digits is None else digits
    return _num(value, d)


def fmt_summary(summary: MetricSummary | None, metric: str = "", *, mark_noisy: bool = True) -> str:
    """`median ± stddev (n=N)`, with a noisy mark; "n/a" when the metric is missing or has no median.

    With one sample there is no spread to show, so the text says n=1 rather than ± 0.
    """
    if summary is None or summary.median is None or not math.isfinite(summary.median):
        return NA
    text = fmt_value(summary.median, metric)
    if summary.n > 1 and summary.stddev is not None and math.isfinite(summary.stddev):
        text += f" ± {fmt_value(summary.stddev, metric)}"
    text += f" (n={summary.n})"
    if mark_noisy and summary.noisy:
        text += f" {NOISY_MARK}"
    return text


def fmt_pct(value: float | None, digits: int = 1, signed: bool = True) -> str:
    """A fraction as a percentage (0.05 -> +5.0%)."""
    if value is None or not math.isfinite(value):
        return NA
    return f"{value * 100:+.{digits}f}%" if signed else f"{value * 100:.{digits}f}%"
