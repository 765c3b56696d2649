"""A flat view of the cells of one or more results, with the helpers tables and plots share.

Tables are built "from whatever cells exist": each helper here answers one question about a cell (is it
speculative? does it sweep context?) from its params, workload and metrics, never from a fixed config.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lucebench.matrix.pairing import hashable
from lucebench.results.schema import Cell, Environment, MetricSummary, Result

# Params that describe the hardware a cell ran on; in multi-result reports "card" is added from the
# environment so that rows of different cards never merge.
CARD_KEY = "card"
KV_KEY = "kv"  # the KV-cache type as one setting: "bf16", or "q8_0/q4_0" for K/V (see kv_label)


@dataclass(frozen=True)
class CellView:
    """One cell together with the result it came from."""

    result_index: int
    result: Result
    cell: Cell
    card: str

    @property
    def params(self) -> dict[str, Any]:
        """The cell's params plus the card name (from the environment)."""
        kv = {KV_KEY: kv_label(self)} if "kv_k" in self.cell.params or "kv_v" in self.cell.params else {}
        return {**self.cell.params, **kv, CARD_KEY: self.card}

    @property
    def engine(self) -> str:
        """The engine name: the `engine` param, else the engine record, else "?"."""
        if "engine" in self.cell.params:
            return str(self.cell.params["engine"])
        return self.cell.engine.name if self.cell.engine else "?"

    @property
    def suite(self) -> str:
        """The suite name from the workload or the params."""
        if self.cell.workload is not None:
            return self.cell.workload.suite
        return str(self.cell.params.get("suite", "?"))

    @property
    def ok(self) -> bool:
        return self.cell.status == "ok"

    def metric(self, name: str) -> MetricSummary | None:
        """The metric summary, or None when missing or without a median (renders as n/a)."""
        m = self.cell.metrics.get(name)
        return m if m is not None and m.median is not None else None

    def median(self, name: str) -> float | None:
        m = self.metric(name)
        return m.median if m is not None else None


def card_name(result: Result, cell: Cell | None = None) -> str:
    """The hardware a result (or one of its cells: a resumed run may span machines) ran on: the first GPU's
    name, else the CPU's, else "cpu"."""
    return env_card_name(result.environment_of(cell) if cell is not None else result.environment)


def env_card_name(env: Environment) -> str:
    """The hardware of one environment: the first GPU's name, else the CPU's, else "cpu"."""
    if env.gpus:
        return env.gpus[0].name
    return env.cpu or "cpu"


def collect(results: Sequence[Result]) -> list[CellView]:
    """Every cell of every result, in order."""
    return [CellView(i, r, c, card_name(r, c)) for i, r in enumerate(results) for c in r.cells]


def slug(text: str) -> str:
    """A file-name-safe lower-case slug ("NVIDIA GeForce RTX 3090" -> "nvidia-geforce-rtx-3090")."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "unknown"


# ---------------------------------------------------------------------------------------------- classify
def is_speculative(v: CellView) -> bool:
    """A speculative-decoding cell: has a DDTree budget or a measured acceptance length."""
    return "budget" in v.cell.params or v.median("acceptance_length") is not None


def is_forced(v: CellView) -> bool:
    """A benchmark-only forced-acceptance cell (dflash --force-accept-length): its AL is a setting, not a
    measurement, and its output is not the model's; reported apart from real acceptance."""
    return any(s.spec is not None and s.spec.forced_acceptance_length is not None for s in v.cell.samples)


def is_compressed(v: CellView) -> bool:
    """A compressed-prefill cell (PFlash): has a keep ratio or measured tokens kept."""
    return "keep_ratio" in v.cell.params or v.median("kept_pct") is not None


def is_context(v: CellView) -> bool:
    """A long-context cell: one with a `context` axis. (A workload depth alone is not enough: tgN suites
    record the one prompt token already in context as their depth.)"""
    return "context" in v.cell.params


def is_dataset(v: CellView) -> bool:
    """A cell on a dataset suite (HumanEval, GSM8K, ...) rather than a synthetic pp/tg workload."""
    w = v.cell.workload
    return w is not None and w.dataset is not None


def context_of(v: CellView) -> int | None:
    """Context length of a long-context cell (the `context` param)."""
    try:
        return int(v.cell.params["context"])
    except (KeyError, TypeError, ValueError):
        return None


def kv_label(v: CellView) -> str:
    """The KV-cache type as `k/v` ("q8_0/q8_0" shown once as "q8_0"), default "default"."""
    k, val = v.cell.params.get("kv_k"), v.cell.params.get("kv_v")
    if k is None and val is None:
        return "default"
    if k == val or val is None:
        return str(k)
    return f"{k}/{val}"


def power_limit_of(v: CellView) -> float | None:
    """The power limit the cell ran under: the axis value, else the one read back."""
    if v.cell.params.get("power_limit_w") is not None:
        return float(v.cell.params["power_limit_w"])
    if v.cell.power is not None and v.cell.power.limit_w is not None:
        return float(v.cell.power.limit_w)
    return None


def varying_keys(views: Iterable[CellView], exclude: Iterable[str] = ()) -> list[str]:
    """Param keys whose value differs between `views` (those needed to tell rows apart), in stable order."""
    views = list(views)
    skip = set(exclude)
    keys: list[str] = []
    for v in views:
        for k in v.params:
            if k not in keys and k not in skip:
                keys.append(k)
    out = []
    for k in keys:
        values = {hashable(v.params.get(k)) for v in views}
        # A param that always repeats the engine's name (e.g. engine_type) adds nothing to a row label.
        if len(values) > 1 and not all(str(v.params.get(k)) == v.engine for v in views):
            out.append(k)
    return out


def key_of(v: CellView, keys: Sequence[str]) -> tuple[Any, ...]:
    """The values of `keys` in `v.params`, hashable, for grouping."""
    return tuple(hashable(v.params.get(k)) for k in keys)


def fmt_param(key: str, value: Any) -> str:
    """A param value for a table cell (power limits with a unit, missing as "-")."""
    if value is None:
        return "-"
    if key == "power_limit_w":
        return f"{float(value):g} W"
    return str(value)
