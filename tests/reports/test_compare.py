"""`lucebench compare`: regressions need size AND statistical support; noise passes; hardware mismatch is exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucebench.errors import UserError
from lucebench.metrics import summarize
from lucebench.reports.compare import (
    CompareOptions,
    bootstrap_change_ci,
    compare_metric,
    compare_results,
    mann_whitney_p,
)
from lucebench.reports.metric_info import higher_is_better
from lucebench.results.schema import MetricSummary


def _summary(values, noisy=False):
    """The package's summary of `values`, with the noisy flag as the test sets it."""
    return summarize(values, "tok/s").model_copy(update={"noisy": noisy})


def _gauss(rng, mean, cov, n):
    return list(mean * (1 + cov * rng.standard_normal(n)))


# ---------------------------------------------------------------------------------------------- statistics
def test_bootstrap_ci_covers_the_true_change():
    rng = np.random.default_rng(0)
    lo, hi = bootstrap_change_ci(_gauss(rng, 100, 0.02, 10), _gauss(rng, 80, 0.02, 10), seed=1)
    assert lo < -0.2 + 0.03 and hi > -0.2 - 0.03 and hi < -0.15


def test_bootstrap_needs_two_samples():
    assert bootstrap_change_ci([1.0], [1.0, 2.0]) is None


def test_mann_whitney_direction():
    assert mann_whitney_p([10, 11, 12, 13, 14], [5, 6, 7, 8, 9], "less") < 0.01
    assert mann_whitney_p([10, 11, 12, 13, 14], [5, 6, 7, 8, 9], "greater") > 0.9


def test_direction_of_metrics():
    assert higher_is_better("decode_tok_s") and higher_is_better("decode_tok_per_j")
    assert not higher_is_better("ttft_ms") and not higher_is_better("decode_j")


def test_big_change_with_support_is_a_regression():
    rng = np.random.default_rng(1)
    m = compare_metric("decode_tok_s", _summary(_gauss(rng, 400, 0.01, 5)), _summary(_gauss(rng, 320, 0.01, 5)),
                       CompareOptions())
    assert m is not None and m.status == "regression" and m.change == pytest.approx(-0.2, abs=0.02)


def test_latency_increase_is_a_regression_and_decrease_an_improvement():
    rng = np.random.default_rng(2)
    base = _summary(_gauss(rng, 100, 0.01, 5))
    worse = compare_metric("ttft_ms", base, _summary(_gauss(rng, 120, 0.01, 5)), CompareOptions())
    better = compare_metric("ttft_ms", base, _summary(_gauss(rng, 80, 0.01, 5)), CompareOptions())
    assert worse.status == "regression" and better.status == "improvement"


def test_change_below_threshold_is_unchanged():
    rng = np.random.default_rng(3)
    m = compare_metric("decode_tok_s", _summary(_gauss(rng, 400, 0.005, 8)), _summary(_gauss(rng, 392, 0.005, 8)),
                       CompareOptions())
    assert m.status == "unchanged"
    strict = compare_metric("decode_tok_s", _summary(_gauss(rng, 400, 0.002, 8)),
                            _summary(_gauss(rng, 388, 0.002, 8)),
                            CompareOptions(metric_thresholds={"decode_tok_s": 1.0}))
    assert strict.status == "regression"


def test_big_change_without_support_is_inconclusive():
    # Widely overlapping samples: the median moved 10% but the CI reaches far inside the threshold.
    base = _summary([100, 70, 130, 95, 105])
    cand = _summary([90, 60, 125, 85, 110])
    m = compare_metric("decode_tok_s", base, cand, CompareOptions())
    assert m.change == pytest.approx(-0.10, abs=1e-9)
    assert m.status == "inconclusive"


def test_noisy_or_too_few_samples_is_noisy_not_failed():
    rng = np.random.default_rng(4)
    base = _summary(_gauss(rng, 400, 0.01, 5), noisy=True)
    m = compare_metric("decode_tok_s", base, _summary(_gauss(rng, 300, 0.01, 5)), CompareOptions())
    assert m.status == "noisy"
    m = compare_metric("decode_tok_s", _summary([400.0, 401.0]), _summary([300.0, 301.0]), CompareOptions())
    assert m.status == "noisy"


def test_missing_candidate_value():
    m = compare_metric("decode_tok_per_j", _summary([1.8, 1.9, 1.85]), None, CompareOptions())
    assert m.status == "missing"


# ---------------------------------------------------------------------------------------------- whole results
def test_injected_20_percent_decode_slowdown_is_flagged(fab):
    comp = compare_results(fab.gpu_result(seed=1, cov=0.02), fab.gpu_result(seed=2, cov=0.02, decode_scale=0.8))
    assert comp.exit_code == 1
    flagged = {(c.params.get("engine"), c.params.get("suite"), m.metric) for c, m in comp.regressions() if m}
    assert ("megakernel", "tg128", "decode_tok_s") in flagged
    assert ("dflash", "humaneval", "decode_tok_s") in flagged
    # Prefill did not change, so it must not be flagged anywhere.
    assert not any(metric == "prefill_tok_s" for _, _, metric in flagged)


def test_rerun_with_ordinary_noise_passes(fab):
    for seeds in ((1, 2), (3, 4), (5, 6)):
        comp = compare_results(fab.gpu_result(seed=seeds[0], cov=0.02), fab.gpu_result(seed=seeds[1], cov=0.02))
        assert comp.exit_code == 0, [(c.label, m.metric if m else None) for c, m in comp.regressions()]


def test_different_gpu_is_incomparable_unless_forced(fab):
    base, cand = fab.gpu_result(seed=1), fab.gpu_result(seed=2, gpu="NVIDIA H200")
    with pytest.raises(UserError) as exc:
        compare_results(base, cand)
    assert exc.value.exit_code == 2 and "NVIDIA H200" in exc.value.message
    comp = compare_results(base, cand, CompareOptions(force=True))
    assert comp.forced_mismatches and comp.cells


def test_different_driver_major_is_incomparable(fab):
    with pytest.raises(UserError) as exc:
        compare_results(fab.gpu_result(seed=1), fab.gpu_result(seed=2, driver="580.10.01"))
    assert "driver" in exc.value.message


def test_different_workload_is_incomparable(fab):
    base, cand = fab.gpu_result(seed=1), fab.gpu_result(seed=2)
    cand.cells[0].workload.n_gen = 2
    with pytest.raises(UserError) as exc:
        compare_results(base, cand)
    assert "n_gen" in exc.value.message and exc.value.exit_code == 2


def test_newly_failed_cell_is_a_regression(fab):
    base, cand = fab.gpu_result(seed=1), fab.gpu_result(seed=2)
    cand.cells[0].status = "failed"
    cand.cells[0].error = base.cells[-2].error
    comp = compare_results(base, cand)
    assert comp.exit_code == 1
    assert any(m is None and c.status == "failed" for c, m in comp.regressions())


def test_cells_only_on_one_side_are_listed(fab):
    base, cand = fab.gpu_result(seed=1), fab.gpu_result(seed=2)
    cand.cells = cand.cells[:-3]
    comp = compare_results(base, cand)
    assert len(comp.only_in_baseline) == 3 and comp.exit_code == 0


def _scaled(summary: MetricSummary, factor: float) -> MetricSummary:
    return _summary([v * factor for v in summary.samples])


def _tg128(result):
    return next(c for c in result.cells if c.params.get("engine") == "megakernel" and c.params.get("suite") == "tg128"
                and c.params.get("power_limit_w") == 350)


def test_net_energy_does_not_gate_when_the_idle_power_differs(fab):
    """A 20% drop of net tok/J is a regression with the same idle power, and noisy (with a note) when the
    candidate's idle reading differs: the change is then the baseline's, not the engine's."""
    base, cand = fab.gpu_result(seed=1, cov=0.02), fab.gpu_result(seed=2, cov=0.02)
    cell = _tg128(cand)
    cell.metrics["decode_tok_per_j_net"] = _scaled(cell.metrics["decode_tok_per_j_net"], 0.8)
    same = {(m.metric, m.status) for c, m in compare_results(base, cand).regressions() if m}
    assert ("decode_tok_per_j_net", "regression") in same
    cell.power.idle_power_w *= 0.7
    comp = compare_results(base, cand)
    assert not any(m and m.metric == "decode_tok_per_j_net" for _, m in comp.regressions())
    compared = next(c for c in comp.cells if c.candidate_id == cell.id)
    assert next(m for m in compared.changes if m.metric == "decode_tok_per_j_net").status == "noisy"
    assert compared.note and "idle power differs" in compared.note
    # gross metrics still gate, and a tolerance above the difference restores the net gate
    loose = compare_results(base, cand, CompareOptions(reference_tolerance_pct=50.0))
    assert any(m and m.metric == "decode_tok_per_j_net" for _, m in loose.regressions())


def test_roofline_does_not_gate_when_the_measured_bandwidth_differs(fab):
    base, cand = fab.gpu_result(seed=1, cov=0.02), fab.gpu_result(seed=2, cov=0.02)
    cell = _tg128(cand)
    cell.metrics["roofline_pct"] = _scaled(cell.metrics["roofline_pct"], 0.8)
    assert any(m and m.metric == "roofline_pct" for _, m in compare_results(base, cand).regressions())
    base.environment.gpus[0].memory_bandwidth_bytes_s = 936e9
    cand.environment.gpus[0].memory_bandwidth_bytes_s = 936e9 * 1.25
    comp = compare_results(base, cand)
    assert not any(m and m.metric == "roofline_pct" for _, m in comp.regressions())
    assert any(c.note and "bandwidth differs" in c.note for c in comp.cells)


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_exit_codes_and_outputs(fab, write_result, cli, tmp_path):
    base = write_result(fab.gpu_result(seed=1, cov=0.02), "base.json")
    same = write_result(fab.gpu_result(seed=2, cov=0.02), "same.json")
    slow = write_result(fab.gpu_result(seed=3, cov=0.02, decode_scale=0.8), "slow.json")
    other = write_result(fab.gpu_result(seed=4, cov=0.02, gpu="NVIDIA H200"), "h200.json")

    code, out, _ = cli(["compare", str(base), str(same)])
    assert code == 0 and "no regression" in out

    js, md = tmp_path / "c.json", tmp_path / "c.md"
    code, out, _ = cli(["compare", str(base), str(slow), "--json", str(js), "--md", str(md)])
    assert code == 1 and "REGRESSION" in out
    data = json.loads(js.read_text())
    assert data["exit_code"] == 1 and any(r["metric"] == "decode_tok_s" for r in data["regressions"])
    text = md.read_text()
    assert "| Cell | Metric | Baseline | Candidate | Change | 95% CI | p | Threshold | Status |" in text
    assert "regression" in text

    code, _, err = cli(["compare", str(base), str(other)])
    assert code == 2 and "different hardware" in err and "Traceback" not in err
    code, out, _ = cli(["compare", str(base), str(other), "--force"])
    assert code == 0 and "forced despite" in out


def test_cli_bad_metric_threshold(fab, write_result, cli):
    p = write_result(fab.cpu_result())
    code, _, err = cli(["compare", str(p), str(p), "--metric-threshold", "decode_tok_s"])
    assert code == 2 and "METRIC=PERCENT" in err


def test_cli_defaults_match_the_module():
    from lucebench.cli import compare_cmd
    from lucebench.reports import compare

    assert compare_cmd.DEFAULT_THRESHOLD_PCT == compare.DEFAULT_THRESHOLD_PCT
    assert compare_cmd.DEFAULT_ALPHA == compare.DEFAULT_ALPHA
    assert compare_cmd.DEFAULT_MIN_SAMPLES == compare.DEFAULT_MIN_SAMPLES
    assert compare_cmd.DEFAULT_REFERENCE_TOLERANCE_PCT == compare.DEFAULT_REFERENCE_TOLERANCE_PCT


# ---------------------------------------------------------------------------------------------- sample counts
def test_three_vs_three_cannot_reach_significance_so_a_consistent_ordering_is_inconclusive():
    from lucebench.reports.compare import smallest_p

    assert smallest_p(3, 3) == pytest.approx(0.05) and smallest_p(4, 4) == pytest.approx(1 / 70)
    # two runs of one commit: the second a little slower every time, as a busy machine makes it
    m = compare_metric("decode_tok_s", _summary([400, 401, 402]), _summary([360, 361, 362]), CompareOptions())
    assert m.status == "inconclusive" and m.too_few_samples and m.power == 0.0
    m = compare_metric("decode_tok_s", _summary([400, 401, 402, 403, 404]), _summary([360, 361, 362, 363, 364]),
                       CompareOptions())
    assert m.status == "regression" and not m.too_few_samples and m.power > 0.99


def test_a_gate_on_three_repetitions_warns_inconclusive_and_exits_0(fab, write_result, cli):
    from lucebench.reports.compare_render import summary_lines

    base, cand = fab.gpu_result(seed=1, cov=0.02, reps=3), fab.gpu_result(seed=2, cov=0.02, reps=3, decode_scale=0.8)
    for r in (base, cand):  # the one-prompt pp/tg cells: 3 samples a side (dataset cells have 2 prompts x 3)
        r.cells = [c for c in r.cells if c.params.get("model") == "qwen3.5-0.8b"]
    comp = compare_results(base, cand)
    assert comp.exit_code == 0
    text = "\n".join(summary_lines(comp))
    assert "warning: inconclusive:" in text and "3 vs 3 samples" in text and "power: 0 of" in text
    code, out, _ = cli(["compare", str(write_result(base, "a.json")), str(write_result(cand, "b.json"))])
    assert code == 0 and "warning: inconclusive" in out


def test_power_is_reported_and_enough_samples_still_flag_a_20_percent_slowdown(fab):
    from lucebench.reports.compare_render import summary_lines

    comp = compare_results(fab.gpu_result(seed=1, cov=0.02, reps=5), fab.gpu_result(seed=2, cov=0.02, reps=5,
                                                                                    decode_scale=0.8))
    assert comp.exit_code == 1
    power_line = next(line for line in summary_lines(comp) if line.startswith("power:"))
    assert "median power" in power_line


def test_a_cell_measured_on_a_busy_machine_does_not_gate(fab):
    from lucebench.results.schema import CpuLoad

    base, cand = fab.cpu_result(seed=1, reps=5), fab.cpu_result(seed=2, reps=5)
    for c in cand.cells:
        for m in c.metrics.values():  # 43x slower, as a CPU run beside a parallel build was
            m.median, m.samples = (m.median or 0) / 43, [x / 43 for x in m.samples]
    assert compare_results(base, cand).exit_code == 1
    cand.cells[0].cpu_load = CpuLoad(cpu_count=2, window_s=1.0, other_cores=1.8, other_fraction=0.9,
                                     contaminated=True)
    comp = compare_results(base, cand)
    assert comp.exit_code == 0 and "busy machine" in (comp.cells[0].note or "")
