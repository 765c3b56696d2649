"""Report tables: the upstream layout, built only from cells that exist."""

from __future__ import annotations

from lucebench.reports import cells as C
from lucebench.reports import tables as T


def _table(tables, key):
    return next((t for t in tables if t.key == key), None)


def test_full_gpu_matrix_has_every_table(fab):
    tables = T.all_tables(C.collect([fab.gpu_result()]))
    assert [t.key for t in tables] == ["throughput", "power_sweep", "speculative", "budget_sweep", "acceptance",
                                       "context", "compressed_prefill", "retention", "failed"]


def test_throughput_table_upstream_columns(fab):
    t = T.throughput_table(C.collect([fab.gpu_result()]))
    assert t is not None
    assert t.headers[:4] == ["Method", "Power limit", "Prefill pp520 (tok/s)", "Decode tg128 (tok/s)"]
    assert "tok/J" in t.headers
    row = next(r for r in t.rows if r[0] == "megakernel" and r[1] == "350 W")
    assert row[2].startswith("21,") and "±" in row[2] and "(n=5)" in row[2]
    assert row[3].startswith("41") and "(n=5)" in row[3]


def test_speculative_table_at_headline_budget(fab):
    t = T.speculative_table(C.collect([fab.gpu_result()]))
    assert t is not None
    assert t.headers == ["Benchmark", "AR ar (tok/s)", "dflash (tok/s)", "AL", "Speedup", "AR tok/J", "dflash tok/J"]
    assert [r[0] for r in t.rows] == ["gsm8k", "humaneval", "math500"]
    humaneval = t.rows[1]
    assert humaneval[4].startswith("3.4")  # 129.5 / 37.8
    assert humaneval[3].startswith("8.23")  # what the samples' spec counts give: 255 tokens in 31 rounds
    # tok/J of the decode phase at 340 W: 37.8 / 340 for AR, 129.5 / 340 for DFlash
    assert humaneval[5].startswith("0.11") and humaneval[6].startswith("0.38")
    assert "DDTree budget 22" in t.notes


def test_budget_sweep_and_context(fab):
    views = C.collect([fab.gpu_result()])
    sweep = T.budget_sweep_table(views)
    assert sweep is not None and [r[2] for r in sweep.rows] == ["15", "22", "30", "40"]
    ctx = T.context_table(views)
    assert ctx is not None and ctx.headers[:2] == ["Context", "KV"]
    assert {r[1] for r in ctx.rows} == {"f16", "q8_0"}
    assert ctx.rows[0][0] == "16,384"


def test_power_sweep_marks_best_tok_per_j(fab):
    t = T.power_sweep_table(C.collect([fab.gpu_result()]))
    assert t is not None
    best = [r for r in t.rows if r[-1].startswith("★")]
    assert len(best) == 1 and best[0][2] == "220 W"


def test_failed_and_skipped_listed_with_reasons(fab):
    t = T.failed_table(C.collect([fab.gpu_result()]))
    assert t is not None
    assert {r[2] for r in t.rows} == {"failed", "skipped"}
    assert any("out of memory" in r[4] for r in t.rows)


def test_cpu_smoke_only_throughput_with_na_energy(fab):
    tables = T.all_tables(C.collect([fab.cpu_result()]))
    assert [t.key for t in tables] == ["throughput"]
    row = tables[0].rows[0]
    assert row[tables[0].headers.index("tok/J")] == "n/a"
    assert "0.00" not in " ".join(row)


def test_noisy_cells_listed(fab):
    r = fab.cpu_result()
    for name in ("decode_tok_s", "prefill_tok_s"):
        r.cells[0].metrics[name].noisy = True
    tables = T.all_tables(C.collect([r]))
    noisy = _table(tables, "noisy")
    # condensed: one row per cell, its noisy metrics listed with their CoV
    assert noisy is not None and len(noisy.rows) == 1 and noisy.headers == ["Cell", "Noisy metrics (CoV)", "n"]
    assert "decode_tok_s " in noisy.rows[0][1] and "prefill_tok_s " in noisy.rows[0][1]
    assert "⚠" in _table(tables, "throughput").rows[0][2]
    assert [t.key for t in tables].index("noisy") > [t.key for t in tables].index("throughput")


def test_environment_block(fab):
    rows = dict(T.environment_rows(fab.gpu_result()))
    assert rows["GPU 0"].startswith("NVIDIA GeForce RTX 3090")
    assert rows["driver"] == "575.57.08" and rows["CUDA"] == "12.9"
    assert "350 W" in rows["GPU 0 power limit"]
    assert "0123456789abcdef" in rows["lucebench"]
    models = [v for k, v in T.environment_rows(fab.gpu_result()) if k == "model"]
    assert any("synthetic weights" in m for m in models)
    assert not all("synthetic weights" in m for m in models)


def test_environment_block_names_the_idle_power(fab):
    r = fab.gpu_result()
    assert dict(T.environment_rows(r))["idle power (net energies subtract it)"] == "30.0 W"
    r.cells[0].power.idle_power_w = 80.8  # an old resumed run: two baselines
    row = dict(T.environment_rows(r))["idle power (net energies subtract it)"]
    assert row.startswith("30.0 W, 80.8 W") and "with care" in row


def test_environment_block_names_the_engine_sources(fab):
    r = fab.gpu_result()
    bundled = [c for c in r.cells if c.engine is not None and c.engine.kind == "bundled"]
    assert bundled
    for c in bundled:
        c.engine.build["source_hash"] = "d82e3965607ee2cf"
    bundled[0].engine.build["source_hash"] = "f26c7c0291c7ead5"  # a resumed run: another build for one cell
    rows = dict(T.environment_rows(r))
    name = bundled[0].engine.name
    same = [c for c in bundled if c.engine.name == name]
    want = "f26c7c0291c7ead5 + d82e3965607ee2cf" if len(same) > 1 else "f26c7c0291c7ead5"
    assert rows[f"engine {name}"] == f"0.1.0, {bundled[0].engine.backend}, engine sources {want}"
    others = [c.engine.name for c in r.cells if c.engine is not None and c.engine.kind != "bundled"]
    for name in others:
        assert "engine sources" not in rows[f"engine {name}"]


def test_two_cards_get_a_card_column(fab):
    views = C.collect([fab.gpu_result(), fab.gpu_result(seed=3, gpu="NVIDIA H200")])
    t = T.throughput_table(views)
    assert t is not None and "Card" in t.headers


def test_tg_depth_is_not_long_context_and_engine_type_is_not_a_label(fab):
    r = fab.cpu_result()
    cell = r.cells[0]
    cell.workload.depth = 1  # tgN suites record the one prompt token already in context
    cell.params["engine_type"] = cell.params["engine"]
    tables = T.all_tables(C.collect([r]))
    assert [t.key for t in tables] == ["throughput"]
    assert "engine_type" not in tables[0].headers


def test_dataset_cells_without_speculation_get_their_own_table(fab):
    r = fab.gpu_result()
    r.cells = [c for c in r.cells if c.params.get("engine") == "ar"]
    tables = T.all_tables(C.collect([r]))
    t = _table(tables, "datasets")
    assert t is not None and [row[0] for row in t.rows] == ["gsm8k", "humaneval", "math500"]
    assert _table(tables, "speculative") is None


def test_failure_reasons_are_whole_not_cut_mid_sentence(fab):
    r = fab.gpu_result()
    bad = next(c for c in r.cells if c.status == "failed")
    bad.error.message = ("engine printed a line that is not protocol JSON: '{\"type\": \"result\", \"id\": \"r1\", "
                         "\"timing\": {\"prefill_ms\": 1.5, \"decode_ms\": ' - the engine wrote a partial reply "
                         "before it was killed; its log has the rest of the output and the reason it stopped")
    row = next(row for row in _table(T.all_tables(C.collect([r])), "failed").rows if row[0] == bad.id)
    assert row[4] == bad.error.message
    long = T.reason_text("First sentence is here. " + "word " * 200)
    assert long.startswith("First sentence is here.") and long.endswith("(the full message is in results.json)")
    assert "wor …" not in long


def test_acceptance_table_from_the_samples_spec_counts(fab):
    t = T.acceptance_table(C.collect([fab.gpu_result()]))
    assert t is not None and t.headers[:4] == ["Method", "Suite", "Budget", "AL"]
    assert t.headers[5:13] == ["d1", "d2", "d3", "d4", "d6", "d8", "d11", "d15"]
    row = next(r for r in t.rows if r[1] == "humaneval" and r[2] == "22")
    # 255 decode tokens in 31 rounds: 24 of 8 tokens and 7 of 9, so depths 1..7 always accepted, depth 8 in
    # the 9-token rounds only, and none deeper.
    assert row[5:10] == ["1.00", "1.00", "1.00", "1.00", "1.00"] and 0 < float(row[10]) < 1 and row[11] == "0.00"
    assert row[-1].startswith("0% / 100% / 0%")


def test_compressed_prefill_and_retention_tables(fab):
    views = C.collect([fab.gpu_result()])
    t = T.compressed_prefill_table(views)
    assert t is not None and [r[0] for r in t.rows] == ["16,384", "16,384", "65,536", "65,536"]
    assert t.headers[:4] == ["Context", "Method", "KV", "Keep"]
    row = next(r for r in t.rows if r[0] == "65,536" and r[2] == "f16")
    assert row[3] == "0.05" and row[6].startswith("3,264")  # kept target tokens: 5% of 65,536 in 32-token chunks
    # The full prefill (llama.cpp, 135 s at 64K) against pflash's 13.5 s: a tenfold TTFT.
    assert row[8].startswith("135,") and row[9].startswith("10.0")
    ret = T.retention_table(views)
    assert ret is not None and ret.headers[4:10] == ["Retention", "depth 0.1", "depth 0.3", "depth 0.5", "depth 0.7",
                                                      "depth 0.9"]
    lost = next(r for r in ret.rows if r[0] == "65,536" and r[2] == "q8_0")
    assert lost[4].startswith("80.0") and lost[5:10] == ["1/1", "1/1", "1/1", "1/1", "0/1"]
    kept = next(r for r in ret.rows if r[0] == "16,384" and r[2] == "f16")
    assert kept[4].startswith("100.0")
    assert "Accuracy, compressed" not in ret.headers  # nothing scored
    # prefill energy beside the full prefill's, per pass over the 5 prompts: 345 W x 13.5 s against 135 s each
    assert t.headers[-2:] == ["Prefill energy (J)", "Full prefill energy (J)"]
    assert row[10].startswith("23,") and row[11].startswith("23") and len(row[11].split(".")[0]) == 7


def test_compressed_prefill_table_names_the_suite_when_several_ran(fab):
    """Two needle variants at the same context: a Suite column tells their rows apart, each with its own full
    prefill partner."""
    result = fab.gpu_result()
    extra = []
    for c in result.cells:
        if c.params.get("suite") == "niah":
            other = c.model_copy(deep=True)
            other.id = c.id + "-code"
            other.params["suite"] = "niah-code"
            extra.append(other)
    result.cells += extra
    t = T.compressed_prefill_table(C.collect([result]))
    assert t.headers[:3] == ["Context", "Method", "Suite"]
    assert {(r[0], r[2]) for r in t.rows} == {(c, s) for c in ("16,384", "65,536") for s in ("niah", "niah-code")}
    assert all(r[9] != "n/a" for r in t.rows if r[3] == "f16")  # each found its full prefill (f16: llama.cpp's)


def test_compressed_prefill_table_has_a_column_pair_per_full_prefill_engine(fab):
    """Our full prefill and llama.cpp's at the same context and KV: a TTFT and a speed-up column for each."""
    result = fab.gpu_result()
    ours = []
    for c in result.cells:
        if c.params.get("engine") == "llamacpp" and c.params.get("suite") == "niah":
            o = c.model_copy(deep=True)
            o.id = c.id + "-ar"
            o.params["engine"] = "ar"
            for s in o.samples:  # our full prefill twice as fast as llama.cpp's here
                s.prefill_s /= 2
            o.metrics["ttft_ms"] = o.metrics["ttft_ms"].model_copy(update={"median": o.metrics["ttft_ms"].median / 2})
            ours.append(o)
    result.cells += ours
    t = T.compressed_prefill_table(C.collect([result]))
    assert t.headers[7:12] == ["Effective prefill (tok/s)", "Full prefill TTFT (ms), ar", "TTFT speedup, ar",
                               "Full prefill TTFT (ms), llamacpp", "TTFT speedup, llamacpp"]
    row = next(r for r in t.rows if r[0] == "65,536" and r[2] == "f16")
    assert row[9].startswith("5.0") and row[11].startswith("10.0")


def test_retention_table_puts_accuracy_with_and_without_compression_side_by_side(fab):
    """Scored needle cells (--score): the compressed cell's accuracy beside its full-prefill partner's (the
    same model, suite and context), n/a where that partner has none."""
    from lucebench.metrics.stats import summarize

    result = fab.gpu_result()
    for c in result.cells:
        if c.params.get("suite") == "niah" and c.params.get("context") == 65536 and c.params.get("kv_k") == "f16":
            c.metrics["accuracy"] = summarize([80.0 if c.params["engine"] == "pflash" else 100.0], "%")
    ret = T.retention_table(C.collect([result]))
    assert ret.headers[-2:] == ["Accuracy, compressed", "Accuracy, full prompt"]
    row = next(r for r in ret.rows if r[0] == "65,536" and r[2] == "f16")
    assert row[-2].startswith("80") and row[-1].startswith("100")
    other = next(r for r in ret.rows if r[0] == "16,384" and r[2] == "f16")
    assert other[-2:] == ["n/a", "n/a"]
    assert any("full-prefill cell" in n for n in ret.notes)


def test_speculative_table_as_a_run_records_params(fab):
    """A run's params carry engine_type (ar vs dflash) and a sweep puts every budget in every suite:
    the AR partner is still found, the headline is upstream's 22, and tree and chain get a Method each."""
    result = fab.gpu_result()
    extra = []
    for cell in result.cells:
        engine = cell.params.get("engine")
        cell.params["engine_type"] = engine
        if engine == "dflash" and cell.params.get("budget") == 22:
            chain = cell.model_copy(deep=True)
            chain.id = cell.id.replace("dflash", "dflash-chain")
            chain.params["engine"] = "dflash-chain"
            extra.append(chain)
        if engine == "dflash" and cell.params.get("budget") == 22 and cell.params.get("suite") != "humaneval":
            for budget in (15, 30, 40):  # every swept budget in every suite: a tie
                other = cell.model_copy(deep=True)
                other.id = cell.id.replace("b22", f"b{budget}")
                other.params["budget"] = budget
                extra.append(other)
    result.cells += extra
    t = T.speculative_table(C.collect([result]))
    assert t is not None and "DDTree budget 22" in t.notes
    assert t.headers[:3] == ["Benchmark", "Method", "AR ar (tok/s)"]
    assert {(r[0], r[1]) for r in t.rows} == {(s, e) for s in ("gsm8k", "humaneval", "math500")
                                             for e in ("dflash", "dflash-chain")}
    assert all(r[2] != "n/a" for r in t.rows)


def test_forced_acceptance_is_marked_and_kept_out_of_acceptance(fab):
    """A forced-acceptance cell (dflash --force-accept-length) shows its AL marked 'forced' with the note, stays
    out of the acceptance table, and gets no token agreement against AR."""
    from lucebench.runner.checks import token_match

    result = fab.gpu_result()
    forced = next(c for c in result.cells if c.params.get("engine") == "dflash" and c.params.get("budget") == 22
                  and c.params.get("suite") == "humaneval")
    for s in forced.samples:
        s.spec.forced_acceptance_length = 8.31
    views = C.collect([result])
    t = T.speculative_table(views)
    row = next(r for r in t.rows if r[0] == "humaneval")
    assert row[3].endswith(" forced") and T.FORCED_NOTE in t.notes
    assert all(not r[3].endswith("forced") for r in t.rows if r[0] != "humaneval")
    acc = T.acceptance_table(views)
    assert not any(r[1] == "humaneval" and r[2] == "22" for r in acc.rows)
    ar = next(c for c in result.cells if c.params.get("engine") == "ar" and c.params.get("suite") == "humaneval")
    assert token_match(forced, ar) is None


def test_speculative_table_against_ar_and_llamacpp(fab):
    """With llama.cpp run on the same prompts as `ar`, the DFlash row shows both AR rates and a speedup against
    each: the run's baseline first, the other as a ratio of medians; neither AR cell repeats below."""
    result = fab.gpu_result()
    ar = next(c for c in result.cells if c.params.get("engine") == "ar" and c.params.get("suite") == "humaneval")
    llama = ar.model_copy(deep=True)
    llama.id = ar.id.replace("ar/", "llama.cpp-gguf/", 1)
    llama.params["engine"] = "llama.cpp-gguf"
    for s in llama.samples:  # half of ar's decode rate: the DFlash speedup against it doubles
        s.decode_s *= 2
    llama.metrics = fab.derive_metrics(llama.samples)
    result.cells.append(llama)
    views = C.collect([result])
    t = T.speculative_table(views)
    assert t.headers[:6] == ["Benchmark", "AR ar (tok/s)", "AR llama.cpp-gguf (tok/s)", "dflash (tok/s)", "AL",
                             "Speedup vs ar"]
    assert t.headers[6] == "Speedup vs llama.cpp-gguf"
    row = next(r for r in t.rows if r[0] == "humaneval")
    vs_ar, vs_llama = float(row[5].split("x")[0].split()[0]), float(row[6].split("x")[0])
    assert abs(vs_llama / vs_ar - 2.0) < 0.05 and row[6].endswith("(ratio of medians)")
    gsm = next(r for r in t.rows if r[0] == "gsm8k")
    assert gsm[2] == "n/a" and gsm[6] == "n/a"  # llama.cpp ran HumanEval only
    ds = T.dataset_table(views)
    assert ds is None or not any("llama.cpp-gguf" in r for r in ds.rows)


def test_budget_sweep_speedup_against_each_ar_engine(fab):
    """The sweep's speedup column is against the baseline; with llama.cpp on the same prompts, one more."""
    result = fab.gpu_result()
    ar = next(c for c in result.cells if c.params.get("engine") == "ar" and c.params.get("suite") == "humaneval")
    llama = ar.model_copy(deep=True)
    llama.id = ar.id.replace("ar/", "llama.cpp-gguf/", 1)
    llama.params["engine"] = "llama.cpp-gguf"
    result.cells.append(llama)
    sweep = T.budget_sweep_table(C.collect([result]))
    assert sweep.headers[-3:] == ["Speedup vs ar", "Speedup vs llama.cpp-gguf", ""]
    for row in sweep.rows:  # the same decode rate as ar: the same speedup, as a ratio of medians
        assert row[-2].endswith("(ratio of medians)")
        assert abs(float(row[-2].split("x")[0]) - float(row[-3].split("x")[0].split()[0])) < 0.02


def test_speedup_metric_only_under_the_baseline_column(fab):
    """The run's speedup metric is against its baseline engine: it is shown under that engine's column even when
    the first speculative row has no baseline partner (llama.cpp alone on HumanEval), never under another's."""
    from lucebench.results.schema import MetricSummary

    result = fab.gpu_result()
    result.config.content = {**result.config.content, "baseline": "ar"}
    ar = next(c for c in result.cells if c.params.get("engine") == "ar" and c.params.get("suite") == "humaneval")
    llama = ar.model_copy(deep=True)
    llama.id = ar.id.replace("ar/", "llama.cpp-gguf/", 1)
    llama.params["engine"] = "llama.cpp-gguf"
    result.cells = [c for c in result.cells if c is not ar] + [llama]
    gsm = next(c for c in result.cells if c.params.get("engine") == "dflash" and c.params.get("suite") == "gsm8k")
    gsm.metrics["speedup_decode"] = MetricSummary(unit="x", n=1, median=9.87, mean=9.87, stddev=0.0, min=9.87,
                                                  max=9.87, samples=[9.87])
    t = T.speculative_table(C.collect([result]))
    assert t.headers[1:3] == ["AR ar (tok/s)", "AR llama.cpp-gguf (tok/s)"]
    assert t.headers[5:7] == ["Speedup vs ar", "Speedup vs llama.cpp-gguf"]
    he = next(r for r in t.rows if r[0] == "humaneval")
    assert he[5] == "n/a" and he[6].endswith("(ratio of medians)")
    g = next(r for r in t.rows if r[0] == "gsm8k")
    assert "9.87" in g[5] and g[6] == "n/a"
