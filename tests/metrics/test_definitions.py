import math

from lucebench.metrics import compute_cell_metrics, compute_speedups, summarize
from lucebench.results.schema import Cell, PhaseEnergy, Sample


def _sample(rep=0, n_prompt=100, n_gen=11, prefill_s=0.1, decode_s=0.5, energy=None, **kw):
    return Sample(rep=rep, prompt_id="p", n_prompt=n_prompt, n_gen=n_gen, decode_steps=n_gen - 1, prefill_s=prefill_s,
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
