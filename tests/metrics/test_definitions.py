import math

from lucebench.metrics import compute_cell_metrics, compute_speedups, summarize
from lucebench.results.schema import Cell, PhaseEnergy, Sample


def _sample(rep=0, n_prompt=100, n_gen=11, prefill_s=0.1, decode_s=0.5, energy=None, prompt_id="p", **kw):
    return Sample(rep=rep, prompt_id=prompt_id, n_prompt=n_prompt, n_gen=n_gen, decode_steps=n_gen - 1, prefill_s=prefill_s,
                  decode_s=decode_s, e2e_s=prefill_s + decode_s, t_prefill_start_ns=0, t_prefill_end_ns=1,
                  t_decode_start_ns=1, t_decode_end_ns=2, energy=energy or {}, **kw)


def test_throughput_definitions():
    m = compute_cell_metrics([_sample()])
    assert m["prefill_tok_s"].median == 1000.0  # 100 prompt tokens in 0.1 s
    assert m["decode_tok_s"].median == 20.0  # 10 decode tokens (first excluded) in 0.5 s
    assert m["ttft_ms"].median == 100.0
    assert m["tpot_ms"].median == 50.0
    assert "prefill_j" not in m  # no energy measured: absent, never 0


def test_energy_per_sample_and_tok_per_j():
    e = {"prefill": PhaseEnergy(window_s=0.1, energy_j=20.0, energy_net_j=10.0, avg_power_w=200.0, method="counter"),
         "decode": PhaseEnergy(window_s=0.5, energy_j=50.0, energy_net_j=25.0, avg_power_w=100.0, method="counter")}
    m = compute_cell_metrics([_sample(energy=e)])
    assert m["prefill_tok_per_j"].median == 5.0
    assert m["decode_tok_per_j"].median == 0.2
    assert m["decode_tok_per_j_net"].median == 0.4
    assert math.isclose(m["total_tok_per_j"].median, 11 / 70)
    assert m["avg_power_w"].median == 100.0


def test_aggregate_energy_used_when_windows_too_short():
    totals = {"decode": PhaseEnergy(window_s=2.5, energy_j=500.0, energy_net_j=250.0, avg_power_w=200.0,
                                    method="counter")}
    m = compute_cell_metrics([_sample(rep=i) for i in range(5)], phase_totals=totals)
    assert m["decode_tok_per_j"].median == 50 / 500.0
    assert "aggregate" in m["decode_tok_per_j"].note


def test_roofline_and_acceptance():
    m = compute_cell_metrics([_sample(bytes_per_token=1e9, draft_steps=4, accepted_tokens=10)],
                             memory_bandwidth_bytes_s=40e9)
    assert m["roofline_pct"].median == 50.0  # 1 GB/token x 20 tok/s over 40 GB/s
    assert m["acceptance_length"].median == 2.5


def test_summary_spread_and_noisy_flag():
    s = summarize([10, 10, 10, 13], "tok/s", noisy_cov=0.05)
    assert s.median == 10 and s.max == 13 and s.noisy
    assert not summarize([10, 10.1, 9.9], "tok/s").noisy
    empty = summarize([None, float("nan")], "J")
    assert empty.n == 0 and empty.median is None


def test_speedups_geometric_mean():
    def cell(cid, decode, ttft):
        return Cell(id=cid, params={}, status="ok", metrics={"decode_tok_s": summarize([decode], "tok/s"),
                                                            "ttft_ms": summarize([ttft], "ms")})
    s = compute_speedups(cell("fast", 400, 10), cell("base", 100, 40))
    assert s["speedup_decode"].median == 4.0 and s["speedup_ttft"].median == 4.0
    assert math.isclose(s["speedup_combined"].median, 4.0)
    assert "vs base" in s["speedup_combined"].note


def test_multi_prompt_suites_pool_each_repetition():
    def s(rep, pid, n_gen, decode_s, prefill_s):
        return Sample(rep=rep, prompt_id=pid, n_prompt=10, n_gen=n_gen, decode_steps=n_gen - 1, prefill_s=prefill_s,
                      decode_s=decode_s, e2e_s=prefill_s + decode_s, t_prefill_start_ns=0, t_prefill_end_ns=1,
                      t_decode_start_ns=1, t_decode_end_ns=2)
    samples = [s(0, "a", 11, 1.0, 0.1), s(0, "b", 31, 1.0, 0.3), s(1, "a", 11, 1.0, 0.1), s(1, "b", 31, 1.0, 0.3)]
    m = compute_cell_metrics(samples)
    assert m["decode_tok_s"].n == 2  # one value per pass over the prompts, not per prompt
    assert m["decode_tok_s"].median == 20.0  # (10 + 30) tokens / 2 s
    assert not m["decode_tok_s"].noisy
    assert math.isclose(m["ttft_ms"].median, 200.0)  # latencies: mean over the pass's prompts
    assert m["prefill_tok_s"].median == 50.0  # 20 tokens / 0.4 s


# ---------------------------------------------------------------------------------------------- speculative
def _spec(hist: list[int], depth: int = 15, **time_ms: float):
    """SpecStats from an AL histogram ([k]: rounds committing k tokens): the counts it implies."""
    from lucebench.results.schema import SpecStats

    return SpecStats(draft_steps=sum(hist), accepted_tokens=sum(k * n for k, n in enumerate(hist)),
                     accepted_per_depth=[sum(hist[d + 1:]) for d in range(1, depth + 1)], al_histogram=hist,
                     time_ms=time_ms)


def test_acceptance_length_per_depth_and_histogram_from_spec():
    from lucebench.metrics import acceptance_per_depth, al_histogram

    # Two prompts, one repetition: rounds committing 1, 3, 3 and 16 tokens; then 2 and 2.
    a = _sample(prompt_id="a", n_gen=24, spec=_spec([0, 1, 0, 2] + [0] * 12 + [1], draft=3.0, verify=6.0))
    b = _sample(prompt_id="b", n_gen=5, spec=_spec([0, 0, 2], draft=1.0, verify=2.0))
    m = compute_cell_metrics([a, b])
    assert m["acceptance_length"].median == (1 + 3 + 3 + 16 + 2 + 2) / 6  # pooled: tokens / rounds
    assert m["spec_verify_ms"].median == 8.0 / 6 and m["spec_draft_ms"].median == 4.0 / 6
    assert "spec_tree_ms" not in m
    per_depth = acceptance_per_depth([a, b])
    assert per_depth[:3] == [5 / 6, 3 / 6, 1 / 6] and per_depth[14] == 1 / 6 and len(per_depth) == 15
    cond = acceptance_per_depth([a, b], conditional=True)
    assert cond[:3] == [5 / 6, 3 / 5, 1 / 3] and cond[3] == 1.0
    assert al_histogram([a, b]) == [0, 1, 2, 2] + [0] * 12 + [1]
    assert acceptance_per_depth([_sample()]) is None and al_histogram([_sample()]) is None


def test_spec_counts_that_disagree_are_found():
    from lucebench.results.schema import SpecStats

    assert _spec([0, 1, 0, 2]).problems() == []
    assert any("al_histogram commits" in p for p in
               SpecStats(draft_steps=3, accepted_tokens=8, al_histogram=[0, 1, 0, 2]).problems())
    assert any("disagrees" in p for p in
               SpecStats(draft_steps=3, accepted_tokens=7, al_histogram=[0, 1, 0, 2],
                         accepted_per_depth=[2, 1]).problems())
    assert any("at least one token" in p for p in SpecStats(draft_steps=3, accepted_tokens=2).problems())
    assert any("unknown time_ms" in p for p in SpecStats(draft_steps=1, accepted_tokens=1,
                                                         time_ms={"drafting": 1.0}).problems())


def test_compressed_prefill_metrics():
    from lucebench.results.schema import PrefillStats

    def pre(prompt, kept, needles, **t):
        return PrefillStats(prompt_tokens=prompt, drafter_prompt_tokens=prompt + 7, kept_tokens_drafter=kept - 3,
                            kept_tokens_target=kept, needles_kept=needles, time_ms=t)

    a = _sample(prompt_id="a", n_prompt=1000, prefill_s=0.5,
                prefill=pre(1000, 50, [True, False], score=300.0, target_prefill=100.0))
    b = _sample(prompt_id="b", n_prompt=3000, prefill_s=1.5,
                prefill=pre(3000, 150, [True, True], score=900.0, target_prefill=200.0))
    m = compute_cell_metrics([a, b])
    assert m["effective_prefill_tok_s"].median == 4000 / 2.0  # pooled: prompt tokens / TTFT
    assert m["kept_pct"].median == 5.0 and m["kept_tokens_target"].median == 100  # per request, as TTFT
    assert m["needle_retention_pct"].median == 75.0
    assert m["prefill_score_ms"].median == 600.0  # mean over prompts, as TTFT
    assert "effective_prefill_tok_s" not in compute_cell_metrics([_sample()])


def test_every_new_metric_is_defined_once_with_a_unit():
    from lucebench.metrics import all_definitions, definition

    names = [d.name for d in all_definitions()]
    assert len(names) == len(set(names))
    for name in ("acceptance_length", "acceptance_per_depth", "al_histogram", "effective_prefill_tok_s", "kept_pct",
                 "needle_retention_pct", "spec_verify_ms", "prefill_bridge_ms"):
        assert definition(name).unit and name in names
