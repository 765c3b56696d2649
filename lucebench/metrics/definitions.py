"""Every derived metric, defined once. docs/metrics.md is the prose twin of this file.

Per-sample metrics are computed from one measured request (a `Sample`) and summarised over the
repetitions (median, spread). Energy metrics come from the phase windows that the engine reported on
the CLOCK_MONOTONIC clock, cut from the NVML samples: per sample when each window is long enough for
the energy counter, otherwise once over the sum of all the phase's windows (the runner extends the run
by repetition until that sum is long enough). Cross-cell metrics (speedups) compare a cell with its
baseline cell.

Bump METRICS_VERSION whenever a definition changes meaning; results record it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lucebench.measure.energy import combine
from lucebench.measure.energy import gross_j as energy_gross_j
from lucebench.measure.records import energy_result, phase_energy
from lucebench.metrics.stats import DEFAULT_NOISY_COV, geometric_mean, summarize
from lucebench.results.schema import (
    PREFILL_STAGES,
    SPEC_STAGES,
    Cell,
    MetricSummary,
    PhaseEnergy,
    PrefillStats,
    Sample,
    SpecStats,
)

METRICS_VERSION = "1"

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class MetricDef:
    name: str
    unit: str
    higher_is_better: bool
    description: str


def _decode_tokens(s: Sample) -> int:
    """Tokens produced by the decode phase: the first generated token comes out of prefill."""
    pooled = getattr(s, "decode_tokens", None)
    return pooled if pooled is not None else max(s.n_gen - 1, 0)


# Latency-like metrics are averaged over a pass's prompts; everything else is recomputed on the pooled
# pass (total tokens / total time or energy), which weights prompts by their work.
_MEAN_OVER_PROMPTS = ({"ttft_ms", "tpot_ms", "e2e_ms", "kept_tokens_target"}
                      | {f"prefill_{stage}_ms" for stage in PREFILL_STAGES})


@dataclass
class _PooledPass:
    """One repetition over several prompts, summed: the unit of repetition for dataset suites."""

    n_prompt: int
    n_gen: int
    decode_tokens: int
    prefill_s: float
    decode_s: float
    e2e_s: float
    bytes_per_token: float | None
    peak_mem_bytes: int | None
    draft_steps: int | None
    accepted_tokens: int | None
    spec: SpecStats | None
    prefill: PrefillStats | None
    energy: dict[str, PhaseEnergy]


def _sum_or_none(values: list) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values)


def _pool(group: list[Sample]) -> _PooledPass:
    energy: dict[str, PhaseEnergy] = {}
    for phase in PHASES:
        parts = [s.energy[phase] for s in group if phase in s.energy]
        if parts and len(parts) == len([s for s in group if phase != "decode" or _decode_tokens(s)]):
            # The windows' own net energies are summed (idle_w None): each was taken against its cell's idle power.
            energy[phase] = phase_energy(combine([energy_result(p) for p in parts], idle_w=None))
    bpt = [s.bytes_per_token for s in group if s.bytes_per_token]
    return _PooledPass(
        n_prompt=sum(s.n_prompt for s in group), n_gen=sum(s.n_gen for s in group),
        decode_tokens=sum(_decode_tokens(s) for s in group), prefill_s=sum(s.prefill_s for s in group),
        decode_s=sum(s.decode_s for s in group), e2e_s=sum(s.e2e_s for s in group),
        bytes_per_token=sum(bpt) / len(bpt) if bpt else None,
        peak_mem_bytes=max((s.peak_mem_bytes for s in group if s.peak_mem_bytes is not None), default=None),
        draft_steps=_sum_or_none([s.draft_steps for s in group]),
        accepted_tokens=_sum_or_none([s.accepted_tokens for s in group]),
        spec=pool_spec([s.spec for s in group]), prefill=pool_prefill([s.prefill for s in group]), energy=energy)


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def pool_spec(stats: list[SpecStats | None]) -> SpecStats | None:
    """Several requests' speculative counts as one: counts, histograms and stage times summed.
    None unless every request reported them (a partial sum would misstate the rate)."""
    if not stats or any(s is None for s in stats):
        return None
    out = SpecStats(draft_steps=0, accepted_tokens=0)
    for s in stats:
        assert s is not None
        out.draft_steps += s.draft_steps
        out.accepted_tokens += s.accepted_tokens
        out.accepted_per_depth = _add_lists(out.accepted_per_depth, s.accepted_per_depth)
        out.al_histogram = _add_lists(out.al_histogram, s.al_histogram)
        for k, v in s.time_ms.items():
            out.time_ms[k] = out.time_ms.get(k, 0.0) + v
        if s.forced_acceptance_length is not None:  # one forced request marks the pool as forced
            out.forced_acceptance_length = s.forced_acceptance_length
    out.acceptance_length = _ratio(out.accepted_tokens, out.draft_steps)
    return out


def pool_prefill(stats: list[PrefillStats | None]) -> PrefillStats | None:
    """Several requests' compressed-prefill counts as one (tokens and stage times summed, the drafter's
    attention read share averaged, needle flags concatenated); None unless every request reported them."""
    if not stats or any(s is None for s in stats):
        return None
    parts = [s for s in stats if s is not None]

    def total(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    times: dict[str, float] = {}
    for s in parts:
        for k, v in s.time_ms.items():
            times[k] = times.get(k, 0.0) + v
    needles = [s.needles_kept for s in parts]
    depths = [s.needle_depths for s in parts]
    return PrefillStats(
        prompt_tokens=sum(s.prompt_tokens for s in parts),
        compressed=None if any(s.compressed is None for s in parts) else all(s.compressed for s in parts),
        drafter_prompt_tokens=total([s.drafter_prompt_tokens for s in parts]),
        kept_tokens_drafter=total([s.kept_tokens_drafter for s in parts]),
        kept_tokens_target=sum(s.kept_tokens_target for s in parts), time_ms=times,
        drafter_forward_ms=None if any(s.drafter_forward_ms is None for s in parts)
        else sum(s.drafter_forward_ms or 0.0 for s in parts),
        drafter_attention_read=None if any(s.drafter_attention_read is None for s in parts)
        else sum(s.drafter_attention_read or 0.0 for s in parts) / len(parts),
        needles_kept=None if any(n is None for n in needles) else [k for n in needles for k in (n or [])],
        needle_depths=None if any(d is None for d in depths) else [x for d in depths for x in (d or [])])


def _values(samples: list[Sample], name: str, fn: Callable) -> list[float | None]:
    """One value per repetition: the sample itself for one-prompt suites, the pooled pass otherwise."""
    if len({s.prompt_id for s in samples}) <= 1:
        return [fn(s) for s in samples]
    by_rep: dict[int, list[Sample]] = {}
    for s in samples:
        by_rep.setdefault(s.rep, []).append(s)
    out: list[float | None] = []
    for group in by_rep.values():
        if name in _MEAN_OVER_PROMPTS:
            vals = [v for v in (fn(s) for s in group) if v is not None]
            out.append(sum(vals) / len(vals) if vals else None)
        else:
            out.append(fn(_pool(group)))
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def gross_j(e: PhaseEnergy) -> float | None:
    """The measured gross energy: the counter's, or the power integral on GPUs without a counter."""
    return energy_gross_j(e)


def _phase_j(s: Sample, phase: str, net: bool) -> float | None:
    e = s.energy.get(phase)
    if e is None:
        return None
    return e.energy_net_j if net else gross_j(e)


# name -> (definition, per-sample function or None for cross-cell metrics)
_SAMPLE_METRICS: dict[str, tuple[MetricDef, Callable[[Sample], float | None]]] = {}
_CROSS_METRICS: dict[str, MetricDef] = {}


def _sample_metric(name: str, unit: str, higher: bool, description: str):
    def register(fn: Callable[[Sample], float | None]) -> Callable[[Sample], float | None]:
        _SAMPLE_METRICS[name] = (MetricDef(name, unit, higher, description), fn)
        return fn
    return register


@_sample_metric("prefill_tok_s", "tok/s", True, "prompt tokens / prefill time (prefill ends when the first token is known)")
def _prefill_tok_s(s: Sample) -> float | None:
    return _ratio(s.n_prompt, s.prefill_s)


@_sample_metric("decode_tok_s", "tok/s", True, "(generated tokens - 1) / decode time; the first token is excluded")
def _decode_tok_s(s: Sample) -> float | None:
    return _ratio(_decode_tokens(s), s.decode_s) if _decode_tokens(s) else None


@_sample_metric("ttft_ms", "ms", False, "time to first token: the engine-timed prefill phase")
def _ttft_ms(s: Sample) -> float | None:
    return s.prefill_s * 1e3


@_sample_metric("tpot_ms", "ms", False, "time per output token after the first = decode time / (n_gen - 1)")
def _tpot_ms(s: Sample) -> float | None:
    return _ratio(s.decode_s * 1e3, _decode_tokens(s))


@_sample_metric("e2e_ms", "ms", False, "harness wall time from request sent to reply parsed")
def _e2e_ms(s: Sample) -> float | None:
    return s.e2e_s * 1e3


@_sample_metric("acceptance_length", "tok/step", True,
                "speculative engines: committed tokens (bonus included) per draft+verify step")
def _acceptance_length(s: Sample) -> float | None:
    if s.accepted_tokens is None and s.spec is not None:
        return _ratio(s.spec.accepted_tokens, s.spec.draft_steps)
    return _ratio(s.accepted_tokens, s.draft_steps)


for _stage in SPEC_STAGES:
    def _spec_stage(s: Sample, stage: str = _stage) -> float | None:
        if s.spec is None or stage not in s.spec.time_ms:
            return None
        return _ratio(s.spec.time_ms[stage], s.spec.draft_steps)

    _sample_metric(f"spec_{_stage}_ms", "ms", False,
                   f"speculative engines: {_stage} time per draft+verify round")(_spec_stage)


@_sample_metric("effective_prefill_tok_s", "tok/s", True,
                "compressed prefill: prompt tokens (before compression) / time to first token")
def _effective_prefill(s: Sample) -> float | None:
    return _ratio(s.prefill.prompt_tokens, s.prefill_s) if s.prefill is not None else None


@_sample_metric("kept_tokens_target", "tok", False,
                "compressed prefill: target tokens the target prefilled (mean over prompts)")
def _kept_target(s: Sample) -> float | None:
    return float(s.prefill.kept_tokens_target) if s.prefill is not None else None


@_sample_metric("kept_pct", "%", False, "compressed prefill: target tokens kept / prompt tokens x 100")
def _kept_pct(s: Sample) -> float | None:
    p = s.prefill
    return None if p is None else 100.0 * p.kept_tokens_target / p.prompt_tokens


@_sample_metric("needle_retention_pct", "%", True,
                "compressed prefill: needles whose every token lies in the kept prompt / needles x 100")
def _needle_retention(s: Sample) -> float | None:
    kept = s.prefill.needles_kept if s.prefill is not None else None
    return 100.0 * sum(kept) / len(kept) if kept else None


for _stage in PREFILL_STAGES:
    def _prefill_stage(s: Sample, stage: str = _stage) -> float | None:
        return s.prefill.time_ms.get(stage) if s.prefill is not None else None

    _sample_metric(f"prefill_{_stage}_ms", "ms", False, f"compressed prefill: the {_stage} part of the TTFT")(
        _prefill_stage)


@_sample_metric("peak_mem_bytes", "B", False, "peak device memory of the engine process")
def _peak_mem(s: Sample) -> float | None:
    return float(s.peak_mem_bytes) if s.peak_mem_bytes is not None else None


for _phase in PHASES:
    for _net in (False, True):
        _suffix = "_net" if _net else ""
        _kind = "net of idle power" if _net else "gross (counter)"

        def _j(s: Sample, phase: str = _phase, net: bool = _net) -> float | None:
            return _phase_j(s, phase, net)

        def _tpj(s: Sample, phase: str = _phase, net: bool = _net) -> float | None:
            tokens = s.n_prompt if phase == "prefill" else _decode_tokens(s)
            return _ratio(tokens, _phase_j(s, phase, net))

        _sample_metric(f"{_phase}_j{_suffix}", "J", False, f"energy of the {_phase} phase, {_kind}")(_j)
        _sample_metric(f"{_phase}_tok_per_j{_suffix}", "tok/J", True,
                       f"{'prompt' if _phase == 'prefill' else 'decode'} tokens / {_phase} energy, {_kind}")(_tpj)


def _total_tpj(s: Sample, net: bool) -> float | None:
    pre, dec = _phase_j(s, "prefill", net), _phase_j(s, "decode", net)
    if pre is None or (dec is None and _decode_tokens(s)):
        return None
    return _ratio(s.n_gen, pre + (dec or 0.0))


_sample_metric("total_tok_per_j", "tok/J", True, "generated tokens / (prefill + decode energy), gross")(
    lambda s: _total_tpj(s, False))
_sample_metric("total_tok_per_j_net", "tok/J", True, "generated tokens / (prefill + decode energy), net of idle")(
    lambda s: _total_tpj(s, True))


@_sample_metric("avg_power_w", "W", False, "average board power over the decode windows (prefill where no decode)")
def _avg_power(s: Sample) -> float | None:
    e = s.energy.get("decode") if _decode_tokens(s) else s.energy.get("prefill")
    return e.avg_power_w if e else None


for _name, _unit, _desc in (
    ("roofline_pct", "%", "bytes moved per decode token x decode tok/s / measured memory bandwidth x 100"),
    ("speedup_decode", "x", "decode tok/s of the cell / decode tok/s of its baseline cell (medians)"),
    ("speedup_ttft", "x", "TTFT of the baseline cell / TTFT of the cell (medians)"),
    ("speedup_combined", "x", "geometric mean of speedup_ttft and speedup_decode where both exist"),
    ("accuracy", "%", "share of the suite's prompts whose first measured output scores correct (--score)"),
    ("token_match_pct", "%", "share of prompts whose output ids equal the baseline engine's exactly"),
):
    _CROSS_METRICS[_name] = MetricDef(_name, _unit, True, _desc)


# Speculative profiles: vectors over all of a cell's requests (pooled), computed by the functions below.
_PROFILE_METRICS: dict[str, MetricDef] = {d.name: d for d in (
    MetricDef("acceptance_per_depth", "fraction", True,
              "[d-1]: rounds whose draft token at depth d was accepted / rounds (all of the cell's requests)"),
    MetricDef("conditional_acceptance_per_depth", "fraction", True,
              "[d-1]: rounds accepting depth d / rounds accepting depth d-1 (depth 0: every round)"),
    MetricDef("al_histogram", "rounds", True, "[k]: rounds that committed exactly k tokens (bonus included)"),
)}


def acceptance_per_depth(samples: Iterable[Sample], *, conditional: bool = False) -> list[float] | None:
    """Acceptance at each draft depth, pooled over the samples; None without per-depth counts."""
    spec = pool_spec([s.spec for s in samples])
    if spec is None or not spec.draft_steps or not spec.accepted_per_depth:
        return None
    counts = spec.accepted_per_depth
    if not conditional:
        return [c / spec.draft_steps for c in counts]
    before = [spec.draft_steps, *counts[:-1]]
    return [c / b if b else 0.0 for c, b in zip(counts, before)]


def al_histogram(samples: Iterable[Sample]) -> list[int] | None:
    """How many rounds committed k tokens, k = 0.. (pooled); None without a histogram."""
    spec = pool_spec([s.spec for s in samples])
    return spec.al_histogram if spec is not None and spec.al_histogram else None


def all_definitions() -> list[MetricDef]:
    """Every metric lucebench derives, in report order."""
    return [d for d, _ in _SAMPLE_METRICS.values()] + list(_CROSS_METRICS.values()) + list(_PROFILE_METRICS.values())


def definition(name: str) -> MetricDef:
    if name in _SAMPLE_METRICS:
        return _SAMPLE_METRICS[name][0]
    return _CROSS_METRICS.get(name) or _PROFILE_METRICS[name]


def compute_cell_metrics(samples: Iterable[Sample], *, phase_totals: dict[str, PhaseEnergy] | None = None,
                         memory_bandwidth_bytes_s: float | None = None,
                         noisy_cov: float = DEFAULT_NOISY_COV) -> dict[str, MetricSummary]:
    """Summaries of every per-sample metric that has at least one value, plus the roofline figure.

    `phase_totals` holds one phase's energy summed over all its windows; it supplies the energy metrics
    when the windows were individually too short for per-sample energy (n == 1 then, with a note).
    """
    samples = list(samples)
    out: dict[str, MetricSummary] = {}
    for name, (d, fn) in _SAMPLE_METRICS.items():
        summary = summarize(_values(samples, name, fn), d.unit, noisy_cov=noisy_cov)
        if summary.n:
            out[name] = summary
    for name, summary in _aggregate_energy(samples, phase_totals or {}).items():
        out.setdefault(name, summary)
    if memory_bandwidth_bytes_s and "decode_tok_s" in out and any(s.bytes_per_token for s in samples):
        def roofline(s: Sample) -> float | None:
            if not s.bytes_per_token or _decode_tok_s(s) is None:
                return None
            return s.bytes_per_token * _decode_tok_s(s) * 100.0 / memory_bandwidth_bytes_s
        out["roofline_pct"] = summarize(_values(samples, "roofline_pct", roofline), "%", noisy_cov=noisy_cov,
                                        note=f"bandwidth {memory_bandwidth_bytes_s / 1e9:.0f} GB/s")
    return out


def _aggregate_energy(samples: list[Sample], totals: dict[str, PhaseEnergy]) -> dict[str, MetricSummary]:
    """Energy metrics from the phase totals: one value each, the note says it is an aggregate."""
    out: dict[str, MetricSummary] = {}
    tokens = {"prefill": sum(s.n_prompt for s in samples), "decode": sum(_decode_tokens(s) for s in samples)}
    for phase, total in totals.items():
        note = f"aggregate over {len(samples)} windows, {total.window_s:.2f} s"
        for net, suffix in ((False, ""), (True, "_net")):
            joules = total.energy_net_j if net else gross_j(total)
            if joules is None:
                continue
            out[f"{phase}_j{suffix}"] = summarize([joules / max(len(samples), 1)], "J", note=note + ", per request")
            if tokens[phase]:
                out[f"{phase}_tok_per_j{suffix}"] = summarize([tokens[phase] / joules], "tok/J", note=note)
        if total.avg_power_w is not None and (phase == "decode" or "decode" not in totals):
            out["avg_power_w"] = summarize([total.avg_power_w], "W", note=note)
    gross = [gross_j(totals[p]) for p in PHASES if p in totals]
    if gross and all(j is not None for j in gross) and (tokens["decode"] == 0 or "decode" in totals):
        out["total_tok_per_j"] = summarize([sum(s.n_gen for s in samples) / sum(gross)], "tok/J",
                                           note="aggregate over all windows")
    return out


def compute_speedups(cell: Cell, baseline: Cell) -> dict[str, MetricSummary]:
    """speedup_decode, speedup_ttft and speedup_combined of `cell` over `baseline` (ratios of medians)."""
    note = f"vs {baseline.id}"

    def med(c: Cell, name: str) -> float | None:
        m = c.metrics.get(name)
        return m.median if m else None

    out: dict[str, MetricSummary] = {}
    decode = _ratio(med(cell, "decode_tok_s"), med(baseline, "decode_tok_s"))
    ttft = _ratio(med(baseline, "ttft_ms"), med(cell, "ttft_ms"))
    if decode is not None:
        out["speedup_decode"] = summarize([decode], "x", note=note)
    if ttft is not None:
        out["speedup_ttft"] = summarize([ttft], "x", note=note)
    combined = geometric_mean([v for v in (decode, ttft) if v is not None])
    if combined is not None:
        out["speedup_combined"] = summarize([combined], "x", note=note + " (geometric mean of TTFT and decode)")
    return out
