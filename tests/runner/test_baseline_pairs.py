"""Which baseline cell a cell's speedups and token agreement are measured against."""

from __future__ import annotations

from lucebench.runner.run import baseline_pairs


def _cell(template, engine: str, kv: str, **params):
    c = template.model_copy(deep=True)
    c.params = {"engine": engine, "engine_type": engine, "model": "m", "suite": "humaneval", "gpu": 0,
                "kv_k": kv, "kv_v": kv, **params}
    c.id = "/".join(str(v) for v in c.params.values())
    c.status = "ok"
    return c


def test_same_kv_baseline_preferred_whatever_the_order(fab):
    t = fab.gpu_result().cells[0]
    ar_q8, ar_bf16 = _cell(t, "ar", "q8_0"), _cell(t, "ar", "bf16")
    spec_bf16, spec_q8 = _cell(t, "dflash", "bf16", budget=22), _cell(t, "dflash", "q8_0", budget=22)
    pairs = dict((id(c), b) for c, b in baseline_pairs([ar_q8, ar_bf16, spec_bf16, spec_q8], "ar"))
    assert pairs[id(spec_bf16)] is ar_bf16 and pairs[id(spec_q8)] is ar_q8
    # a baseline cell is measured against another KV type's baseline cell, never against itself
    assert pairs[id(ar_q8)] is ar_bf16 and pairs[id(ar_bf16)] is ar_q8


def test_no_pair_without_a_matching_ok_baseline(fab):
    t = fab.gpu_result().cells[0]
    failed = _cell(t, "ar", "bf16")
    failed.status = "failed"
    other_suite = _cell(t, "ar", "bf16", suite="gsm8k")
    spec = _cell(t, "dflash", "bf16", budget=8)
    spec_other_kv = _cell(t, "dflash", "q4_0", suite="gsm8k", budget=8)
    pairs = baseline_pairs([failed, other_suite, spec, spec_other_kv], "ar")
    assert [(c, b) for c, b in pairs] == [(spec_other_kv, other_suite)]  # another KV type: the only candidate
