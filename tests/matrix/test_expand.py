import pytest

from lucebench.config.schema import Config
from lucebench.errors import UserError
from lucebench.matrix import expand, select


def _config(**matrix):
    base = {"engine": ["ar", "hf"], "model": ["m"], "suite": ["pp64", "tg32"]}
    base.update(matrix)
    return Config.model_validate({"name": "t", "models": {"m": {"path": "/m"}}, "matrix": base})


def test_cartesian_product_and_stable_ids():
    cells = expand(_config(kv=["bf16", "q8_0/q4_0"]), "cpu")
    ids = [c.id for c in cells]
    # ar uses kv (2 values), hf does not: its kv axis collapses instead of multiplying
    assert ids == ["ar/m/pp64/kvbf16", "ar/m/pp64/kvq8_0-q4_0", "ar/m/tg32/kvbf16", "ar/m/tg32/kvq8_0-q4_0",
                   "hf/m/pp64", "hf/m/tg32"]
    assert ids == [c.id for c in expand(_config(kv=["bf16", "q8_0/q4_0"]), "cpu")]


def test_gpu_axes_collapse_on_cpu_and_apply_on_cuda():
    cfg = _config(power_limit_w=[220, 300])
    assert len(expand(cfg, "cpu")) == 4  # power limits mean nothing on the CPU backend
    cuda = expand(cfg, "cuda")
    assert len(cuda) == 8
    assert cuda[0].id == "ar/m/pp64/kvbf16/pl220W"
    assert cuda[0].params()["power_limit_w"] == 220


def test_exclude_include_and_empty():
    cfg = _config()
    cfg.exclude = [{"engine": "hf", "suite": "tg32"}]
    cfg.include = [{"engine": "hf", "model": "m", "suite": "gsm8k"}]
    ids = [c.id for c in expand(cfg, "cpu")]
    assert "hf/m/tg32" not in ids and "hf/m/gsm8k" in ids
    cfg.exclude = [{"model": "m"}]
    cfg.include = []
    with pytest.raises(UserError, match="empty"):
        expand(cfg, "cpu")


def test_only_globs():
    cells = expand(_config(), "cpu")
    assert [c.id for c in select(cells, "hf/*")] == ["hf/m/pp64", "hf/m/tg32"]
    assert len(select(cells, "*/pp64*,hf/m/tg32")) == 3
    with pytest.raises(UserError, match="matches no cell"):
        select(cells, "nothing*")


def test_unknown_engine_and_variant_options_are_refused_by_the_config():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="unknown engine"):
        _config(engine=["vllm"])
    with pytest.raises(ValidationError, match="bogus"):
        Config.model_validate({"name": "t", "models": {"m": {"path": "/m"}},
                               "engines": {"hf-c": {"type": "hf", "options": {"compile": True, "bogus": 1}}},
                               "matrix": {"engine": ["hf-c"], "model": ["m"], "suite": ["pp64"]}})


def test_include_takes_first_axis_values_for_unnamed_axes():
    cfg = _config(kv=["q8_0", "bf16"])
    cfg.include = [{"engine": "ar", "model": "m", "suite": "tg32", "context": 4096}]
    assert expand(cfg, "cpu")[-1].id == "ar/m/tg32/ctx4096/kvq8_0"


def test_an_engine_on_a_backend_it_cannot_run_on_is_refused_when_the_matrix_expands():
    cfg = _config(engine=["megakernel", "ar"])
    with pytest.raises(UserError) as exc:
        expand(cfg, "cpu")
    assert "'megakernel'" in str(exc.value) and "does not run on the cpu backend" in str(exc.value)
    assert exc.value.where == "config matrix.engine"
    assert [c.engine for c in expand(cfg, "cuda")][:1] == ["megakernel"]


def test_the_default_gpu_config_is_the_products_table():
    from lucebench.config import find_config, load_config

    cells = expand(load_config(find_config("quick-gpu")).config, "cuda")
    assert sorted({c.engine_type for c in cells}) == ["ar", "hf", "llama.cpp", "megakernel"]
    assert {c.suite for c in cells} == {"pp520", "tg128"} and len(cells) == 8
    assert load_config(find_config("quick-gpu")).config.baseline == "hf"
