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


def _spec_config(matrix: dict | None = None, engines: dict | None = None, models: dict | None = None) -> Config:
    return Config.model_validate({
        "name": "t",
        "models": models or {"t": {"path": "/t"}, "d": {"synth": {"draft_for": "t"}}, "q": {"path": "/q"}},
        "engines": engines if engines is not None else {
            "dflash-22": {"type": "dflash", "options": {"draft": "d", "budget": 22}},
            "dflash-chain": {"type": "dflash", "options": {"draft": "d", "verify": "chain"}},
            "pf": {"type": "pflash", "options": {"drafter": "q", "keep_ratio": 0.05}}},
        "matrix": {"engine": ["ar", "dflash-22", "dflash-chain", "pf"], "model": ["t"], "suite": ["tg32"],
                   "budget": [None, 8, 40], "keep_ratio": [None, 0.02], **(matrix or {})}})


def test_speculative_axes_and_second_models():
    cells = expand(_spec_config(), "cpu")
    ids = [c.id for c in cells]
    # budget applies to dflash only (its variant's own 22 where the axis is null), keep_ratio to pflash only.
    assert ids == ["ar/t/tg32/kvbf16",
                   "dflash-22/t/tg32/kvbf16/b22", "dflash-22/t/tg32/kvbf16/b8", "dflash-22/t/tg32/kvbf16/b40",
                   "dflash-chain/t/tg32/kvbf16", "dflash-chain/t/tg32/kvbf16/b8", "dflash-chain/t/tg32/kvbf16/b40",
                   "pf/t/tg32/kvbf16/k0.05", "pf/t/tg32/kvbf16/k0.02"]
    by_id = {c.id: c for c in cells}
    assert by_id["dflash-22/t/tg32/kvbf16/b8"].second_model == "d" and by_id["pf/t/tg32/kvbf16/k0.02"].second_model == "q"
    assert by_id["ar/t/tg32/kvbf16"].second_model is None
    assert by_id["pf/t/tg32/kvbf16/k0.02"].params() == {"engine": "pf", "engine_type": "pflash", "model": "t",
                                                         "suite": "tg32", "keep_ratio": 0.02, "kv_k": "bf16",
                                                         "kv_v": "bf16"}


@pytest.mark.parametrize(("engines", "message"), [
    ({"x": {"type": "dflash", "options": {"budget": 22}}}, "draft"),
    ({"x": {"type": "dflash", "options": {"draft": "d", "budget": 0}}}, "budget"),
    ({"x": {"type": "dflash", "options": {"draft": "d", "verify": "dag"}}}, "verify"),
    ({"x": {"type": "dflash", "options": {"draft": "d", "top_k": 0}}}, "top_k"),
    ({"x": {"type": "dflash", "options": {"draft": "d", "top_k": "eight"}}}, "top_k"),
    ({"x": {"type": "dflash", "options": {"draft": "d", "chain_seed": "maybe"}}}, "chain_seed"),
    ({"x": {"type": "pflash", "options": {"drafter": "q", "keep_ratio": 1.5}}}, "keep_ratio"),
    ({"x": {"type": "pflash", "options": {"drafter": "q", "budget": 3}}}, "unknown option"),
    ({"x": {"type": "pflash", "options": {"drafter": "q", "drafter_sparse_alpha": 85}}}, "drafter_sparse_alpha"),
    ({"x": {"type": "pflash", "options": {"drafter": "q", "drafter_sparse_from": -1}}}, "drafter_sparse_from"),
    ({"x": {"type": "pflash", "options": {"drafter": "q", "drafter_kv": "q5_k"}}}, "drafter_kv"),
    ({"x": {"type": "hf", "options": {"dtype": "int4"}}}, "dtype"),
    ({"x": {"type": "llama.cpp", "options": {"n_gpu_layers": -1}}}, "n_gpu_layers"),
])
def test_typed_engine_options_are_validated(engines, message):
    from pydantic import ValidationError

    # The config's own validation finds it (at its line, through load_config), and so does resolving the engine.
    with pytest.raises(ValidationError, match=message):
        _spec_config(matrix={"engine": ["x"]}, engines=engines)
    from lucebench.config.schema import EngineVariant
    from lucebench.engines.registry import resolve_engine

    with pytest.raises(UserError, match=message):
        resolve_engine("x", {k: EngineVariant.model_validate(v) for k, v in engines.items()})


def test_config_references_of_second_models():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="'nope' is not under 'models'"):
        _spec_config(engines={"x": {"type": "dflash", "options": {"draft": "nope"}}}, matrix={"engine": ["x"]})
    with pytest.raises(ValidationError, match="'zz' is not another entry"):
        _spec_config(models={"t": {"path": "/t"}, "d": {"synth": {"draft_for": "zz"}}}, engines={},
                     matrix={"engine": ["ar"]})
    with pytest.raises(ValidationError, match="keep ratio"):
        _spec_config(matrix={"keep_ratio": [0.0]})
    with pytest.raises(ValidationError, match="budget"):
        _spec_config(matrix={"budget": [0]})
