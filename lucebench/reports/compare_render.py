"""Rendering of a Comparison: Markdown (for files and PR comments) and a rich table (for the terminal)."""

from __future__ import annotations

from rich.table import Table as RichTable

from lucebench.reports.compare import CellComparison, Comparison, MetricChange
from lucebench.reports.fmt import NA, fmt_pct, fmt_value

# Shown for every cell in the terminal; other metrics only when their status is not "unchanged".
HEADLINE = ("prefill_tok_s", "decode_tok_s", "ttft_ms", "decode_tok_per_j", "acceptance_length", "speedup_decode")
STATUS_MARK = {"regression": "❌ regression", "improvement": "✅ improvement", "inconclusive": "❔ inconclusive",
               "noisy": "⚠ noisy", "unchanged": "unchanged", "info": "info", "missing": "missing", "n/a": "n/a"}
HEADERS = ["Cell", "Metric", "Baseline", "Candidate", "Change", "95% CI", "p", "Threshold", "Status"]


def _row(cell: CellComparison, m: MetricChange) -> list[str]:
    ci = f"[{fmt_pct(m.ci_low)}, {fmt_pct(m.ci_high)}]" if m.ci_low is not None else NA
    p = f"{m.p_value:.3g}" if m.p_value is not None else NA
    return [cell.label, m.metric, f"{fmt_value(m.baseline, m.metric)} (n={m.n_baseline})",
            f"{fmt_value(m.candidate, m.metric)} (n={m.n_candidate})", fmt_pct(m.change), ci, p,
            f"{'-' if m.higher_is_better else '+'}{m.threshold * 100:g}%", STATUS_MARK.get(m.status, m.status)]


def rows(comp: Comparison, *, all_metrics: bool) -> list[list[str]]:
    """Table rows; with all_metrics False only headline metrics and anything not unchanged."""
    out = []
    for cell in comp.cells:
        if cell.status in ("failed", "both-failed"):
            status = "❌ newly failed" if cell.status == "failed" else "failed in both"
            out.append([cell.label, "(cell)", cell.baseline_status, cell.candidate_status, NA, NA, NA, NA,
                        f"{status}: {cell.note or ''}".strip(": ")])
            continue
        for m in cell.changes:
            if all_metrics or m.metric in HEADLINE or m.status not in ("unchanged", "n/a", "info"):
                out.append(_row(cell, m))
    return out


def summary_lines(comp: Comparison) -> list[str]:
    """Verdict and counts, first line is the verdict."""
    regs = comp.regressions()
    statuses = [m.status for c in comp.cells for m in c.changes]
    verdict = (f"REGRESSION: {len(regs)} failing item(s)" if regs else "no regression")
    lines = [verdict,
             f"baseline {comp.baseline_run} ({comp.baseline_hardware}) vs candidate {comp.candidate_run} "
             f"({comp.candidate_hardware}); {len(comp.cells)} matched cells; threshold "
             f"{comp.options.threshold_pct:g}%"
             + (", per metric " + ", ".join(f"{k}={v:g}%" for k, v in comp.options.metric_thresholds.items())
                if comp.options.metric_thresholds else ""),
             ", ".join(f"{s}: {statuses.count(s)}" for s in ("regression", "improvement", "inconclusive", "noisy")
                       if statuses.count(s))]
    changes = [m for c in comp.cells for m in c.changes if m.status not in ("info", "n/a", "missing")]
    few = [m for m in changes if m.too_few_samples]
    if few:
        counts = sorted({(m.n_baseline, m.n_candidate) for m in few})
        lines.append(f"warning: inconclusive: {len(few)} metric(s) changed beyond the threshold, but with "
                     f"{', '.join(f'{a} vs {b}' for a, b in counts)} samples the smallest p the test can give is "
                     f"{min(m.min_p or 1.0 for m in few):.3g}, not below alpha {comp.options.alpha:g}: run more "
                     "repetitions (measure.repetitions, at least 4 a side) for a verdict")
    powers = sorted(m.power for m in changes if m.power is not None)
    if powers:
        able = sum(p >= 0.8 for p in powers)
        lines.append(f"power: {able} of {len(powers)} metric(s) would flag a change of the threshold's size with "
                     f"probability >= 80% (median power {powers[len(powers) // 2]:.0%})")
    for text in comp.forced_mismatches:
        lines.append(f"forced despite: {text}")
    noted = [f"{c.label}: {c.note}" for c in comp.cells if c.note and c.status not in ("failed", "both-failed")]
    lines += noted[:10] + ([f"... and {len(noted) - 10} more cells with notes"] if len(noted) > 10 else [])
    if comp.only_in_baseline:
        lines.append(f"only in baseline ({len(comp.only_in_baseline)}): " + "; ".join(comp.only_in_baseline[:10]))
    if comp.only_in_candidate:
        lines.append(f"only in candidate ({len(comp.only_in_candidate)}): " + "; ".join(comp.only_in_candidate[:10]))
    return [x for x in lines if x]


def comparison_markdown(comp: Comparison, *, all_metrics: bool = True) -> str:
    """The comparison as Markdown: verdict, notes, and a table of every metric of every matched cell."""
    lines = ["# lucebench compare", ""]
    summary = summary_lines(comp)
    lines += [f"**{summary[0]}**", ""] + [f"- {x}" for x in summary[1:]] + [""]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "|".join("---" for _ in HEADERS) + "|")
    for r in rows(comp, all_metrics=all_metrics):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    lines += ["", ("_Change = median(candidate) / median(baseline) - 1, CI = 95% percentile bootstrap; a "
                   "regression needs the change and its whole CI beyond the threshold in the bad direction and a "
                   f"one-sided Mann-Whitney U p ≤ {comp.options.alpha:g}._"), ""]
    return "\n".join(lines)


def comparison_rich(comp: Comparison, *, all_metrics: bool = False) -> RichTable:
    """A rich table for the terminal (headline metrics and every flagged one, unless all_metrics)."""
    table = RichTable(title="lucebench compare", show_lines=False)
    for h in HEADERS:
        table.add_column(h, overflow="fold", justify="right" if h in ("Baseline", "Candidate", "Change", "p") else "left")
    for r in rows(comp, all_metrics=all_metrics):
        style = "red" if ("regression" in r[-1] or "newly failed" in r[-1]) else (
            "green" if "improvement" in r[-1] else None)
        table.add_row(*r, style=style)
    return table
