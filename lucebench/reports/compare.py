"""`lucebench compare`: per-cell, per-metric change between two results, with the statistics CI acts on.

The rule (after asv / Bencher / Conbench, tuned against single-run noise alarms):

* cells are matched by their config identity: params (the axis values) and workload identity (suite,
  prompt ids, n_gen, depth, ...). Different hardware (GPU name, driver major) or a different workload
  for the same params makes the inputs incomparable (exit 2) unless forced;
* per metric the change is the ratio of medians, candidate over baseline, with a percentile bootstrap
  confidence interval from the per-repetition samples;
* a regression is flagged only when (1) the change is beyond the threshold in the bad direction, (2) the
  whole confidence interval lies beyond the threshold, and (3) a one-sided Mann-Whitney U test agrees
  (p <= alpha), and the sample counts can reach alpha at all: with 3 vs 3 samples complete separation gives
  exactly 0.05, the smallest p there is, so any consistent ordering would pass at 0.05 and such a change is
  "inconclusive" (a warning, exit 0), not a regression. A change beyond the threshold without that support is
  "inconclusive"; every metric also carries the power to detect a change of the threshold's size;
* a metric whose cell is noisy (the summary's CoV flag, or fewer than `min_samples` samples on either
  side) is marked "noisy" instead of failing;
* a cell that was ok in the baseline and failed in the candidate is a regression;
* a CPU cell flagged as measured on a busy machine (other processes' CPU time, lucebench.measure.cpu_load) on
  either side is marked "noisy" instead of failing;
* metrics measured against a per-run reference reading (net energies: the idle power; the roofline: the copy
  bandwidth) are marked "noisy" instead of failing when that reading differs between the two cells by more than
  `reference_tolerance_pct`: the change would be the reading's, not the engine's.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from lucebench.errors import UserError
from lucebench.reports.cells import card_name
from lucebench.reports.metric_info import BANDWIDTH_RELATIVE, INFORMATIONAL, NET_OF_IDLE, higher_is_better
from lucebench.results.schema import Cell, MetricSummary, Result

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_SAMPLES = 3
DEFAULT_BOOTSTRAP = 2000
# Idle power or copy bandwidth differing by more than this between two cells makes their net-energy or roofline
# metrics incomparable (one H200 read 126 W and 81 W idle ten minutes apart on 2026-11-22; the copy bandwidth of
# one card varies by ~2% between measurements, so that alone stays below it).
DEFAULT_REFERENCE_TOLERANCE_PCT = 5.0
CONFIDENCE = 0.95

# Statuses of one metric comparison. "regression" and "failed" make `compare` exit 1.
FAILING = frozenset({"regression", "failed"})


@dataclass(frozen=True)
class CompareOptions:
    """Thresholds (in percent) and statistics settings of a comparison."""

    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    metric_thresholds: dict[str, float] = field(default_factory=dict)
    force: bool = False
    alpha: float = DEFAULT_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    n_bootstrap: int = DEFAULT_BOOTSTRAP
    reference_tolerance_pct: float = DEFAULT_REFERENCE_TOLERANCE_PCT

    def threshold(self, metric: str) -> float:
        """The threshold of `metric` as a fraction (5% -> 0.05)."""
        return self.metric_thresholds.get(metric, self.threshold_pct) / 100.0


@dataclass
class MetricChange:
    """One metric of one matched cell."""

    metric: str
    baseline: float | None
    candidate: float | None
    change: float | None  # candidate / baseline - 1
    ci_low: float | None  # bootstrap CI of the change
    ci_high: float | None
    p_value: float | None  # one-sided Mann-Whitney U in the direction of the observed change
    threshold: float
    higher_is_better: bool
    noisy: bool
    n_baseline: int
    n_candidate: int
    status: str  # regression | improvement | inconclusive | noisy | unchanged | info | missing | n/a
    # The smallest p the test can give with these sample counts: at or above alpha it cannot support anything.
    min_p: float | None = None
    # Probability that a change the size of the threshold would be flagged, at this noise and these counts.
    power: float | None = None
    too_few_samples: bool = False


@dataclass
class CellComparison:
    """A matched pair of cells and their metric changes."""

    label: str
    params: dict[str, Any]
    baseline_id: str
    candidate_id: str
    baseline_status: str
    candidate_status: str
    status: str  # ok | failed | fixed | both-failed
    changes: list[MetricChange] = field(default_factory=list)
    note: str | None = None


@dataclass
class Comparison:
    """The whole comparison; `exit_code` is what `lucebench compare` exits with."""

    baseline_run: str
    candidate_run: str
    baseline_hardware: str
    candidate_hardware: str
    options: CompareOptions
    cells: list[CellComparison]
    only_in_baseline: list[str]
    only_in_candidate: list[str]
    forced_mismatches: list[str]

    def regressions(self) -> list[tuple[CellComparison, MetricChange | None]]:
        """Every failing item: (cell, metric change) or (cell, None) for a cell that newly failed."""
        out: list[tuple[CellComparison, MetricChange | None]] = []
        for c in self.cells:
            if c.status == "failed":
                out.append((c, None))
            out += [(c, m) for m in c.changes if m.status in FAILING]
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions() else 0


# ---------------------------------------------------------------------------------------------- identity
def hardware_identity(result: Result) -> tuple[str, str | None]:
    """(card name, driver major version) of a result."""
    drv = result.environment.driver_version
    return card_name(result), drv.split(".")[0] if drv else None


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def params_key(cell: Cell, ignore: Sequence[str] = ()) -> tuple[Any, ...]:
    """The config identity of a cell: its params (minus `ignore`)."""
    return tuple(sorted((k, _freeze(v)) for k, v in cell.params.items() if k not in ignore))


def workload_identity(cell: Cell) -> dict[str, Any]:
    """What must be equal for two cells to have done the same work."""
    w = cell.workload
    if w is None:
        return {}
    ident: dict[str, Any] = {"suite": w.suite, "prompt_ids": list(w.prompt_ids), "n_gen": w.n_gen,
                             "ignore_eos": w.ignore_eos, "depth": w.depth, "dataset": w.dataset,
                             "prompt_format": w.prompt_format}
    # Versions are compared only when both sides recorded them (older results may lack them).
    ident["suite_version"] = w.suite_version
    ident["dataset_revision"] = w.dataset_revision
    return ident


def workload_mismatch(a: Cell, b: Cell) -> list[str]:
    """Human-readable differences of the workload identities of two cells (empty when comparable)."""
    ia, ib = workload_identity(a), workload_identity(b)
    if not ia or not ib:
        return []
    out = []
    for k in ia:
        va, vb = ia[k], ib[k]
        if k in ("suite_version", "dataset_revision") and (va is None or vb is None):
            continue
        if va != vb:
            if k == "prompt_ids":
                out.append(f"prompt ids differ ({len(va)} vs {len(vb)} prompts, "
                           f"{len(set(va) ^ set(vb))} not shared)")
            else:
                out.append(f"{k} differs ({va!r} vs {vb!r})")
    ma, mb = a.model, b.model
    if ma is not None and mb is not None and ma.files and mb.files and ma.files != mb.files:
        out.append(f"model files differ ({ma.name})")
    return out


def cell_label(cell: Cell) -> str:
    """A short label of a cell from its params."""
    return " ".join(f"{k}={v}" for k, v in cell.params.items()) or cell.id


# ---------------------------------------------------------------------------------------------- statistics
def bootstrap_change_ci(base: Sequence[float], cand: Sequence[float], *, n_boot: int = DEFAULT_BOOTSTRAP,
                        confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of median(cand) / median(base) - 1; None with fewer than 2 samples a side."""
    b = np.asarray([x for x in base if math.isfinite(x)], dtype=float)
    c = np.asarray([x for x in cand if math.isfinite(x)], dtype=float)
    if len(b) < 2 or len(c) < 2:
        return None
    rng = np.random.default_rng(seed)
    mb = np.median(b[rng.integers(0, len(b), size=(n_boot, len(b)))], axis=1)
    mc = np.median(c[rng.integers(0, len(c), size=(n_boot, len(c)))], axis=1)
    ok = mb != 0
    if not ok.any():
        return None
    ratio = mc[ok] / mb[ok] - 1.0
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(ratio, [tail, 100 - tail])
    return float(lo), float(hi)


def mann_whitney_p(base: Sequence[float], cand: Sequence[float], alternative: str) -> float | None:
    """One-sided Mann-Whitney U p-value that cand is `alternative` ("less"/"greater") than base."""
    if len(base) < 2 or len(cand) < 2:
        return None
    try:
        return float(mannwhitneyu(cand, base, alternative=alternative).pvalue)
    except ValueError:  # all values identical: no evidence either way
        return 1.0


def smallest_p(nb: int, nc: int) -> float:
    """The smallest one-sided Mann-Whitney p of nb vs nc samples (complete separation): 1 / C(nb + nc, nb).
    3 vs 3 gives 0.05, so at alpha 0.05 any consistent ordering would pass; it takes 3 vs 4 or more to mean it."""
    return 1.0 / math.comb(nb + nc, nb) if nb > 0 and nc > 0 else 1.0


def power_at_threshold(b: MetricSummary, c: MetricSummary, threshold: float, alpha: float) -> float:
    """Power to flag a change of `threshold` (a fraction of the baseline median) at `alpha`, given the two sides'
    spread and counts: the normal approximation of the t test, scaled by Mann-Whitney's asymptotic relative
    efficiency (3/pi); 0 when the counts cannot reach alpha at all."""
    from scipy.stats import norm

    nb, nc = b.n, c.n
    if smallest_p(nb, nc) >= alpha or b.median is None or b.median == 0:
        return 0.0
    var = ((nb - 1) * (b.stddev or 0.0) ** 2 + (nc - 1) * (c.stddev or 0.0) ** 2) / max(nb + nc - 2, 1)
    if var <= 0:
        return 1.0
    z = abs(threshold * b.median) / math.sqrt(var * (1 / nb + 1 / nc)) * math.sqrt(3 / math.pi)
    return float(norm.cdf(z - norm.ppf(1 - alpha)))


def _seed(*parts: str) -> int:
    return zlib.crc32("|".join(parts).encode())


def compare_metric(name: str, b: MetricSummary | None, c: MetricSummary | None, opts: CompareOptions,
                   seed_text: str = "", reference_differs: bool = False) -> MetricChange | None:
    """Compare one metric; None when neither side has it. reference_differs: the reading the metric is measured
    against (idle power, copy bandwidth) differs between the two cells, so it is noisy as a cell with high CoV is."""
    hib = higher_is_better(name)
    thr = opts.threshold(name)
    bm = b.median if b is not None else None
    cm = c.median if c is not None else None
    if bm is None and cm is None:
        return None
    nb, nc = (b.n if b else 0), (c.n if c else 0)
    noisy = bool((b and b.noisy) or (c and c.noisy) or nb < opts.min_samples or nc < opts.min_samples
                 or reference_differs)
    if bm is None or cm is None or bm == 0:
        return MetricChange(name, bm, cm, None, None, None, None, thr, hib, noisy, nb, nc,
                            "missing" if bm is not None and cm is None else "n/a")
    change = cm / bm - 1.0
    ci = bootstrap_change_ci(b.samples if b else [], c.samples if c else [], n_boot=opts.n_bootstrap,
                             seed=_seed(seed_text, name))
    worse = -change if hib else change  # > 0 means the candidate is worse
    went_down = change < 0
    p = None
    status = "unchanged"
    min_p = smallest_p(nb, nc)
    too_few = min_p >= opts.alpha
    power = power_at_threshold(b, c, thr, opts.alpha) if b is not None and c is not None else None
    if abs(change) > thr:
        # The test only decides beyond the threshold; skipping it elsewhere keeps big matrices fast.
        p = mann_whitney_p(b.samples if b else [], c.samples if c else [], "less" if went_down else "greater")
        # The whole CI must lie beyond the threshold on the side of the observed change.
        ci_beyond = ci is not None and ((ci[1] < -thr) if went_down else (ci[0] > thr))
        supported = ci_beyond and p is not None and p <= opts.alpha and not too_few
        if name in INFORMATIONAL:
            status = "info"
        elif noisy:
            status = "noisy"
        elif not supported:
            status = "inconclusive"
        else:
            status = "regression" if worse > 0 else "improvement"
    return MetricChange(name, bm, cm, change, ci[0] if ci else None, ci[1] if ci else None, p, thr, hib, noisy,
                        nb, nc, status, min_p=min_p, power=power,
                        too_few_samples=too_few and status == "inconclusive")


# ---------------------------------------------------------------------------------------------- compare
def check_comparable(baseline: Result, candidate: Result) -> list[str]:
    """Hardware differences that make two results incomparable (empty when comparable)."""
    (bc, bd), (cc, cd) = hardware_identity(baseline), hardware_identity(candidate)
    out = []
    if bc != cc:
        out.append(f"different hardware: baseline ran on {bc!r}, candidate on {cc!r}")
    if bd != cd:
        out.append(f"different driver major version: baseline {bd or 'none'}, candidate {cd or 'none'}")
    return out


def compare_results(baseline: Result, candidate: Result, options: CompareOptions | None = None) -> Comparison:
    """Match cells and compare every metric. Raises UserError (exit 2) for incomparable inputs unless forced."""
    opts = options or CompareOptions()
    forced: list[str] = []
    hw = check_comparable(baseline, candidate)
    if hw:
        if not opts.force:
            raise UserError("; ".join(hw), where="compare", exit_code=2,
                            hint="compare runs of the same card and driver, or pass --force to compare anyway")
        forced += hw
    # Under --force across cards the GPU axis value (an index or name) must not prevent matching.
    ignore = ("gpu",) if hw else ()
    bmap = _index(baseline.cells, ignore)
    cmap = _index(candidate.cells, ignore)
    common = [k for k in bmap if k in cmap]
    if not common:
        raise UserError("no cell of the candidate has the same config identity (params) as a baseline cell",
                        where="compare", exit_code=2,
                        hint="the two results come from different configs; compare runs of the same config")
    workload_problems = []
    for k in common:
        diffs = workload_mismatch(bmap[k], cmap[k])
        if diffs:
            workload_problems.append(f"cell {cell_label(bmap[k])}: " + "; ".join(diffs))
    if workload_problems:
        if not opts.force:
            shown = workload_problems[:5] + ([f"... and {len(workload_problems) - 5} more"]
                                             if len(workload_problems) > 5 else [])
            raise UserError("different workloads:\n  " + "\n  ".join(shown), where="compare", exit_code=2,
                            hint="the runs used different prompts, lengths or suite versions; pass --force to compare "
                                 "anyway")
        forced += workload_problems
    cells = [_compare_cells(bmap[k], cmap[k], opts, _references(baseline, bmap[k]), _references(candidate, cmap[k]))
             for k in common]
    return Comparison(
        baseline_run=baseline.run_id, candidate_run=candidate.run_id,
        baseline_hardware=" / driver ".join(x or "none" for x in hardware_identity(baseline)),
        candidate_hardware=" / driver ".join(x or "none" for x in hardware_identity(candidate)),
        options=opts, cells=cells,
        only_in_baseline=[cell_label(bmap[k]) for k in bmap if k not in cmap],
        only_in_candidate=[cell_label(cmap[k]) for k in cmap if k not in bmap],
        forced_mismatches=forced)


def _index(cells: Sequence[Cell], ignore: Sequence[str]) -> dict[tuple[Any, ...], Cell]:
    out: dict[tuple[Any, ...], Cell] = {}
    for cell in cells:
        key = params_key(cell, ignore)
        # Two cells with identical params (a repeated axis value) keep both, in order.
        n = 0
        while (*key, ("#", n)) in out:
            n += 1
        out[(*key, ("#", n))] = cell
    return out


@dataclass(frozen=True)
class References:
    """The per-run readings a cell's metrics were measured against."""

    idle_power_w: float | None
    bandwidth_bytes_s: float | None


def _references(result: Result, cell: Cell) -> References:
    gpu_index = cell.params.get("gpu", 0)
    gpus = {g.index: g for g in result.environment_of(cell).gpus}
    gpu = gpus.get(gpu_index) if isinstance(gpu_index, int) else None
    return References(idle_power_w=cell.power.idle_power_w if cell.power else None,
                      bandwidth_bytes_s=gpu.memory_bandwidth_bytes_s if gpu else None)


def _differs(a: float | None, b: float | None, tolerance_pct: float) -> bool:
    return a is not None and b is not None and a > 0 and abs(b / a - 1.0) * 100 > tolerance_pct


def reference_notes(rb: References, rc: References, opts: CompareOptions) -> tuple[frozenset[str], list[str]]:
    """Metrics that must not gate because their reference reading differs, and a note saying why."""
    ungated: set[str] = set()
    notes = []
    if _differs(rb.idle_power_w, rc.idle_power_w, opts.reference_tolerance_pct):
        ungated |= NET_OF_IDLE
        notes.append(f"idle power differs ({rb.idle_power_w:.1f} W vs {rc.idle_power_w:.1f} W): net-of-idle "
                     "metrics marked noisy")
    if _differs(rb.bandwidth_bytes_s, rc.bandwidth_bytes_s, opts.reference_tolerance_pct):
        ungated |= BANDWIDTH_RELATIVE
        notes.append(f"measured bandwidth differs ({rb.bandwidth_bytes_s / 1e12:.3f} vs "
                     f"{rc.bandwidth_bytes_s / 1e12:.3f} TB/s): roofline marked noisy")
    return frozenset(ungated), notes


def _compare_cells(b: Cell, c: Cell, opts: CompareOptions, rb: References, rc: References) -> CellComparison:
    label = cell_label(b)
    if b.status == "ok" and c.status != "ok":
        reason = c.error.message if c.error else "no reason recorded"
        return CellComparison(label, b.params, b.id, c.id, b.status, c.status, "failed",
                              note=f"candidate {c.status}: {reason}")
    if b.status != "ok" and c.status == "ok":
        status = "fixed"
    elif b.status != "ok":
        return CellComparison(label, b.params, b.id, c.id, b.status, c.status, "both-failed")
    else:
        status = "ok"
    ungated, notes = reference_notes(rb, rc, opts)
    # A CPU cell measured while other processes took the machine's cores measured them, not the engine.
    busy = [side for side, cell in (("baseline", b), ("candidate", c))
            if cell.cpu_load is not None and cell.cpu_load.contaminated]
    if busy:
        notes.append(f"measured on a busy machine ({' and '.join(busy)}): its metrics do not gate")
    changes = []
    for name in list(dict.fromkeys([*b.metrics, *c.metrics])):
        mc = compare_metric(name, b.metrics.get(name), c.metrics.get(name), opts, seed_text=label,
                            reference_differs=name in ungated or bool(busy))
        if mc is not None:
            changes.append(mc)
    if status == "fixed":
        # Nothing to compare against: the baseline cell had no measurement.
        for m in changes:
            m.status = "n/a"
    return CellComparison(label, b.params, b.id, c.id, b.status, c.status, status, changes,
                          note="; ".join(notes) or None)


def comparison_dict(comp: Comparison) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (every cell and metric)."""
    return {
        "baseline_run": comp.baseline_run, "candidate_run": comp.candidate_run,
        "baseline_hardware": comp.baseline_hardware, "candidate_hardware": comp.candidate_hardware,
        "options": asdict(comp.options), "exit_code": comp.exit_code,
        "regressions": [{"cell": c.label, "metric": m.metric if m else None,
                         "change": m.change if m else None} for c, m in comp.regressions()],
        "forced_mismatches": comp.forced_mismatches,
        "only_in_baseline": comp.only_in_baseline, "only_in_candidate": comp.only_in_candidate,
        "cells": [asdict(c) for c in comp.cells],
    }
