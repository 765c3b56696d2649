"""`lucebench run --dry-run`: the cells, builds, models and a rough time estimate, without running."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from lucebench.config.schema import Config
from lucebench.engines.registry import ENGINE_TYPES
from lucebench.matrix import CellSpec

# Rough throughputs used only for the estimate (tok/s prefill, tok/s decode, seconds to load).
_ROUGH = {"cpu": (2_000.0, 100.0, 5.0), "cuda": (20_000.0, 300.0, 20.0), "hip": (10_000.0, 200.0, 20.0)}


def _cell_seconds(config: Config, backend: str, spec: CellSpec) -> float | None:
    """Load + warm-ups + repetitions at the rough rates; None when the workload cannot be sized yet."""
    from lucebench.runner.prepare import ModelCache, WorkloadCache

    source = config.models[spec.model]
    if source.path is None:
        return None  # hub or synthetic models may not exist yet: their tokenizer sizes the prompts
    try:
        model = ModelCache(config).get(spec.model)
        w = WorkloadCache(config).get(spec, model.path)
    except Exception:  # noqa: BLE001 - the plan must print even if a model is missing; the run reports it
        return None
    pp, tg, load = _ROUGH[backend]
    per_pass = sum(len(p.token_ids) / pp + max(w.n_gen - 1, 0) / tg for p in w.prompts)
    passes = config.measure.repetitions + config.measure.warmups / max(len(w.prompts), 1)
    return load + per_pass * passes


def print_plan(config: Config, backend: str, cells: list[CellSpec], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"{config.name}: {len(cells)} cells on {backend}")
    for col in ("cell", "engine", "model", "suite", "settings", "≈ time"):
        table.add_column(col)
    total, unknown = 0.0, 0
    for spec in cells:
        settings = ", ".join(f"{k}={v}" for k, v in spec.params().items()
                             if k not in ("engine", "engine_type", "model", "suite"))
        seconds = _cell_seconds(config, backend, spec)
        if seconds is None:
            unknown += 1
        else:
            total += seconds
        table.add_row(spec.id, spec.engine_type, spec.model, spec.suite, settings or "-",
                      f"{seconds:.0f} s" if seconds is not None else "?")
    console.print(table)
    # What CMake builds: the bundled engines, and llama.cpp for its baseline.
    builds = sorted({c.engine_type for c in cells
                     if ENGINE_TYPES[c.engine_type].kind == "bundled" or c.engine_type == "llama.cpp"})
    console.print(f"builds ({backend}): {', '.join(builds) or 'none'}")
    for name in sorted({c.model for c in cells}):
        src = config.models[name]
        how = (f"path {src.path}" if src.path else f"hub {src.hub}" if src.hub else
               f"synthetic {src.synth.shape or src.synth.config} seed {src.synth.seed} {src.synth.dtype}")
        console.print(f"model {name}: {how}")
    pp, tg, _ = _ROUGH[backend]
    note = f" (+{unknown} cells not estimated: model not available yet)" if unknown else ""
    console.print(f"estimated time ≈ {total / 60:.1f} min{note}; rough: assumes {pp:g} tok/s prefill and "
                  f"{tg:g} tok/s decode on {backend}")
