"""`lucebench env [--json]`: the environment record that goes into every result."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from lucebench.cli import app
from lucebench.results.schema import Environment


def _fmt_bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_environment(env: Environment, console: Console) -> None:
    """Print the environment as rich tables: system, GPUs, compilers, packages."""
    system = Table(title="System", show_header=False, title_justify="left")
    system.add_column("key", style="bold")
    system.add_column("value")
    rows = [
        ("hostname", env.hostname), ("os", env.os), ("kernel", env.kernel), ("cpu", env.cpu),
        ("cpu cores", env.cpu_count), ("memory", _fmt_bytes(env.memory_total_bytes)), ("python", env.python),
        ("driver", env.driver_version), ("CUDA (driver)", env.cuda_version), ("ROCm", env.rocm_version),
        ("lucebench", env.lucebench_version),
        ("commit", None if env.lucebench_commit is None
         else env.lucebench_commit[:12] + (" (dirty)" if env.lucebench_dirty else "")),
        ("power measurement", "available" if env.power_available else "unavailable"),
    ]
    for key, value in rows:
        system.add_row(key, _fmt(value))
    console.print(system)

    if env.gpus:
        gpus = Table(title="GPUs", title_justify="left")
        for col in ("#", "name", "memory", "cc", "power limit W (default, min..max)", "SM / mem MHz (max)",
                    "ECC", "energy counter", "PCI", "VBIOS"):
            gpus.add_column(col)
        for g in env.gpus:
            gpus.add_row(
                str(g.index), g.name, _fmt_bytes(g.memory_total_bytes), _fmt(g.compute_capability),
                f"{_fmt(g.power_limit_w)} ({_fmt(g.power_limit_default_w)}, "
                f"{_fmt(g.power_limit_min_w)}..{_fmt(g.power_limit_max_w)})",
                f"{_fmt(g.sm_clock_mhz)} / {_fmt(g.mem_clock_mhz)} "
                f"({_fmt(g.sm_clock_max_mhz)} / {_fmt(g.mem_clock_max_mhz)})",
                _fmt(g.ecc_enabled), _fmt(g.energy_counter), _fmt(g.pci_bus_id), _fmt(g.vbios))
        console.print(gpus)
    else:
        console.print("[yellow]No NVIDIA GPU visible to NVML: power and energy will be 'unavailable'.[/]")

    for title, mapping in (("Compilers", env.compilers), ("Packages", env.packages)):
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column("name", style="bold")
        table.add_column("version")
        for name, version in mapping.items():
            table.add_row(name, _fmt(version))
        console.print(table)


@app.command("env")
def env_command(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (the result's 'environment') on stdout."),
) -> None:
    """Show the environment record that goes into every result: GPUs, driver, CUDA/ROCm, compilers, packages."""
    from lucebench.measure.env import collect_environment  # deferred: keeps `lucebench --help` fast

    env = collect_environment()
    if as_json:
        sys.stdout.write(env.model_dump_json(indent=2) + "\n")
    else:
        render_environment(env, Console())
