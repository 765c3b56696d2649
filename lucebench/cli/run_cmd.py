"""`lucebench run [CONFIG] [--out DIR] [--resume] [--only GLOB] [--dry-run]`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from lucebench.cli import app
from lucebench.errors import UserError

RUNS_DIR = Path("runs")


def _default_config() -> str:
    """A quick config for the hardware found: a tiny CPU run where there is no GPU."""
    from lucebench.engines.detect import detect_backend

    return "cpu-smoke" if detect_backend() == "cpu" else "quick-gpu"


def _out_dir(config_name: str, out: Optional[Path], resume: bool) -> Path:
    if out is not None:
        return out
    base = RUNS_DIR / config_name
    if resume:
        previous = sorted(p for p in base.glob("*") if (p / "results.json").exists()) if base.exists() else []
        if not previous:
            raise UserError(f"--resume: no earlier run of {config_name!r} under {base}", hint="give the run's --out DIR")
        return previous[-1]
    return base / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


@app.command()
def run(
    config: Optional[str] = typer.Argument(None, help="YAML config (path or name in configs/); default: a quick run for this hardware"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default runs/<config>/<time>)"),
    resume: bool = typer.Option(False, "--resume", help="keep finished cells of an earlier run in --out and run the rest"),
    only: Optional[str] = typer.Option(None, "--only", help="run only cells whose id matches these globs (comma-separated)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (cells, builds, models, time) and exit"),
    allow_power_limit: bool = typer.Option(False, "--allow-power-limit",
                                           help="let cells change the GPU power limit (the config must allow it too); "
                                                "the original limit is restored on exit"),
    score: Optional[bool] = typer.Option(None, "--score/--no-score", help="score outputs against gold answers"),
    report: bool = typer.Option(True, "--report/--no-report", help="write report.md and plots at the end"),
) -> None:
    """Expand the matrix, build what is missing, run every cell, write DIR/results.json after each cell."""
    from lucebench.config import find_config, load_config
    from lucebench.runner.run import Runner, RunOptions

    console = Console(stderr=True)
    loaded = load_config(find_config(config or _default_config()))
    out_dir = _out_dir(loaded.config.name, out, resume)
    runner = Runner(loaded, RunOptions(out_dir=out_dir, resume=resume, only=only, dry_run=dry_run,
                                       allow_power_limit=allow_power_limit, score=score, report=report), console)
    try:
        summary = runner.run()
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if dry_run:
        return
    console.print(f"[bold]{summary.ok} ok, {summary.failed} failed, {summary.skipped} skipped"
                  f"{f', {summary.reused} reused' if summary.reused else ''}[/]  ->  {summary.result_path}")
    for line in summary.failures:
        console.print(f"[red]failed[/] {line}", highlight=False)
    raise typer.Exit(summary.exit_code)
