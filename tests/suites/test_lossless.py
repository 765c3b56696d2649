"""Token-exact comparison of outputs."""

from __future__ import annotations

from lucebench.suites.lossless import compare_outputs


def test_exact_divergent_prefix_and_missing() -> None:
    ref = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9, 9], "d": [1]}
    cand = {"a": [1, 2, 3, 4], "b": [5, 6, 0, 8], "c": [9], "x": [2]}
    r = compare_outputs(ref, cand)
    a, b, c, d = (r["per_prompt"][k] for k in "abcd")
    assert a["exact"] and a["first_divergence"] is None and a["matched_prefix_fraction"] == 1.0
    assert not b["exact"] and b["first_divergence"] == 2 and b["matched_prefix_fraction"] == 0.5
    assert not c["exact"] and c["first_divergence"] == 1 and c["matched_prefix_fraction"] == 0.5
    assert d.get("missing") and not d["exact"]
    assert r["exact_match_rate"] == 0.25 and r["missing"] == ["d"] and r["extra"] == ["x"]
    assert r["mean_matched_prefix_fraction"] == (1 + 0.5 + 0.5 + 0) / 4 and r["control"] is None


def test_control_run_checks_determinism() -> None:
    ref = {"a": [1, 2], "b": [3, 4]}
    same = compare_outputs(ref, ref, control={"a": [1, 2], "b": [3, 4]})
    assert same["exact_match_rate"] == 1.0 and same["control"]["deterministic"]
    flaky = compare_outputs(ref, ref, control={"a": [1, 2], "b": [3, 5]})
    assert not flaky["control"]["deterministic"] and flaky["control"]["diverging"] == ["b"]
