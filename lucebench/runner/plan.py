"""`lucebench run --dry-run`: the cells, builds, models and a rough time estimate, without running."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from lucebench.config.schema import Config
from lucebench.engines.registry import ENGINE_TYPES
from lucebench.matrix import CellSpec
from lucebench.models.resolve import TOKENIZER_FILES, fetch_command

# Rough throughputs used only for the estimate (tok/s prefill, tok/s decode, seconds to load).
_ROUGH = {"cpu": (2_000.0, 100.0, 5.0), "cuda": (20_000.0, 300.0, 20.0), "hip": (10_000.0, 200.0, 20.0)}


def _synthetic_shape(spec: CellSpec) -> tuple[int, int] | None:
    """(prompt tokens, generated tokens) of a pp/tg suite, known from its definition without a tokenizer."""
    from lucebench.suites.registry import resolve_suite

    try:
        synthetic = resolve_suite(spec.suite).spec.synthetic
    except Exception:  # noqa: BLE001 - config validation has already named a bad suite
        return None
    if synthetic is None:
        return None
    depth = spec.context or 0
    if synthetic.mode == "pp":
        return depth + synthetic.length, 1
    return depth + synthetic.context, synthetic.length + 1


def _cell_seconds(config: Config, backend: str, spec: CellSpec) -> float | None:
    """Load + warm-ups + repetitions at the rough rates; None when the workload cannot be sized yet."""
    from lucebench.runner.prepare import ModelCache, WorkloadCache

    pp, tg, load = _ROUGH[backend]
    passes_of = lambda n_prompts: config.measure.repetitions + config.measure.warmups / max(n_prompts, 1)  # noqa: E731
    shape = _synthetic_shape(spec)
    if shape is not None:  # pp/tg: the sizes are the suite's, whatever the tokenizer
        n_prompt, n_gen = shape
        return load + (n_prompt / pp + max(n_gen - 1, 0) / tg) * passes_of(1)
    source = config.models[spec.model]
    if source.path is None:
        return None  # hub or synthetic models may not exist yet: their tokenizer sizes dataset prompts
    try:
        model = ModelCache(config).get(spec.model)
        w = WorkloadCache(config).get(spec, model.tokenizer_dir)
    except Exception:  # noqa: BLE001 - the plan must print even if a model is missing; the run reports it
        return None
    per_pass = sum(len(p.token_ids) / pp + max(w.n_gen - 1, 0) / tg for p in w.prompts)
    return load + per_pass * passes_of(len(w.prompts))


def skip_reason(config: Config, spec: CellSpec, *, allow_power_limit: bool, backend: str) -> str | None:
    """Why a run with these flags would skip the cell without measuring it (None: it runs)."""
    not_here = ENGINE_TYPES[spec.engine_type].not_on(backend)
    if not_here is not None:
        return not_here
    if spec.power_limit_w is not None and not (config.power.allow_set_limit and allow_power_limit):
        need = [w for w, ok in (("power.allow_set_limit: true in the config", config.power.allow_set_limit),
                                ("--allow-power-limit", allow_power_limit)) if not ok]
        return f"power limit needs {' and '.join(need)} (and root)"
    return None


def print_plan(config: Config, backend: str, cells: list[CellSpec], console: Console | None = None, *,
               allow_power_limit: bool = False) -> None:
    console = console or Console()
    table = Table(title=f"{config.name}: {len(cells)} cells on {backend}")
    for col in ("cell", "engine", "model", "suite", "settings", "≈ time"):
        table.add_column(col)
    total, unknown = 0.0, 0
    skipped: dict[str, int] = {}
    for spec in cells:
        settings = ", ".join(f"{k}={v}" for k, v in spec.params().items()
                             if k not in ("engine", "engine_type", "model", "suite"))
        why = skip_reason(config, spec, allow_power_limit=allow_power_limit, backend=backend)
        seconds = None if why else _cell_seconds(config, backend, spec)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
        elif seconds is None:
            unknown += 1
        else:
            total += seconds
        table.add_row(spec.id, spec.engine_type, spec.model, spec.suite, settings or "-",
                      "skipped" if why else f"{seconds:.0f} s" if seconds is not None else "?")
    console.print(table)
    for why, n in skipped.items():
        console.print(f"[yellow]{n} of {len(cells)} cells will be skipped:[/] {why}")
    # What CMake builds: the bundled engines, and llama.cpp for its baseline.
    builds = sorted({c.engine_type for c in cells if ENGINE_TYPES[c.engine_type].not_on(backend) is None
                     and (ENGINE_TYPES[c.engine_type].kind == "bundled" or c.engine_type == "llama.cpp")})
    console.print(f"builds ({backend}): {', '.join(builds) or 'none'}")
    roles = {c.model: "model" for c in cells}
    for c in cells:
        if c.second_model is not None:
            roles.setdefault(c.second_model, "draft" if c.engine_type == "dflash" else "drafter")
    fetches: list[str] = []
    for name in sorted(roles):
        src = config.models[name]
        if src.path:
            how = f"path {src.path}"
        elif src.hub:
            how = (f"hub {src.hub}" + (f" file {src.file}" if src.file else "")
                   + (f" revision {src.revision}" if src.revision else ""))
            fetches.append(fetch_command(src.hub, src.revision, [src.file] if src.file else None))
        else:
            assert src.synth is not None
            what = src.synth.shape or src.synth.config or f"DFlash draft for {src.synth.draft_for}"
            kind = f"{src.synth.quant} GGUF" if src.synth.format == "gguf" else src.synth.dtype
            how = f"synthetic {what} seed {src.synth.seed} {kind}"
        if src.tokenizer:
            how += f", prompts tokenised by {src.tokenizer}"
            if not Path(src.tokenizer).expanduser().is_dir():
                fetches.append(fetch_command(src.tokenizer, None, TOKENIZER_FILES))
        console.print(f"{roles[name]} {name}: {how}")
    if fetches:
        console.print("weights from the hub (a run reads the Hugging Face cache only; fetch them first):")
        for command in dict.fromkeys(fetches):
            console.print(f"  {command}", soft_wrap=True, markup=False)
    pp, tg, load = _ROUGH[backend]
    note = f" (+{unknown} dataset cells not estimated: their model is not available yet)" if unknown else ""
    minutes = f"{total / 60:.1f} min" if total >= 60 else f"{total:.0f} s"
    console.print(f"estimated time of the cells ≈ {minutes}{note}; rough: assumes {pp:g} tok/s prefill, {tg:g} tok/s "
                  f"decode and {load:g} s to load each engine on {backend}; plus the preparation of builds and "
                  "conversions not yet cached (the first llama.cpp build: minutes, see README)")
