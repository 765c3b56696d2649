"""The `lucebench` command line (typer). Each command group lives in its own module and registers itself.

User errors (lucebench.errors.UserError) end in one clear message and the exit status DESIGN.md gives;
tracebacks are for bugs only.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from lucebench import __version__
from lucebench.errors import UserError

app = typer.Typer(
    name="lucebench",
    help="Benchmark local LLM inference engines: tokens per second and tokens per joule, measured and reproducible.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)


def _flag_type_hidden() -> None:
    """typer's rich help shows a type for every option, so a flag reads `--resume <bool>` as if it took a value;
    a flag takes none, so its type column is left empty (options with values keep theirs)."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: object) -> str | None:
        return None if self.is_flag else shown(self, ctx)  # type: ignore[arg-type]

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flag_type_hidden()


def _version(value: bool) -> None:
    if value:
        print(f"lucebench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """lucebench: run a matrix, report it, compare it, validate it."""


def _register_commands() -> None:
    # Imported here so each module can import `app` from this package without a cycle.
    from lucebench.cli import (  # noqa: F401
        build_cmd,
        compare_cmd,
        datasets_cmd,
        env_cmd,
        generate_cmd,
        leaderboard_cmd,
        models_cmd,
        report_cmd,
        run_cmd,
        submit_cmd,
        train_cmd,
        validate_cmd,
    )


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the typer app and turns user errors into a message and an exit status."""
    try:
        app(args=argv, standalone_mode=True)
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
