"""Energy of time windows from sampled NVML readings: pure functions, no threads, no NVML.

Inputs are what `lucebench.measure.power.PowerSampler` records:

* counter points ``(t_ns, energy_J)``: the moments the total-energy counter was *seen to change*. The
  counter is a step function (it refreshes every ~20-100 ms); the update happened between the previous
  sample and the one that first saw the new value, so the point is placed at their midpoint. Between two
  points the energy is interpolated linearly (constant power within one update period), which is how a
  window edge that falls between updates gets its share.
* power samples ``(t_ns, W)``: integrated with the trapezoid rule, edges interpolated; the cross-check.

Windows shorter than the counter's update period give no energy ("window too short"): the counter cannot
resolve them, and the runner must lengthen the window (repeat the work) rather than report noise.

Windows of a few update periods are resolved by the counter only up to its edge interpolation, which
assumes constant power within the update period around each edge: where the neighbouring work draws
different power (a 32K-token prefill right before a 0.2 s decode window), that error reached 20% on an
H200. Where the sampler reads *instantaneous* power (at 50 Hz, 20 ms resolution), windows shorter than
COUNTER_MIN_PERIODS update periods are therefore measured by the power integral, the counter difference
kept beside it as the cross-check.
"""

from __future__ import annotations

import itertools
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

Method = Literal["counter", "integrated", "unavailable"]

NOTE_TOO_SHORT = "window too short"
AGREEMENT_MIN_WINDOW_S = 2.0  # counter and integral are compared (and must agree within 5%) from here on
AGREEMENT_TOLERANCE = 0.05
COUNTER_MIN_PERIODS = 10  # below this many counter update periods, prefer an instantaneous-power integral

CounterPoint = tuple[int, float]  # (t_ns, energy J)
PowerPoint = tuple[int, float]  # (t_ns, W)


class EnergyFields(Protocol):
    """What the gross-energy rule reads: an EnergyResult here, or the stored PhaseEnergy of a result file."""

    method: str
    energy_j: float | None
    energy_integrated_j: float | None


def gross_j(e: EnergyFields) -> float | None:
    """The measured gross energy: the counter difference, or the power integral where the method says so."""
    if e.method == "counter":
        return e.energy_j
    if e.method == "integrated":
        return e.energy_integrated_j
    return None


@dataclass
class EnergyResult:
    """Energy of one window (or the sum of several): the one energy record. lucebench.results.schema.PhaseEnergy
    is its stored form, field for field (lucebench.measure.records converts both ways).

    ``energy_j`` is gross (counter difference), ``energy_integrated_j`` the power integral over the same
    window, ``energy_net_j`` gross minus idle power x window. ``method`` says which value is the
    measurement: "counter", "integrated" (no energy counter on this GPU) or "unavailable" (no value;
    ``note`` says why, starting with "window too short" when the window could not be resolved).
    """

    window_s: float
    energy_j: float | None = None
    energy_integrated_j: float | None = None
    energy_net_j: float | None = None
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    method: Method = "unavailable"
    note: str | None = None

    @property
    def measured_j(self) -> float | None:
        """The gross energy by the method used: counter energy, or the integral where there is no counter."""
        return gross_j(self)

    @property
    def too_short(self) -> bool:
        return self.note is not None and self.note.startswith(NOTE_TOO_SHORT)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with exactly the PhaseEnergy field names."""
        return asdict(self)


def counter_points(samples: Sequence[tuple[int, float | None]]) -> list[CounterPoint]:
    """Change points of a stepwise energy counter from ``(t_ns, energy_J or None)`` samples in time order."""
    points: list[CounterPoint] = []
    prev: tuple[int, float] | None = None
    for t, e in samples:
        if e is None:
            continue
        if prev is not None and e != prev[1]:
            points.append(((prev[0] + t) // 2, e))
        prev = (t, e)
    return points


def update_period_s(points: Sequence[CounterPoint]) -> float | None:
    """Median interval between counter updates in s; None with fewer than 3 observed updates."""
    if len(points) < 3:
        return None
    return statistics.median((b[0] - a[0]) / 1e9 for a, b in itertools.pairwise(points))


def median_interval_s(times_ns: Sequence[int]) -> float | None:
    if len(times_ns) < 2:
        return None
    return statistics.median((b - a) / 1e9 for a, b in itertools.pairwise(times_ns))


def _interp(ts: Sequence[int], vs: Sequence[float], t: int) -> float | None:
    """Linear interpolation of (ts, vs) at t; None outside the sampled range."""
    if not ts or t < ts[0] or t > ts[-1]:
        return None
    j = bisect_left(ts, t)
    if ts[j] == t:
        return vs[j]
    t_a, t_b = ts[j - 1], ts[j]
    return vs[j - 1] + (vs[j] - vs[j - 1]) * (t - t_a) / (t_b - t_a)


def counter_energy(points: Sequence[CounterPoint], t0: int, t1: int) -> float | None:
    """Counter energy in J between t0 and t1 (ns), interpolated between updates; None if not covered."""
    ts = [p[0] for p in points]
    vs = [p[1] for p in points]
    e0, e1 = _interp(ts, vs, t0), _interp(ts, vs, t1)
    if e0 is None or e1 is None:
        return None
    return e1 - e0


def integrate_power(power: Sequence[PowerPoint], t0: int, t1: int) -> tuple[float, float] | None:
    """(energy J, peak W) of the power samples over [t0, t1] by the trapezoid rule; None if not covered."""
    ts = [p[0] for p in power]
    ws = [p[1] for p in power]
    w0, w1 = _interp(ts, ws, t0), _interp(ts, ws, t1)
    if w0 is None or w1 is None:
        return None
    lo, hi = bisect_right(ts, t0), bisect_left(ts, t1)
    xs = [t0, *ts[lo:hi], t1]
    ys = [w0, *ws[lo:hi], w1]
    energy = sum(0.5 * (ys[k] + ys[k + 1]) * (xs[k + 1] - xs[k]) for k in range(len(xs) - 1)) / 1e9
    return energy, max(ys)


def _too_short(window_s: float, resolution_s: float, what: str, peak: float | None) -> EnergyResult:
    return EnergyResult(window_s=window_s, peak_power_w=peak, method="unavailable",
                        note=f"{NOTE_TOO_SHORT}: {window_s * 1e3:.1f} ms < {what} {resolution_s * 1e3:.1f} ms; "
                             "repeat the work to lengthen the window")


def _finish(r: EnergyResult, idle_w: float | None) -> EnergyResult:
    """Average power, net energy (gross - idle x window; kept as given where idle_w is None) and the
    counter-vs-integral agreement note."""
    gross = r.measured_j
    if gross is not None and r.window_s > 0:
        r.avg_power_w = gross / r.window_s
        if idle_w is not None:
            r.energy_net_j = gross - idle_w * r.window_s
    if r.method == "counter" and r.energy_j and r.energy_integrated_j is not None \
            and r.window_s >= AGREEMENT_MIN_WINDOW_S:
        diff = (r.energy_integrated_j - r.energy_j) / r.energy_j
        if abs(diff) > AGREEMENT_TOLERANCE:
            note = f"counter and integrated power disagree by {diff * 100:+.1f}%"
            r.note = note if r.note is None else f"{r.note}; {note}"
    return r


def window_energy(*, t0_ns: int, t1_ns: int, idle_w: float | None, points: Sequence[CounterPoint],
                  power: Sequence[PowerPoint], counter_supported: bool, period_s: float | None,
                  sample_interval_s: float | None, power_is_instant: bool = False) -> EnergyResult:
    """Energy of the window [t0_ns, t1_ns] (see the module docstring for the method and the rules).

    ``period_s``: the counter's update period (`update_period_s`); ``sample_interval_s``: the power
    sampling interval (the resolution of the integral where there is no counter).
    """
    if t1_ns < t0_ns:
        raise ValueError(f"window ends before it starts: {t0_ns} > {t1_ns}")
    window_s = (t1_ns - t0_ns) / 1e9
    integ = integrate_power(power, t0_ns, t1_ns) if power else None
    peak = integ[1] if integ else None
    if window_s == 0:
        return EnergyResult(window_s=0.0, method="unavailable", note=f"{NOTE_TOO_SHORT}: empty window")
    if counter_supported:
        if period_s is None:
            return EnergyResult(window_s=window_s, peak_power_w=peak, method="unavailable",
                                note="counter update period unknown: too few counter updates observed")
        if window_s < period_s:
            return _too_short(window_s, period_s, "counter update period", peak)
        energy = counter_energy(points, t0_ns, t1_ns)
        if energy is None:
            return EnergyResult(window_s=window_s, peak_power_w=peak, method="unavailable",
                                note="window not covered by energy counter samples (sampler not running?)")
        if energy >= 0 and power_is_instant and integ is not None and window_s < COUNTER_MIN_PERIODS * period_s \
                and window_s >= 2 * (sample_interval_s or 0.0):
            return _finish(EnergyResult(
                window_s=window_s, energy_j=energy, energy_integrated_j=integ[0], peak_power_w=peak,
                method="integrated",
                note=f"{window_s * 1e3:.0f} ms < {COUNTER_MIN_PERIODS} counter periods: instantaneous-power "
                     f"integral; counter {energy:.3g} J"), idle_w)
        if energy >= 0:
            return _finish(EnergyResult(window_s=window_s, energy_j=energy,
                                        energy_integrated_j=integ[0] if integ else None,
                                        peak_power_w=peak, method="counter"), idle_w)
        note = "energy counter went backwards (driver reloaded?); using integrated power"
    else:
        note = "no energy counter on this GPU; integrated power samples"
    if integ is None:
        return EnergyResult(window_s=window_s, method="unavailable",
                            note="no power readings cover this window" if power else "power unavailable")
    resolution = 2 * (sample_interval_s or 0.0)
    if window_s < resolution:
        return _too_short(window_s, resolution, "two power sampling intervals", peak)
    return _finish(EnergyResult(window_s=window_s, energy_integrated_j=integ[0], peak_power_w=peak,
                                method="integrated", note=note), idle_w)


def combine(results: Sequence[EnergyResult], idle_w: float | None) -> EnergyResult:
    """Sum of the energies of several disjoint windows of one phase (e.g. the decode windows of all reps).

    The sum has a value only when every window has one by the same method: one unresolved window makes
    the total unknown rather than silently low. This is the one rule for summing windows (the runner's phase
    totals and the metrics' pooled passes both use it). The net energy is gross - ``idle_w`` x window, or,
    where ``idle_w`` is None, the sum of the windows' net energies (None when one lacks it).
    """
    if not results:
        return EnergyResult(window_s=0.0, method="unavailable", note="no windows")
    window_s = sum(r.window_s for r in results)
    peaks = [r.peak_power_w for r in results if r.peak_power_w is not None]
    peak = max(peaks) if peaks else None
    integrated = [r.energy_integrated_j for r in results]
    integ_sum = None if any(v is None for v in integrated) else sum(v for v in integrated if v is not None)
    nets = [r.energy_net_j for r in results]
    net_sum = None if any(v is None for v in nets) else sum(v for v in nets if v is not None)
    bad = [r for r in results if r.method == "unavailable"]
    if bad:
        short = [r for r in bad if r.too_short]
        first = (short or bad)[0].note or "no energy"
        label = NOTE_TOO_SHORT if short else "energy unavailable"
        return EnergyResult(window_s=window_s, peak_power_w=peak, method="unavailable",
                            note=f"{label}: {len(bad)} of {len(results)} windows without energy "
                                 f"(first: {first})")
    methods = {r.method for r in results}
    if methods == {"counter"}:
        total = sum(r.energy_j or 0.0 for r in results)
        return _finish(EnergyResult(window_s=window_s, energy_j=total, energy_integrated_j=integ_sum,
                                    energy_net_j=net_sum, peak_power_w=peak, method="counter"), idle_w)
    if integ_sum is None:
        return EnergyResult(window_s=window_s, peak_power_w=peak, method="unavailable",
                            note="windows measured by different methods and not all integrated")
    notes = sorted({r.note for r in results if r.note})
    return _finish(EnergyResult(window_s=window_s, energy_integrated_j=integ_sum, energy_net_j=net_sum,
                                peak_power_w=peak, method="integrated", note="; ".join(notes) or None), idle_w)


def decimate(power: Sequence[PowerPoint], t0_ns: int, t1_ns: int, max_points: int) -> list[tuple[float, float]]:
    """(seconds since t0, W) of the samples in [t0, t1], averaged into at most ``max_points`` time bins."""
    ts = [p[0] for p in power]
    lo, hi = bisect_left(ts, t0_ns), bisect_right(ts, t1_ns)
    inside = power[lo:hi]
    if max_points <= 0 or not inside:
        return []
    if len(inside) <= max_points:
        return [((t - t0_ns) / 1e9, w) for t, w in inside]
    span = max(t1_ns - t0_ns, 1)
    bins: list[list[PowerPoint]] = [[] for _ in range(max_points)]
    for t, w in inside:
        bins[min((t - t0_ns) * max_points // span, max_points - 1)].append((t, w))
    return [((sum(t for t, _ in b) / len(b) - t0_ns) / 1e9, sum(w for _, w in b) / len(b)) for b in bins if b]
