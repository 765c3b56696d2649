"""Config -> the list of cells to run: cartesian product, collapsed axes, include/exclude, stable ids."""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import asdict, dataclass
from typing import Any

from lucebench.config.schema import Config
from lucebench.engines.registry import GPU_BACKENDS, resolve_engine
from lucebench.errors import UserError


@dataclass(frozen=True)
class CellSpec:
    """One point of the matrix. Axes that do not apply to the engine or backend are None."""

    engine: str
    engine_type: str
    model: str
    suite: str
    gpu: int | None = None
    power_limit_w: float | None = None
    budget: int | None = None
    keep_ratio: float | None = None
    kv_k: str | None = None
    kv_v: str | None = None
    context: int | None = None
    second_model: str | None = None  # the `models:` entry of a dflash draft or pflash drafter
    show_gpu: bool = False  # the id names the GPU only when the matrix has several

    @property
    def id(self) -> str:
        """Deterministic, readable and unique within a run: engine/model/suite plus the axes that apply."""
        parts = [self.engine, self.model, self.suite]
        if self.context is not None:
            parts.append(f"ctx{self.context}")
        if self.kv_k is not None:
            parts.append(f"kv{self.kv_k}" if self.kv_k == self.kv_v else f"kv{self.kv_k}-{self.kv_v}")
        if self.budget is not None:
            parts.append(f"b{self.budget}")
        if self.keep_ratio is not None:
            parts.append(f"k{self.keep_ratio:g}")
        if self.power_limit_w is not None:
            parts.append(f"pl{self.power_limit_w:g}W")
        if self.show_gpu and self.gpu is not None:
            parts.append(f"gpu{self.gpu}")
        return "/".join(parts)

    def params(self) -> dict[str, Any]:
        """The axis values that define the cell (what results and compare match on)."""
        # The second model is recorded in the cell (its ModelInfo), not as an axis: the engine's name says it.
        out = {k: v for k, v in asdict(self).items() if v is not None and k not in ("show_gpu", "second_model")}
        return out


def _split_kv(value: str | None) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    k, _, v = value.partition("/")
    return k, v or k


def _matches(cell: CellSpec, rule: dict[str, Any]) -> bool:
    for axis, want in rule.items():
        if axis == "kv":
            if (cell.kv_k, cell.kv_v) != _split_kv(want):
                return False
        elif axis == "engine":
            if want not in (cell.engine, cell.engine_type):
                return False
        elif getattr(cell, axis) != want:
            return False
    return True


def _make_cell(config: Config, backend: str, values: dict[str, Any], show_gpu: bool) -> CellSpec:
    engine_type, options = resolve_engine(values["engine"], config.engines)
    if backend not in engine_type.backends:
        raise UserError(f"engine {values['engine']!r} ({engine_type.name}) does not run on the {backend} backend; "
                        f"it runs on {', '.join(sorted(engine_type.backends))}", where="config matrix.engine",
                        hint="drop it from matrix.engine for this machine, or set 'backend:' to one it runs on")
    on_gpu = backend in GPU_BACKENDS
    kv_k, kv_v = _split_kv(values.get("kv")) if "kv" in engine_type.axes else (None, None)

    def axis(name: str) -> Any:
        # An engine-specific axis: the matrix value, else the engine variant's own option, else None.
        if name not in engine_type.axes:
            return None
        return values.get(name) if values.get(name) is not None else options.get(name)
    return CellSpec(
        engine=values["engine"],
        engine_type=engine_type.name,
        model=values["model"],
        suite=values["suite"],
        gpu=values.get("gpu") if on_gpu else None,
        power_limit_w=values.get("power_limit_w") if on_gpu else None,
        budget=axis("budget"),
        keep_ratio=axis("keep_ratio"),
        kv_k=kv_k,
        kv_v=kv_v,
        context=values.get("context") if "context" in engine_type.axes else None,
        second_model=options.get(engine_type.second_model_option) if engine_type.second_model_option else None,
        show_gpu=show_gpu,
    )


def expand(config: Config, backend: str) -> list[CellSpec]:
    """All cells of the config on `backend`, in a stable order, duplicates from collapsed axes removed."""
    m = config.matrix
    gpus = m.gpu or (config.gpu.devices if config.gpu else [0])
    axes = {"engine": m.engine, "model": m.model, "suite": m.suite, "gpu": gpus,
            "power_limit_w": m.power_limit_w, "budget": m.budget, "keep_ratio": m.keep_ratio, "kv": m.kv,
            "context": m.context}
    show_gpu = len(gpus) > 1 and backend in GPU_BACKENDS
    cells: dict[str, CellSpec] = {}
    for combo in itertools.product(*axes.values()):
        cell = _make_cell(config, backend, dict(zip(axes, combo)), show_gpu)
        if any(_matches(cell, rule) for rule in config.exclude):
            continue
        cells.setdefault(cell.id, cell)
    for i, rule in enumerate(config.include):
        missing = {"engine", "model", "suite"} - set(rule)
        if missing:
            raise UserError(f"include[{i}] must name {', '.join(sorted(missing))}", where="config include")
        if rule["model"] not in config.models:
            raise UserError(f"include[{i}] names model {rule['model']!r}, which is not under 'models'")
        # Unnamed axes take the axis's first value, as a matrix cell would.
        values = {axis: vals[0] for axis, vals in axes.items()} | rule
        cell = _make_cell(config, backend, values, show_gpu)
        cells.setdefault(cell.id, cell)
    if not cells:
        raise UserError("the matrix is empty: every cell was excluded", where="config matrix/exclude",
                        hint="loosen the 'exclude' rules or add values to the matrix axes")
    return list(cells.values())


def select(cells: list[CellSpec], only: str | None) -> list[CellSpec]:
    """Cells whose id matches any of the comma-separated globs in `only` (all cells when None)."""
    if not only:
        return cells
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    chosen = [c for c in cells if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if not chosen:
        raise UserError(f"--only {only!r} matches no cell", hint="cell ids: " + ", ".join(c.id for c in cells[:12])
                        + (" ..." if len(cells) > 12 else ""))
    return chosen
