"""`lucebench compare BASELINE CANDIDATE`: exit 0 no regression, 1 regression, 2 incomparable inputs."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from lucebench.cli import app
from lucebench.errors import UserError

# Defaults repeated here (and checked by a test) so that `--help` does not import numpy/scipy.
DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_SAMPLES = 3
DEFAULT_REFERENCE_TOLERANCE_PCT = 5.0


def parse_metric_thresholds(items: list[str]) -> dict[str, float]:
    """`decode_tok_s=3` items -> {"decode_tok_s": 3.0}; malformed items are a UserError (exit 2)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            pct = float(value)
        except ValueError:
            pct = -1.0
        if not sep or not name.strip() or not pct > 0:
            raise UserError(f"bad --metric-threshold {item!r}", where="--metric-threshold",
                            hint="use METRIC=PERCENT with a positive percent, e.g. decode_tok_s=3")
        out[name.strip()] = pct
    return out


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write: {exc.strerror}", where=str(path)) from None


@app.command("compare")
def compare(
    baseline: Path = typer.Argument(..., help="the reference result file"),
    candidate: Path = typer.Argument(..., help="the new result file"),
    threshold: float = typer.Option(DEFAULT_THRESHOLD_PCT, "--threshold", min=0.0,
                                    help="percent change in the bad direction that counts as a regression"),
    metric_threshold: list[str] = typer.Option([], "--metric-threshold",
                                               help="per-metric threshold, METRIC=PERCENT (repeatable)"),
    force: bool = typer.Option(False, "--force", help="compare different hardware or workloads anyway"),
    alpha: float = typer.Option(DEFAULT_ALPHA, "--alpha", help="significance level of the Mann-Whitney U test"),
    min_samples: int = typer.Option(DEFAULT_MIN_SAMPLES, "--min-samples",
                                    help="fewer samples than this on either side marks a metric noisy"),
    reference_tolerance: float = typer.Option(
        DEFAULT_REFERENCE_TOLERANCE_PCT, "--reference-tolerance", min=0.0,
        help="percent by which two cells' idle power (copy bandwidth) may differ before their net-energy (roofline) "
             "metrics stop gating"),
    json_out: Path = typer.Option(None, "--json", help="write the full comparison as JSON"),
    md_out: Path = typer.Option(None, "--md", help="write the full comparison as Markdown"),
    all_metrics: bool = typer.Option(False, "--all", help="print every metric, not only headline and flagged ones"),
) -> None:
    """Per-metric changes with bootstrap CIs; flags regressions beyond the threshold and statistically supported."""
    from lucebench.reports.compare import CompareOptions, compare_results, comparison_dict
    from lucebench.reports.compare_render import comparison_markdown, comparison_rich, summary_lines
    from lucebench.results.io import load_results

    base, cand = load_results([baseline, candidate])
    opts = CompareOptions(threshold_pct=threshold, metric_thresholds=parse_metric_thresholds(metric_threshold),
                          force=force, alpha=alpha, min_samples=min_samples,
                          reference_tolerance_pct=reference_tolerance)
    comp = compare_results(base, cand, opts)
    console = Console(width=200)
    console.print(comparison_rich(comp, all_metrics=all_metrics))
    for line in summary_lines(comp)[1:]:
        console.print(line, highlight=False, markup=False)
    verdict = summary_lines(comp)[0]
    console.print(f"[bold {'red' if comp.exit_code else 'green'}]{verdict}[/]", highlight=False)
    if json_out is not None:
        _write(json_out, json.dumps(comparison_dict(comp), indent=2) + "\n")
    if md_out is not None:
        _write(md_out, comparison_markdown(comp))
    raise typer.Exit(comp.exit_code)
