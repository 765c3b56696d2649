"""Every matrix axis and config section rejects values no run can use when the config is validated (what
`--dry-run` does), each error naming the line and key it is about."""

from __future__ import annotations

import textwrap

import pytest

from lucebench.config import load_config
from lucebench.errors import UserError

BASE = """\
name: t
models:
  tiny:
    synth: {shape: tiny, seed: 0}
engines:
  ar-x: {type: ar}
matrix:
  engine: [ar, hf]
  model: [tiny]
  suite: [pp64]
"""


def _error(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(UserError) as info:
        load_config(path)
    return str(info.value)


def _with(tmp_path, line: str, *, replace: str | None = None) -> str:
    text = BASE.replace(replace, line) if replace else BASE + line
    return _error(tmp_path, text)


def test_engine_axis_rejects_an_unknown_engine(tmp_path):
    err = _with(tmp_path, "  engine: [ar, nosuch]\n", replace="  engine: [ar, hf]\n")
    assert "c.yaml:8: matrix.engine[1]" in err and "unknown engine 'nosuch'" in err


def test_model_axis_names_the_line_of_a_dangling_model(tmp_path):
    err = _with(tmp_path, "  model: [tiny, ghost]\n", replace="  model: [tiny]\n")
    assert "c.yaml:9: matrix.model[1]" in err and "'ghost' is not under 'models'" in err


def test_suite_axis_rejects_an_unknown_suite(tmp_path):
    err = _with(tmp_path, "  suite: [pp64, nosuchsuite]\n", replace="  suite: [pp64]\n")
    assert "c.yaml:10: matrix.suite" in err and "nosuchsuite" in err


def test_gpu_axis_rejects_negative_indices(tmp_path):
    assert "c.yaml:11: matrix.gpu" in _with(tmp_path, "  gpu: [-1]\n")


def test_power_limit_axis_rejects_out_of_range_watts(tmp_path):
    assert "watts from 1 to 2000" in _with(tmp_path, "  power_limit_w: [0]\n")
    assert "c.yaml:11: matrix.power_limit_w" in _with(tmp_path, "  power_limit_w: [90000]\n")


def test_budget_axis_rejects_values_out_of_range_and_budgets_no_engine_takes(tmp_path):
    assert "from 1 to 4096" in _with(tmp_path, "  budget: [-5]\n")
    err = _with(tmp_path, "  budget: [16]\n")
    assert "c.yaml:11: matrix.budget" in err and "no engine of matrix.engine takes a budget" in err


def test_kv_axis_rejects_unknown_types(tmp_path):
    assert "c.yaml:11: matrix.kv" in _with(tmp_path, "  kv: [q3_k]\n")


def test_context_axis_rejects_negative_and_huge_depths(tmp_path):
    assert "c.yaml:11: matrix.context" in _with(tmp_path, "  context: [-1]\n")
    assert "from 0 to 1048576" in _with(tmp_path, "  context: [99999999]\n")


def test_synth_shape_error_names_the_config_key_not_a_flag(tmp_path):
    err = _with(tmp_path, "    synth: {shape: nosuchshape, seed: 0}\n", replace="    synth: {shape: tiny, seed: 0}\n")
    assert "c.yaml:4: models.tiny.synth.shape" in err and "--shape" not in err


def test_engine_variants_reject_unknown_types_and_options(tmp_path):
    assert "c.yaml:6: engines.ar-x.type" in _with(tmp_path, "  ar-x: {type: nosuch}\n", replace="  ar-x: {type: ar}\n")
    err = _with(tmp_path, "  ar-x: {type: ar, options: {colour: red}}\n", replace="  ar-x: {type: ar}\n")
    assert "engines.ar-x.options" in err and "colour" in err


def test_suite_overrides_reject_unknown_suites(tmp_path):
    assert "suites.nosuchsuite" in _with(tmp_path, "suites:\n  nosuchsuite: {n_gen: 4}\n")


def test_gpu_section_rejects_bad_devices_and_arch(tmp_path):
    assert "gpu.devices" in _with(tmp_path, "gpu: {devices: [0, 0]}\n")
    assert "gpu.arch" in _with(tmp_path, "gpu: {arch: 'sm-ninety'}\n")


def test_include_rules_check_their_values_like_the_axes(tmp_path):
    err = _with(tmp_path, "include:\n  - {engine: ar, model: tiny, suite: pp64, context: -3}\n")
    assert "include[0].context" in err
    assert "include[0].engine" in _with(tmp_path, "include:\n  - {engine: nosuch, model: tiny, suite: pp64}\n")


def test_suite_overrides_reject_unknown_prompt_formats_and_zero_counts(tmp_path):
    assert "suites.gsm8k.prompt_format" in _with(tmp_path, "suites:\n  gsm8k: {prompt_format: chatty}\n")
    assert "suites.gsm8k.n_gen" in _with(tmp_path, "suites:\n  gsm8k: {n_gen: 0}\n")


def test_measure_and_power_sections_reject_out_of_range_values(tmp_path):
    assert "measure.repetitions" in _with(tmp_path, "measure: {repetitions: 0}\n")
    assert "measure.prepare_timeout_s" in _with(tmp_path, "measure: {prepare_timeout_s: -1}\n")
    assert "power.idle_s" in _with(tmp_path, "power: {idle_s: -3}\n")
