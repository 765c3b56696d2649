"""What reports and comparisons need to know about each metric: direction, label, display precision.

The metrics themselves are computed in lucebench.metrics; this module only describes how to read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucebench.metrics.definitions import all_definitions

# Smaller is better for latencies, energies, power and memory; larger for everything else.
LOWER_IS_BETTER: frozenset[str] = frozenset({
    "ttft_ms", "tpot_ms", "e2e_ms", "prefill_j", "decode_j", "prefill_j_net", "decode_j_net",
    "avg_power_w", "peak_mem_bytes", "kept_tokens_target", "kept_pct",
    "spec_draft_ms", "spec_tree_ms", "spec_verify_ms", "spec_commit_ms",
    "prefill_score_ms", "prefill_select_ms", "prefill_bridge_ms", "prefill_target_prefill_ms",
})

# Metrics shown in comparisons but never gating: drawing more power is not a regression by itself
# (a faster kernel may draw more); tok/J captures the efficiency question.
INFORMATIONAL: frozenset[str] = frozenset({"avg_power_w"})


# Metrics measured against a per-run reference reading, which `lucebench compare` checks before gating them:
# net energies subtract the idle power measured at the run's start, and the roofline divides by the copy bandwidth
# measured there. Both readings vary between cards of one model and with what the card did just before.
NET_OF_IDLE: frozenset[str] = frozenset(d.name for d in all_definitions() if d.name.endswith("_net"))
BANDWIDTH_RELATIVE: frozenset[str] = frozenset({"roofline_pct"})


@dataclass(frozen=True)
class MetricInfo:
    """Display facts of one metric."""

    label: str
    unit: str
    digits: int


_INFO: dict[str, MetricInfo] = {
    "prefill_tok_s": MetricInfo("prefill tok/s", "tok/s", 0),
    "decode_tok_s": MetricInfo("decode tok/s", "tok/s", 1),
    "ttft_ms": MetricInfo("TTFT", "ms", 1),
    "tpot_ms": MetricInfo("TPOT", "ms", 2),
    "e2e_ms": MetricInfo("E2E", "ms", 1),
    "acceptance_length": MetricInfo("AL", "tok/step", 2),
    "prefill_j": MetricInfo("prefill energy", "J", 2),
    "decode_j": MetricInfo("decode energy", "J", 2),
    "prefill_j_net": MetricInfo("prefill energy (net)", "J", 2),
    "decode_j_net": MetricInfo("decode energy (net)", "J", 2),
    "prefill_tok_per_j": MetricInfo("prefill tok/J", "tok/J", 1),
    "decode_tok_per_j": MetricInfo("decode tok/J", "tok/J", 2),
    "total_tok_per_j": MetricInfo("total tok/J", "tok/J", 2),
    "prefill_tok_per_j_net": MetricInfo("prefill tok/J (net)", "tok/J", 1),
    "decode_tok_per_j_net": MetricInfo("decode tok/J (net)", "tok/J", 2),
    "total_tok_per_j_net": MetricInfo("total tok/J (net)", "tok/J", 2),
    "avg_power_w": MetricInfo("avg power", "W", 0),
    "peak_mem_bytes": MetricInfo("peak memory", "B", 0),
    "roofline_pct": MetricInfo("% of roofline", "%", 1),
    "speedup_decode": MetricInfo("decode speedup", "x", 2),
    "speedup_ttft": MetricInfo("TTFT speedup", "x", 2),
    "speedup_combined": MetricInfo("combined speedup", "x", 2),
    "accuracy": MetricInfo("accuracy", "%", 1),
    "token_match_pct": MetricInfo("token match", "%", 1),
    "effective_prefill_tok_s": MetricInfo("effective prefill tok/s", "tok/s", 0),
    "kept_tokens_target": MetricInfo("tokens kept (target)", "tok", 0),
    "kept_pct": MetricInfo("kept", "%", 2),
    "needle_retention_pct": MetricInfo("needle retention", "%", 1),
    "spec_draft_ms": MetricInfo("draft per round", "ms", 3),
    "spec_tree_ms": MetricInfo("tree per round", "ms", 3),
    "spec_verify_ms": MetricInfo("verify per round", "ms", 3),
    "spec_commit_ms": MetricInfo("commit per round", "ms", 3),
    "prefill_score_ms": MetricInfo("drafter scoring", "ms", 1),
    "prefill_select_ms": MetricInfo("selection", "ms", 1),
    "prefill_bridge_ms": MetricInfo("tokenizer bridge", "ms", 1),
    "prefill_target_prefill_ms": MetricInfo("target prefill", "ms", 1),
}


def info(name: str) -> MetricInfo:
    """Display facts of `name`; unknown metrics get a generic entry rather than an error."""
    return _INFO.get(name, MetricInfo(name, "", 3))


def higher_is_better(name: str) -> bool:
    """True when a larger value of metric `name` is an improvement."""
    return name not in LOWER_IS_BETTER
