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


@pytest.mark.parametrize("synth, message", [
    ("{shape: tiny, format: gguf, dtype: fp32}", "tensor types come from 'quant'"),
    ("{shape: tiny, quant: q8_0}", "'quant' applies to format gguf only"),
    ("{shape: tiny, format: gguf, quant: q5_k}", "quant"),
])
def test_synth_gguf_fields_are_checked(tmp_path, synth, message):
    load_config(_write(tmp_path, GOOD.replace("{shape: tiny, seed: 0}", "{shape: tiny, format: gguf, quant: q8_0}")))
    with pytest.raises(UserError, match=message):
        load_config(_write(tmp_path, GOOD.replace("{shape: tiny, seed: 0}", synth)))


SPEC = """\
name: t
models:
  tiny:
    synth: {shape: tiny, seed: 0}
  draft:
    synth: {draft_for: tiny}
engines:
  dflash-22:
    type: dflash
    options: {draft: draft, budget: 22}
matrix:
  engine: [ar, dflash-22]
  model: [tiny]
  suite: [pp64]
  budget: [null, 8]
"""


def test_speculative_engine_options_checked_at_their_line(tmp_path):
    loaded = load_config(_write(tmp_path, SPEC))
    assert loaded.config.engines["dflash-22"].options == {"draft": "draft", "budget": 22}
    for bad, fragment in (("budget: 22}", "budget: 0}"), ("draft: draft,", "draft: nowhere,")):
        with pytest.raises(UserError) as info:
            load_config(_write(tmp_path, SPEC.replace(bad, fragment)))
        msg = str(info.value)
        assert "c.yaml:10" in msg and "engines.dflash-22.options" in msg, msg
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, SPEC.replace("{draft_for: tiny}", "{draft_for: huge}")))
    assert "c.yaml:6" in str(info.value) and "'huge'" in str(info.value)
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, SPEC.replace("  budget: [null, 8]\n", "  keep_ratio: [0.05]\n")))
    assert "no engine of matrix.engine takes a keep ratio" in str(info.value)
