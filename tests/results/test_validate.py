"""lucebench.results.validate and `lucebench validate`: schema + plausibility, every problem with its JSON path."""

from __future__ import annotations

import json

from lucebench.metrics.definitions import compute_cell_metrics
from lucebench.results.validate import errors, validate_file, validate_result


def _idx(result, engine, suite, **params):
    """Index of the first cell with these params."""
    for i, c in enumerate(result.cells):
        if c.params.get("engine") == engine and c.params.get("suite") == suite and all(
                c.params.get(k) == v for k, v in params.items()):
            return i
    raise AssertionError("no such cell")


def _paths(problems):
    return {p.path for p in errors(problems)}


def test_fabricated_results_are_valid(fab):
    assert errors(validate_result(fab.gpu_result())) == []
    assert errors(validate_result(fab.cpu_result())) == []


def test_metrics_computed_by_lucebench_metrics_validate(fab):
    # The validator's recomputation must agree with the one place metrics are defined.
    r = fab.gpu_result(failures=False)
    for cell in r.cells:
        cell.metrics = compute_cell_metrics(cell.samples)
    assert errors(validate_result(r)) == []


def test_total_tok_per_j_with_phases_measured_by_different_methods(fab):
    # A short prefill window is measured by the power integral, its decode window by the counter; the
    # runner's total tok/J adds the two as measured, and the validator must accept it (H200 run, 2026-11-21).
    r = fab.gpu_result(failures=False)
    cell = next(c for c in r.cells if c.samples and any(s.n_gen > 1 for s in c.samples))
    for s in cell.samples:  # an integrated prefill energy far from the counter's (a long prompt's share)
        pre = s.energy["prefill"]
        s.energy["prefill"] = pre.model_copy(update={"energy_integrated_j": pre.energy_j + 0.5 * s.energy["decode"].energy_j,
                                                     "method": "integrated"})
    cell.metrics = compute_cell_metrics(cell.samples)
    assert errors(validate_result(r)) == []
    # ... and still catches a total that neither reading gives
    cell.metrics["total_tok_per_j"] = cell.metrics["total_tok_per_j"].model_copy(
        update={"median": cell.metrics["total_tok_per_j"].median * 1.2})
    assert any("total_tok_per_j" in p for p in _paths(validate_result(r)))


def test_power_above_the_cards_maximum(fab):
    r = fab.gpu_result()
    i = _idx(r, "megakernel", "tg128", power_limit_w=350)
    r.cells[i].samples[0].energy["decode"].avg_power_w = 650.0
    assert f"$.cells[{i}].samples[0].energy.decode.avg_power_w" in _paths(validate_result(r))


def test_energy_without_positive_power(fab):
    r = fab.gpu_result()
    i = _idx(r, "hf", "tg128")
    r.cells[i].samples[1].energy["prefill"].avg_power_w = 0.0
    assert f"$.cells[{i}].samples[1].energy.prefill.avg_power_w" in _paths(validate_result(r))


def test_tok_per_j_from_the_power_limit_is_caught(fab):
    # Upstream's tok/J was tok/s divided by the power limit: not what the energy samples say.
    r = fab.gpu_result()
    i = _idx(r, "megakernel", "tg128", power_limit_w=220)
    m = r.cells[i].metrics["decode_tok_per_j"]
    m.samples = [x / 220.0 * 0.9 for x in r.cells[i].metrics["decode_tok_s"].samples]
    m.median = sorted(m.samples)[len(m.samples) // 2]
    m.mean = sum(m.samples) / len(m.samples)
    m.min, m.max = min(m.samples), max(m.samples)
    m.stddev, m.cov = None, None
    problems = validate_result(r)
    assert f"$.cells[{i}].metrics.decode_tok_per_j.median" in _paths(problems)
    assert any("samples give" in p.message for p in problems)


def test_tok_per_j_without_energy_samples(fab):
    r = fab.gpu_result()
    i = _idx(r, "llamacpp", "tg128")
    for s in r.cells[i].samples:
        s.energy = {}
    assert f"$.cells[{i}].metrics.decode_tok_per_j.median" in _paths(validate_result(r))


def test_phase_time_in_wrong_unit(fab):
    r = fab.gpu_result()
    i = _idx(r, "hf", "tg128")
    s = r.cells[i].samples[2]
    s.decode_s *= 1000  # milliseconds stored as seconds
    s.e2e_s = s.prefill_s + s.decode_s + 0.01
    paths = _paths(validate_result(r))
    assert f"$.cells[{i}].samples[2].decode_s" in paths


def test_median_inconsistent_with_its_samples(fab):
    r = fab.cpu_result()
    r.cells[0].metrics["prefill_tok_s"].median *= 1.5
    paths = _paths(validate_result(r))
    assert "$.cells[0].metrics.prefill_tok_s.median" in paths


def test_unknown_version_without_commit(fab):
    r = fab.cpu_result()
    r.lucebench_version = "9.9.9"
    r.environment.lucebench_commit = None
    assert "$.lucebench_version" in _paths(validate_result(r))
    r.environment.lucebench_commit = "0123abc"  # a commit makes a development version acceptable
    assert "$.lucebench_version" not in _paths(validate_result(r))


def test_ok_cell_without_samples_and_failed_cell_without_error(fab):
    r = fab.gpu_result()
    r.cells[0].samples = []
    bad = next(i for i, c in enumerate(r.cells) if c.status == "failed")
    r.cells[bad].error = None
    paths = _paths(validate_result(r))
    assert {"$.cells[0].samples", f"$.cells[{bad}].error"} <= paths


def test_energy_metric_on_a_run_without_power(fab):
    r = fab.cpu_result()
    r.cells[0].metrics["decode_tok_per_j"] = r.cells[0].metrics["decode_tok_s"].model_copy()
    assert "$.cells[0].metrics.decode_tok_per_j" in _paths(validate_result(r))


def test_nan_and_schema_problems_all_listed(fab, write_result):
    data = json.loads(fab.cpu_result().model_dump_json(by_alias=True))
    data["cells"][0]["samples"][0]["prefill_s"] = float("nan")
    data["cells"][0]["status"] = "fine"
    del data["run_id"]
    path = write_result(json.dumps(data))  # json.dumps writes NaN, as a careless tool would
    paths = _paths(validate_file(path))
    assert {"$.cells[0].samples[0].prefill_s", "$.cells[0].status", "$.run_id"} <= paths


def test_many_problems_are_all_reported(fab):
    r = fab.gpu_result()
    for cell in r.cells[:4]:
        cell.samples[0].energy["decode"].avg_power_w = 900.0
    assert len([p for p in errors(validate_result(r)) if p.path.endswith("decode.avg_power_w")]) == 4


def test_aggregate_energy_is_a_warning_not_an_error(fab):
    r = fab.gpu_result()
    i = _idx(r, "hf", "tg128")
    for s in r.cells[i].samples:
        s.energy = {}
    for name in list(r.cells[i].metrics):
        if "_j" in name:
            r.cells[i].metrics[name].note = "aggregate over 5 windows, 2.10 s"
    problems = validate_result(r)
    assert not any(p.path.startswith(f"$.cells[{i}].metrics") and p.path.endswith("per_j.median")
                   for p in errors(problems))
    assert any(p.severity == "warning" and "aggregate" in p.message for p in problems)


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_valid_files_exit_0(fab, write_result, cli):
    a = write_result(fab.gpu_result(), "a.json")
    b = write_result(fab.cpu_result(), "b.json")
    code, out, _ = cli(["validate", str(a), str(b)])
    assert code == 0
    assert "all 2 file(s) valid" in out


def test_cli_invalid_lists_every_problem_and_never_says_ok(fab, write_result, cli):
    good = write_result(fab.cpu_result(), "good.json")
    r = fab.gpu_result()
    r.cells[0].samples[0].energy["decode"].avg_power_w = 900.0
    r.cells[1].metrics["prefill_tok_s"].median = 1.0
    bad = write_result(r, "bad.json")
    broken = write_result('{"schema": "lucebench.result/v1",\n "run_id": }', "broken.json")
    code, out, _ = cli(["validate", str(good), str(bad), str(broken), str(good.parent / "missing.json")])
    assert code == 1
    assert "$.cells[0].samples[0].energy.decode.avg_power_w" in out
    assert "$.cells[1].metrics.prefill_tok_s.median" in out
    assert "line 2, column 12" in out
    assert "no such file" in out
    lines = out.splitlines()
    assert any(line.startswith("valid") and "good.json" in line for line in lines)
    for name in ("bad.json", "broken.json", "missing.json"):
        assert not any(line.startswith("valid") and name in line for line in lines)
        assert any(line.startswith("INVALID") and name in line for line in lines)
    assert "3 of 4 file(s) invalid" in out
    assert "all" not in lines[-1]


def test_warnings_do_not_fail(fab, write_result, cli):
    r = fab.cpu_result()
    r.environment.lucebench_dirty = True
    code, out, _ = cli(["validate", str(write_result(r))])
    assert code == 0 and "warning" in out and "modified source tree" in out


def test_a_result_without_its_schema_or_cells_is_invalid(fab, write_result):
    import json as _json

    from lucebench.results.validate import errors as _errors
    from lucebench.results.validate import validate_file as _validate

    data = _json.loads(fab.cpu_result().model_dump_json(by_alias=True))
    no_schema = {k: v for k, v in data.items() if k != "schema"}
    [problem] = _errors(_validate(write_result(_json.dumps(no_schema), "a.json")))
    assert problem.path == "$.schema" and "missing" in problem.message
    no_cells = {k: v for k, v in data.items() if k != "cells"}
    assert [p.path for p in _errors(_validate(write_result(_json.dumps(no_cells), "b.json")))] == ["$.cells"]


def test_validate_accepts_a_run_folder_as_report_and_compare_do(fab, write_result, tmp_path, cli):
    write_result(fab.cpu_result(), "run/results.json")
    code, out, _ = cli(["validate", str(tmp_path / "run")])
    assert code == 0 and "valid" in out


def test_a_cell_measured_on_a_busy_machine_is_a_warning(fab):
    from lucebench.results.schema import CpuLoad
    from lucebench.results.validate import validate_result as _validate_result

    r = fab.cpu_result()
    r.cells[0].cpu_load = CpuLoad(cpu_count=2, window_s=1.0, other_cores=1.2, other_fraction=0.6, contaminated=True)
    [p] = [p for p in _validate_result(r) if p.path.endswith("cpu_load")]
    assert p.severity == "warning" and "busy machine" in p.message


def test_speculative_and_compressed_prefill_counts_are_checked(fab):
    r = fab.gpu_result(failures=False)
    dflash = _idx(r, "dflash", "humaneval", budget=22)
    pflash = next(i for i, c in enumerate(r.cells) if c.params.get("engine") == "pflash")
    assert errors(validate_result(r)) == []
    s = r.cells[dflash].samples[0]
    s.spec.al_histogram = [*s.spec.al_histogram[:-1], s.spec.al_histogram[-1] + 1]
    p = r.cells[pflash].samples[0]
    p.prefill.prompt_tokens += 1
    paths = _paths(validate_result(r))
    assert f"$.cells[{dflash}].samples[0].spec" in paths
    assert f"$.cells[{pflash}].samples[0].prefill.prompt_tokens" in paths


def _slow_decode(fab, factor):
    """A tg128 cell whose first sample's decode energy is `factor` x what the card's maximum power over its
    decode time allows (factor < 1: physically possible), with more than 100 J a token."""
    r = fab.gpu_result()
    i = _idx(r, "hf", "tg128")
    s = r.cells[i].samples[0]
    e = s.energy["decode"]
    tokens = s.n_gen - 1
    secs = 2.0 * tokens  # 2 s a token: a 27B decoding after a long prompt on a slow kernel
    s.decode_s = secs
    s.t_decode_end_ns = s.t_decode_start_ns + int(secs * 1e9)
    s.e2e_s = s.prefill_s + secs + 0.01
    gross = factor * secs * 400.0  # the fabricated card's maximum power limit: 400 W
    s.energy["decode"] = e.model_copy(update={"energy_j": gross, "window_s": secs, "avg_power_w": gross / secs})
    return r, i


def test_more_than_100_j_a_token_is_a_warning_when_the_phase_time_explains_it(fab):
    r, i = _slow_decode(fab, 0.5)
    problems = [p for p in validate_result(r) if p.path == f"$.cells[{i}].samples[0].energy.decode"]
    assert [p.severity for p in problems] == ["warning"] and "slow phase" in problems[0].message


def test_energy_no_card_can_spend_in_the_phase_time_is_an_error(fab):
    r, i = _slow_decode(fab, 3.0)
    assert f"$.cells[{i}].samples[0].energy.decode" in _paths(validate_result(r))
