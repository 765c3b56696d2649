"""`lucebench submit RESULT [--results-dir results]`: validate and file a result for the leaderboard."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from lucebench.cli import app


@app.command("submit")
def submit(
    result: Path = typer.Argument(..., help="the results.json to submit"),
    results_dir: Path = typer.Option(Path("results"), "--results-dir", help="the repository's results/ folder"),
) -> None:
    """Validate RESULT and copy it to results/<gpu-slug>/<date>-<engines>-<id>.json (exit 1 when invalid)."""
    from lucebench.reports.submission import submit as do_submit

    done = do_submit(result, results_dir)
    console = Console(soft_wrap=True)
    console.print(f"what it is: {done.what}", highlight=False)
    if done.existed:
        console.print(f"already submitted: {done.path}", highlight=False)
    else:
        console.print(f"submitted: {done.path}\nadd it to a pull request: git add {done.path}", highlight=False)
