"""Number formatting: spread always, "n/a" for missing values, never 0."""

from __future__ import annotations

import math

from lucebench.reports.fmt import fmt_pct, fmt_summary, fmt_value
from lucebench.results.schema import MetricSummary


def _m(**kw):
    base = {"unit": "tok/s", "n": 5, "median": 412.34, "mean": 412.0, "stddev": 2.41, "min": 409.0, "max": 415.0,
            "cov": 0.006}
    base.update(kw)
    return MetricSummary(**base)


def test_median_with_spread_and_n():
    assert fmt_summary(_m(), "decode_tok_s") == "412.3 ± 2.4 (n=5)"


def test_noisy_marked():
    assert fmt_summary(_m(noisy=True, cov=0.09), "decode_tok_s").endswith("⚠")


def test_missing_is_na_never_zero():
    assert fmt_summary(None) == "n/a"
    assert fmt_summary(_m(n=0, median=None, mean=None, stddev=None, min=None, max=None)) == "n/a"
    assert fmt_value(None) == "n/a" and fmt_value(math.nan) == "n/a"
    assert fmt_pct(None) == "n/a"


def test_single_sample_has_no_fake_spread():
    assert fmt_summary(_m(n=1, stddev=0.0), "decode_tok_s") == "412.3 (n=1)"


def test_units():
    assert fmt_value(21347.2, "prefill_tok_s") == "21,347"
    assert fmt_value(2 * 2**30, "peak_mem_bytes") == "2.00 GiB"
    assert fmt_pct(-0.2) == "-20.0%"
