import textwrap

import pytest

from lucebench.config import load_config
from lucebench.errors import UserError

GOOD = """\
name: t
models:
  tiny:
    synth: {shape: tiny, seed: 0}
matrix:
  engine: [ar, hf]
  model: [tiny]
  suite: [pp64]
"""


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_good_config_loads_with_defaults(tmp_path):
    loaded = load_config(_write(tmp_path, GOOD))
    assert loaded.config.matrix.engine == ["ar", "hf"]
    assert loaded.config.measure.repetitions == 5
    assert len(loaded.sha256) == 64


def test_malformed_yaml_names_line(tmp_path):
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, "name: t\nmatrix: [a, b\n"))
    assert "malformed YAML" in str(info.value)
    assert "c.yaml:" in str(info.value)


def test_unknown_key_names_line_and_key(tmp_path):
    text = GOOD.replace("  suite: [pp64]\n", "  suite: [pp64]\n  sweet: [x]\n")
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, text))
    msg = str(info.value)
    assert "c.yaml:9" in msg and "matrix.sweet" in msg and "unknown key" in msg


def test_wrong_type_names_line(tmp_path):
    text = GOOD + "measure:\n  repetitions: many\n"
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, text))
    assert "c.yaml:10" in str(info.value) and "measure.repetitions" in str(info.value)


def test_duplicate_key_rejected(tmp_path):
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, GOOD + "name: again\n"))
    assert "duplicate key 'name'" in str(info.value)


def test_model_reference_and_kv_checked(tmp_path):
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, GOOD.replace("model: [tiny]", "model: [big]")))
    assert "'big'" in str(info.value)
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, GOOD + "  kv: [q5_1]\n"))
    assert "q5_1" in str(info.value)


def test_empty_and_non_mapping(tmp_path):
    with pytest.raises(UserError, match="empty"):
        load_config(_write(tmp_path, ""))
    with pytest.raises(UserError, match="mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_model_source_needs_exactly_one(tmp_path):
    text = GOOD.replace("    synth: {shape: tiny, seed: 0}", "    path: /x\n    hub: a/b")
    with pytest.raises(UserError, match="exactly one"):
        load_config(_write(tmp_path, text))
