"""The report leads with the result: one workload per plot panel, labels in words, the speedup's baseline named,
token agreement shown, caveats (noisy, busy machine, failed) after the results, power-plot titles that fit."""

from __future__ import annotations

import numpy as np

from lucebench.reports import cells as C
from lucebench.reports import plots as P
from lucebench.reports import tables as T
from lucebench.reports.build import build_report
from lucebench.results.schema import CellError, CpuLoad, MetricSummary


def _run(fab):
    """A cpu-smoke-like run: ar, hf (baseline) and llama.cpp on pp64 and tg32; llama.cpp's pp64 failed."""
    rng = np.random.default_rng(0)
    cells = []
    for engine, kv in (("ar", "bf16"), ("hf", None), ("llama.cpp", "f16")):
        for suite, n_prompt, n_gen in (("pp64", 64, 1), ("tg32", 1, 33)):
            params = {"engine": engine, "model": "tiny", "suite": suite}
            if kv:
                params |= {"kv_k": kv, "kv_v": kv}
            cells.append(fab.make_cell(rng, params, n_prompt=n_prompt, n_gen=n_gen, prefill_tok_s=1000.0,
                                       decode_tok_s=50.0, power_w=None, reps=3, cov=0.02, backend="cpu"))
    failed = next(c for c in cells if c.params["engine"] == "llama.cpp" and c.params["suite"] == "pp64")
    failed.status, failed.metrics = "failed", {}
    failed.error = CellError(kind="timeout", message="cell timeout (300 s) reached")
    for c in cells:
        if c.params["engine"] != "hf" and c.status == "ok":
            c.metrics["speedup_decode"] = MetricSummary(unit="x", n=1, median=1.5, mean=1.5, stddev=None, min=1.5,
                                                        max=1.5)
            c.metrics["token_match_pct"] = MetricSummary(unit="%", n=1, median=100.0, mean=100.0, stddev=None,
                                                         min=100.0, max=100.0)
    result = fab.cpu_result()
    result.cells = cells
    result.config.content = {"name": "cpu-smoke", "baseline": "hf"}
    return result


def test_a_plot_panel_never_mixes_workloads(fab):
    panels = {metric: (workload, bars) for metric, _, workload, bars in P.throughput_panels(C.collect([_run(fab)]))}
    workload, bars = panels["prefill_tok_s"]
    assert workload == "pp64" and {v.suite for v in bars.values()} == {"pp64"}
    assert not any(label.startswith("llama.cpp") for label in bars)  # its pp64 failed: no tg32 bar in its place
    assert panels["decode_tok_s"][0] == "tg32"


def test_labels_say_engine_and_kv_type_in_words(fab):
    _, _, _, bars = P.throughput_panels(C.collect([_run(fab)]))[1]
    assert sorted(bars) == ["ar, KV bf16", "hf", "llama.cpp, KV f16"]


def test_power_plot_titles_fit(fab):
    r = fab.gpu_result()
    for v in C.collect([r]):
        if "power_limit_w" in v.cell.params and v.engine == "megakernel":
            title = P.timeline_title(v)
            assert len(title) <= 60 and "power limit" in title and "=" not in title


def test_speedup_baseline_named_and_token_agreement_shown(fab):
    table = T.throughput_table(C.collect([_run(fab)]))
    assert any(h.startswith("Decode speedup vs hf") for h in table.headers)
    assert any(h.startswith("Token agreement vs hf") for h in table.headers)
    assert table.headers[:2] == ["Method", "KV cache"]  # one setting in words, not "KV K | KV V"
    assert [row[1] for row in table.rows] == ["bf16", "-", "f16"]
    ar = next(row for row in table.rows if row[0] == "ar")
    assert any(cell.startswith("100") for cell in ar)
    assert any("baseline engine's (hf)" in n for n in table.notes)


def test_results_lead_and_caveats_follow(fab, tmp_path):
    r = _run(fab)
    ok = next(c for c in r.cells if c.status == "ok" and c.params["suite"] == "tg32")
    ok.metrics["decode_tok_s"].noisy = True
    ok.cpu_load = CpuLoad(cpu_count=2, window_s=1.0, other_cores=1.5, other_fraction=0.75, contaminated=True,
                          other_processes=["pid 7 cc1plus: 1.50 cores"])
    md = build_report([r], tmp_path).markdown.read_text()
    order = [md.index(h) for h in ("## Throughput and energy", "## Plots", "## Noisy measurements",
                                   "## Cells measured on a busy machine", "## Failed and skipped cells",
                                   "## Environment")]
    assert order == sorted(order)
    assert "cc1plus" in md
