"""`lucebench leaderboard RESULTS_DIR --out DIR`: cross-card tables and plots of everything submitted."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from lucebench.cli import app


@app.command("leaderboard")
def leaderboard(
    results_dir: Path = typer.Argument(Path("results"), help="folder of submitted results (results/)"),
    out: Path = typer.Option(Path("reports/leaderboard"), "--out", "-o", help="output folder"),
) -> None:
    """Decode tok/s and tok/J per card per engine; invalid files are skipped with their reason."""
    from lucebench.reports.leaderboard import build_leaderboard

    files = build_leaderboard(results_dir, out)
    console = Console(soft_wrap=True)
    for s in files.skipped:
        console.print(f"[yellow]skipped[/] {s.path}: ", end="", highlight=False)
        console.print(s.reason, markup=False, highlight=False)
    console.print(f"wrote {files.markdown} and {files.html} from {len(files.included)} file(s), "
                  f"{len(files.skipped)} skipped", highlight=False)
