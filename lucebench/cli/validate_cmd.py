"""`lucebench validate FILE...`: exit 0 when every file is valid, 1 when any is invalid."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from lucebench.cli import app


@app.command("validate")
def validate(files: list[Path] = typer.Argument(..., help="result files to check")) -> None:
    """Schema and plausibility checks; every problem is listed with its JSON path."""
    from lucebench.results.validate import errors, validate_file

    console = Console(soft_wrap=True)
    invalid = 0
    for path in files:
        problems = validate_file(path)
        errs = errors(problems)
        for p in problems:
            tag = "[red]error[/]" if p.severity == "error" else "[yellow]warning[/]"
            console.print(f"{tag} {path}: {p.path}: ", end="", highlight=False)
            console.print(p.message, markup=False, highlight=False)
        if errs:
            invalid += 1
            console.print(f"[bold red]INVALID[/] {path}: {len(errs)} error(s)", highlight=False)
        else:
            console.print(f"[green]valid[/] {path}", highlight=False)
    if invalid:
        console.print(f"[bold red]{invalid} of {len(files)} file(s) invalid[/]", highlight=False)
        raise typer.Exit(1)
    console.print(f"all {len(files)} file(s) valid", highlight=False)
