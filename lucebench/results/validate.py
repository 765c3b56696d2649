"""`lucebench validate`: schema and plausibility checks of result files.

Every problem is reported with its JSON path; checking goes on after the first problem so that a
contributor sees the whole list at once. A file is valid only when there is no error (warnings do not
fail it); unlike MLPerf's checker nothing says "OK" about a file that has an error.

Plausibility rules (docs/reports.md lists them with their reasons):
power within the card's idle..max range, energy implies positive power, tok/J and tok/s recomputed from
the samples within 1%, phase times consistent with the phase timestamps, every metric summary consistent
with its own samples, environment and a known lucebench version, no NaN/inf, ok cells have samples,
failed cells have an error.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lucebench import __version__
from lucebench.errors import UserError
from lucebench.metrics.definitions import gross_j
from lucebench.results.io import iter_non_finite, json_path, read_json, result_file, schema_problems
from lucebench.results.schema import Cell, GpuInfo, MetricSummary, PhaseEnergy, Result, Sample

REL_TOL = 0.01  # recomputed metrics must agree within 1%
SUMMARY_TOL = 1e-6  # a summary and its own samples must agree up to float rounding
MAX_J_PER_TOKEN = 100.0  # Zeus's plausibility cap: a warning where the phase's own time and power explain it
POWER_MAX_SLACK = 1.05  # averaged power may overshoot the max limit briefly (NVML averaging)
# Instantaneous samples spike above the limit: an H100 (700 W) read 896.6 W (1.28x) during a 128K prefill.
TRACE_MAX_SLACK = 1.5
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class Problem:
    """One finding: JSON path, message and severity."""

    path: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _p(*loc: int | str) -> str:
    return json_path(loc)


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------- entry points
def validate_file(path: Path) -> list[Problem]:
    """Every problem of one result file (unreadable, not JSON, schema, plausibility), in file order."""
    path = result_file(Path(path))
    try:
        data = read_json(path)
    except UserError as exc:
        where = exc.where or ""
        prefix = f"{path}:"
        if where.startswith(prefix):  # "file:line:col" from a JSON syntax error
            line, _, col = where[len(prefix):].partition(":")
            where = f"line {line}, column {col}"
        else:
            where = "$"
        return [Problem(where, exc.message)]
    problems = [Problem(json_path(loc), "not a finite number (NaN or Infinity is not valid JSON)")
                for loc in iter_non_finite(data)]
    schema = schema_problems(data)
    problems += [Problem(p.path, p.message) for p in schema]
    if schema:
        return problems  # plausibility needs a well-formed result
    problems += validate_result(Result.model_validate(data))
    return problems


def validate_result(result: Result) -> list[Problem]:
    """Plausibility problems of a schema-valid result."""
    out: list[Problem] = []
    out += _check_versions(result)
    envs = [("$.environment", result.environment)]
    envs += [(f"$.other_environments.{key}", env) for key, env in result.other_environments.items()]
    for path, env in envs:
        if not env.os or not env.python:
            out.append(Problem(path, "environment incomplete: os and python are required"))
        if env.power_available and not env.gpus:
            out.append(Problem(f"{path}.power_available", "power_available is true but no GPU is recorded"))
    seen: dict[str, int] = {}
    for i, cell in enumerate(result.cells):
        if cell.id in seen:
            out.append(Problem(_p("cells", i, "id"), f"duplicate cell id {cell.id!r} (also cells[{seen[cell.id]}])"))
        seen.setdefault(cell.id, i)
        out += check_cell(result, i, cell)
    if not result.cells:
        out.append(Problem("$.cells", "the result has no cells", "warning"))
    return out


def _check_versions(result: Result) -> list[Problem]:
    out = []
    env = result.environment
    commit = (env.lucebench_commit or "").lower()
    if commit and not COMMIT_RE.match(commit):
        out.append(Problem("$.environment.lucebench_commit", f"{env.lucebench_commit!r} is not a git commit hash"))
    for path, version in (("$.lucebench_version", result.lucebench_version),
                          ("$.environment.lucebench_version", env.lucebench_version)):
        if not is_known_version(version) and not COMMIT_RE.match(commit):
            out.append(Problem(path, f"unknown lucebench version {version!r}: neither a released version "
                                     f"(<= {__version__}) nor accompanied by a commit hash"))
    if env.lucebench_dirty:
        out.append(Problem("$.environment.lucebench_dirty", "measured from a modified source tree", "warning"))
    if not result.metrics_version:
        out.append(Problem("$.metrics_version", "metrics_version is empty"))
    return out


def is_known_version(version: str) -> bool:
    """A plain release X.Y.Z not newer than this lucebench."""
    if not RELEASE_RE.match(version):
        return False
    mine = tuple(int(x) for x in re.findall(r"\d+", __version__)[:3])
    return tuple(int(x) for x in version.split(".")) <= mine


# ---------------------------------------------------------------------------------------------- cells
def _gpu_of(result: Result, cell: Cell) -> GpuInfo | None:
    gpus = result.environment_of(cell).gpus
    if not gpus:
        return None
    idx = cell.params.get("gpu")
    return next((g for g in gpus if str(g.index) == str(idx) or g.name == idx), gpus[0])


def check_cell(result: Result, i: int, cell: Cell) -> list[Problem]:
    """Problems of one cell: status/error/samples, per-sample timing and energy, metrics."""
    out: list[Problem] = []
    base = ("cells", i)
    if cell.status == "ok":
        if not cell.samples:
            out.append(Problem(_p(*base, "samples"), "status is ok but there are no samples"))
        if not cell.metrics:
            out.append(Problem(_p(*base, "metrics"), "status is ok but there are no metrics"))
        if cell.error is not None:
            out.append(Problem(_p(*base, "error"), "status is ok but an error is recorded", "warning"))
    else:
        if cell.error is None or not cell.error.message.strip():
            out.append(Problem(_p(*base, "error"), f"status is {cell.status} but no error/reason is recorded"))
    if cell.cpu_load is not None and cell.cpu_load.contaminated:
        out.append(Problem(_p(*base, "cpu_load"), f"measured on a busy machine: other processes used "
                           f"{cell.cpu_load.other_cores:.2f} of {cell.cpu_load.cpu_count} CPU cores meanwhile",
                           "warning"))
    if cell.environment_id is not None and cell.environment_id not in result.other_environments:
        out.append(Problem(_p(*base, "environment_id"),
                           f"names environment {cell.environment_id!r}, which other_environments does not hold"))
    gpu = _gpu_of(result, cell)
    idle = cell.power.idle_power_w if cell.power is not None else None
    if cell.power is not None and cell.power.limit_w is not None and gpu is not None:
        lo, hi = gpu.power_limit_min_w, gpu.power_limit_max_w
        if (lo is not None and cell.power.limit_w < lo * 0.95) or (hi is not None and cell.power.limit_w > hi * 1.05):
            out.append(Problem(_p(*base, "power", "limit_w"),
                               f"power limit {cell.power.limit_w:g} W outside the card's range {lo}..{hi} W"))
    for j, s in enumerate(cell.samples):
        out += _check_sample(result, cell, (*base, "samples", j), s, gpu, idle)
    max_w = gpu.power_limit_max_w if gpu is not None else None
    for j, (t, w) in enumerate(cell.power_trace):
        if w < 0 or (max_w is not None and w > max_w * TRACE_MAX_SLACK):
            out.append(Problem(_p(*base, "power_trace", j), f"{w:g} W outside 0..{max_w} W of {gpu.name if gpu else ''}"))
        if j and t < cell.power_trace[j - 1][0]:
            out.append(Problem(_p(*base, "power_trace", j), "timestamps go backwards"))
    for name, m in cell.metrics.items():
        out += check_summary((*base, "metrics", name), m)
        if not result.environment_of(cell).power_available and _is_energy_metric(name) and m.median is not None:
            out.append(Problem(_p(*base, "metrics", name),
                               "energy metric has a value although power_available is false"))
    if cell.status == "ok" and cell.samples:
        out += check_recomputed(base, cell)
    return out


def _is_energy_metric(name: str) -> bool:
    return name.endswith(("_j", "_j_net")) or "_per_j" in name or name == "avg_power_w"


def _check_sample(result: Result, cell: Cell, loc: tuple[int | str, ...], s: Sample, gpu: GpuInfo | None,
                  idle: float | None) -> list[Problem]:
    out: list[Problem] = []
    if s.n_prompt < 0 or s.n_gen < 0:
        out.append(Problem(_p(*loc), "negative token count"))
    if s.prefill_s < 0 or s.decode_s < 0:
        out.append(Problem(_p(*loc), "negative phase time"))
    if s.n_prompt > 0 and s.prefill_s <= 0:
        out.append(Problem(_p(*loc, "prefill_s"), f"{s.n_prompt} prompt tokens in zero time"))
    if s.n_gen > 1 and s.decode_s <= 0:
        out.append(Problem(_p(*loc, "decode_s"), f"{s.n_gen - 1} decode tokens in zero time"))
    if s.decode_steps > max(s.n_gen - 1, 0):
        out.append(Problem(_p(*loc, "decode_steps"), f"{s.decode_steps} decode steps for {s.n_gen} generated tokens"))
    if s.e2e_s + 1e-3 < (s.prefill_s + s.decode_s) * (1 - REL_TOL):
        out.append(Problem(_p(*loc, "e2e_s"), f"end-to-end {s.e2e_s:.6g} s is shorter than prefill + decode "
                                              f"{s.prefill_s + s.decode_s:.6g} s"))
    stamps = (s.t_prefill_start_ns, s.t_prefill_end_ns, s.t_decode_start_ns, s.t_decode_end_ns)
    if any(b < a for a, b in itertools.pairwise(stamps)):
        out.append(Problem(_p(*loc), "phase timestamps are not in order (prefill start <= end <= decode start <= end)"))
    else:
        for phase, secs, (a, b) in (("prefill", s.prefill_s, stamps[:2]), ("decode", s.decode_s, stamps[2:])):
            stamp_s = (b - a) / 1e9
            # The stamps are taken after device synchronisation, so they may exceed the device-timed
            # duration by launch/sync overhead, but a factor of 2 means a unit or clock mix-up.
            if secs > 0.002 and not (0.5 * secs - 1e-3 <= stamp_s <= 2 * secs + 0.05):
                out.append(Problem(_p(*loc, f"{phase}_s"), f"{phase} time {secs:.6g} s disagrees with its timestamps "
                                                           f"({stamp_s:.6g} s)"))
    if cell.workload is not None and cell.workload.ignore_eos and s.n_gen != cell.workload.n_gen:
        out.append(Problem(_p(*loc, "n_gen"), f"generated {s.n_gen} tokens but the workload fixes n_gen "
                                              f"{cell.workload.n_gen} (ignore_eos)"))
    if s.draft_steps is not None and s.accepted_tokens is not None and (
            s.draft_steps <= 0 or s.accepted_tokens < s.draft_steps):
        out.append(Problem(_p(*loc, "accepted_tokens"), "each draft step commits at least one token"))
    for key, stats in (("spec", s.spec), ("prefill", s.prefill)):
        if stats is not None:
            out += [Problem(_p(*loc, key), msg) for msg in stats.problems()]
    if s.spec is not None and s.draft_steps is not None and (s.spec.draft_steps, s.spec.accepted_tokens) != (
            s.draft_steps, s.accepted_tokens):
        out.append(Problem(_p(*loc, "spec"), "spec's counts differ from the sample's draft_steps / accepted_tokens"))
    if s.prefill is not None and s.prefill.prompt_tokens != s.n_prompt:
        out.append(Problem(_p(*loc, "prefill", "prompt_tokens"),
                           f"prefill.prompt_tokens {s.prefill.prompt_tokens} differs from n_prompt {s.n_prompt}"))
    for phase, e in s.energy.items():
        out += _check_energy((*loc, "energy", phase), e, s, phase, gpu, idle)
    return out


def _energy_per_token_problem(loc: tuple[int | str, ...], e: PhaseEnergy, s: Sample, phase: str, per_token: float,
                              tokens: int, gpu: GpuInfo | None) -> Problem:
    """More than MAX_J_PER_TOKEN: an error unless the card's maximum power over the phase's time allows it
    (a slow phase, e.g. a 27B decoding after a 128K prompt, really spends that much); a warning then."""
    hi = gpu.power_limit_max_w if gpu is not None else None
    secs = max(e.window_s, s.prefill_s if phase == "prefill" else s.decode_s)
    if hi is None or secs <= 0:
        return Problem(_p(*loc), f"{per_token:.3g} J per token is implausible (> {MAX_J_PER_TOKEN:g})")
    allowed = secs * hi * POWER_MAX_SLACK / tokens
    if per_token > allowed:
        return Problem(_p(*loc), f"{per_token:.3g} J per token is more than {hi:g} W over the phase's "
                                 f"{secs:.3g} s allows ({allowed:.3g} J per token)")
    return Problem(_p(*loc), f"{per_token:.3g} J per token (> {MAX_J_PER_TOKEN:g}): a slow phase, "
                             f"{secs / tokens:.3g} s per token", "warning")


def _check_energy(loc: tuple[int | str, ...], e: PhaseEnergy, s: Sample, phase: str, gpu: GpuInfo | None,
                  idle: float | None) -> list[Problem]:
    out: list[Problem] = []
    gross = e.energy_j if e.energy_j is not None else e.energy_integrated_j
    if e.window_s < 0:
        out.append(Problem(_p(*loc, "window_s"), "negative energy window"))
    if gross is not None:
        if gross < 0:
            out.append(Problem(_p(*loc), f"negative energy {gross:g} J"))
        if e.avg_power_w is None or e.avg_power_w <= 0:
            out.append(Problem(_p(*loc, "avg_power_w"), "energy is present but average power is missing or not > 0"))
        tokens = s.n_prompt if phase == "prefill" else max(s.n_gen - 1, 0)
        if tokens and gross / tokens > MAX_J_PER_TOKEN:
            out.append(_energy_per_token_problem(loc, e, s, phase, gross / tokens, tokens, gpu))
    if e.method != "unavailable" and gross is None:
        out.append(Problem(_p(*loc, "method"), f"method is {e.method!r} but no energy value is recorded"))
    if e.avg_power_w is not None and e.avg_power_w > 0:
        hi = gpu.power_limit_max_w if gpu is not None else None
        if hi is not None and e.avg_power_w > hi * POWER_MAX_SLACK:
            out.append(Problem(_p(*loc, "avg_power_w"),
                               f"{e.avg_power_w:.4g} W above the card's maximum power limit {hi:g} W"))
        if idle is not None and e.avg_power_w < idle * 0.8:
            out.append(Problem(_p(*loc, "avg_power_w"), f"{e.avg_power_w:.4g} W below the measured idle power "
                                                        f"{idle:g} W"))
    return out


# ---------------------------------------------------------------------------------------------- metrics
def check_summary(loc: tuple[int | str, ...], m: MetricSummary) -> list[Problem]:
    """A summary must agree with its own samples (median, mean, stddev, min, max, n, cov)."""
    out: list[Problem] = []
    if m.n < 0:
        return [Problem(_p(*loc, "n"), "negative n")]
    if m.n == 0:
        if m.median is not None:
            out.append(Problem(_p(*loc, "median"), "n is 0 but a median is given"))
        return out
    if m.median is None:
        out.append(Problem(_p(*loc, "median"), f"n is {m.n} but the median is missing"))
        return out
    if m.samples:
        if len(m.samples) != m.n:
            out.append(Problem(_p(*loc, "n"), f"n is {m.n} but {len(m.samples)} samples are listed"))
        expect = {"median": statistics.median(m.samples), "mean": statistics.fmean(m.samples),
                  "min": min(m.samples), "max": max(m.samples)}
        if len(m.samples) > 1:
            expect["stddev"] = statistics.stdev(m.samples)
        for key, want in expect.items():
            got = getattr(m, key)
            if got is not None and not math.isclose(got, want, rel_tol=SUMMARY_TOL, abs_tol=1e-9):
                out.append(Problem(_p(*loc, key), f"{key} {got:.6g} but the samples give {want:.6g}"))
    elif m.min is not None and m.max is not None and not (m.min <= m.median <= m.max):
        out.append(Problem(_p(*loc, "median"), f"median {m.median:.6g} outside [min, max] = [{m.min:.6g}, {m.max:.6g}]"))
    if m.cov is not None and m.stddev is not None and m.mean and not math.isclose(
            m.cov, m.stddev / abs(m.mean), rel_tol=1e-3, abs_tol=1e-9):
        out.append(Problem(_p(*loc, "cov"), f"cov {m.cov:.6g} but stddev/mean is {m.stddev / abs(m.mean):.6g}"))
    return out


def _energy_variants(s: Sample, phase: str, net: bool) -> list[float]:
    e = s.energy.get(phase)
    if e is None:
        return []
    if net:
        vals = [e.energy_net_j]
    else:
        vals = [e.energy_j, e.energy_integrated_j]
    return [v for v in vals if v is not None and v > 0]


def _measured_gross_j(s: Sample, phase: str) -> float | None:
    """The gross energy of the phase by its recorded method (`gross_j`, the metric definition's rule: a short
    window is measured by the power integral, a long one by the counter: docs/power.md)."""
    e = s.energy.get(phase)
    v = gross_j(e) if e is not None else None
    return v if v is not None and v > 0 else None


def _total_tok_per_j(s: Sample) -> list[tuple[float, float]]:
    """Generated tokens over prefill + decode energy: each phase by its recorded method (the two phases of
    a sample may differ), or both by the counter."""
    out = []
    for pick in (lambda ph: _measured_gross_j(s, ph), lambda ph: (_energy_variants(s, ph, False) or [None])[0]):
        pre, dec = pick("prefill"), pick("decode")
        if pre is None or (s.n_gen > 1 and dec is None):
            continue
        out.append((float(s.n_gen), pre + (dec or 0.0)))
    return out


def _recompute_rules() -> dict[str, Callable[[Sample], list[tuple[float, float]]]]:
    """Per metric: for one sample, (numerator, denominator) pairs whose ratio is the metric (one per variant)."""
    def dec_tokens(s: Sample) -> int:
        return max(s.n_gen - 1, 0)

    def per_j(tokens: Callable[[Sample], int], phase: str, net: bool) -> Callable[[Sample], list[tuple[float, float]]]:
        return lambda s: [(float(tokens(s)), e) for e in _energy_variants(s, phase, net)]

    return {
        "prefill_tok_s": lambda s: [(float(s.n_prompt), s.prefill_s)] if s.prefill_s > 0 else [],
        "decode_tok_s": lambda s: [(float(dec_tokens(s)), s.decode_s)] if s.decode_s > 0 else [],
        "ttft_ms": lambda s: [(s.prefill_s * 1e3, 1.0)],
        "tpot_ms": lambda s: [(s.decode_s * 1e3, float(dec_tokens(s)))] if dec_tokens(s) else [],
        "prefill_tok_per_j": per_j(lambda s: s.n_prompt, "prefill", False),
        "decode_tok_per_j": per_j(dec_tokens, "decode", False),
        "prefill_tok_per_j_net": per_j(lambda s: s.n_prompt, "prefill", True),
        "decode_tok_per_j_net": per_j(dec_tokens, "decode", True),
        "total_tok_per_j": _total_tok_per_j,
        "acceptance_length": lambda s: ([(float(s.accepted_tokens), float(s.draft_steps))]
                                        if s.accepted_tokens is not None and s.draft_steps else []),
    }


def _candidates(samples: Iterable[Sample], rule: Callable[[Sample], list[tuple[float, float]]]) -> list[float]:
    """Acceptable values of a metric: the median of per-sample ratios, or of per-repetition aggregates
    (sum of numerators over sum of denominators); one of each per energy variant."""
    samples = list(samples)
    per_sample: list[list[float]] = []
    per_rep: dict[tuple[int, int], list[float]] = {}
    for s in samples:
        for k, (num, den) in enumerate(rule(s)):
            while len(per_sample) <= k:
                per_sample.append([])
            if den > 0:
                per_sample[k].append(num / den)
            agg = per_rep.setdefault((k, s.rep), [0.0, 0.0])
            agg[0] += num
            agg[1] += den
    out = [statistics.median(v) for v in per_sample if v]
    for k in range(len(per_sample)):
        reps = [(n, d) for (kk, _), (n, d) in per_rep.items() if kk == k]
        if any(d > 0 for _, d in reps):
            out.append(statistics.median([n / d for n, d in reps if d > 0]))
        total_d = sum(d for _, d in reps)
        if total_d > 0:  # one aggregate over every window (lucebench.metrics' short-window fallback)
            out.append(sum(n for n, _ in reps) / total_d)
    return out


def check_recomputed(base: tuple[int | str, ...], cell: Cell) -> list[Problem]:
    """Metrics recomputed from the raw samples must match the stored medians within 1%."""
    out: list[Problem] = []
    for name, rule in _recompute_rules().items():
        m = cell.metrics.get(name)
        if m is None or m.median is None:
            continue
        cands = _candidates(cell.samples, rule)
        if not cands and m.note and "aggregate" in m.note:
            # Summed phase windows are not stored per sample, so the value cannot be recomputed here.
            out.append(Problem(_p(*base, "metrics", name), f"{name} is an aggregate ({m.note}); not recomputable "
                                                           "from the samples", "warning"))
        elif not cands:
            what = "energy" if "_per_j" in name else "data"
            out.append(Problem(_p(*base, "metrics", name, "median"),
                               f"{name} = {m.median:.6g} but no sample has the {what} to derive it from"))
        elif not any(_close(m.median, c, REL_TOL) for c in cands):
            out.append(Problem(_p(*base, "metrics", name, "median"),
                               f"{name} = {m.median:.6g} but the samples give {cands[0]:.6g} (tolerance 1%)"))
    return out


def errors(problems: Iterable[Problem]) -> list[Problem]:
    """Only the errors (what makes a file invalid)."""
    return [p for p in problems if p.severity == "error"]
