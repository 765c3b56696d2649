"""`lucebench report RESULTS... [--out DIR]`: report.md, PNG plots and a static index.html."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from lucebench.cli import app


@app.command("report")
def report(
    results: list[Path] = typer.Argument(..., help="result files (results.json) or run folders"),
    out: Path = typer.Option(None, "--out", "-o", help="report folder (default: next to the first result, report/)"),
) -> None:
    """Tables (median ± stddev, n), plots and an HTML page from one or more result files."""
    from lucebench.reports.build import build_report
    from lucebench.results.io import load_results

    loaded = load_results(results)
    first = results[0] if results[0].is_dir() else results[0].parent
    out_dir = out if out is not None else first / "report"
    files = build_report(loaded, out_dir)
    console = Console(soft_wrap=True)
    console.print(f"wrote {files.markdown}, {files.html} and {len(files.plots)} plot(s)", highlight=False)
