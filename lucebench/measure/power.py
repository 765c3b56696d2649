"""Background sampling of one GPU's energy counter and power, and the energy of phase windows.

The runner keeps a `PowerSampler` running around a cell's requests and asks for the energy of each phase
window afterwards, with the `CLOCK_MONOTONIC` stamps the engine reports (docs/protocol.md):

    with PowerSampler(0) as sampler:
        ... run requests ...
        decode = sampler.energy_over([(s.t_decode_start_ns, s.t_decode_end_ns) for s in samples], idle_w)

The method and its rules are in lucebench.measure.energy and docs/power.md. No pydantic here (this
module runs on bare device machines); lucebench.measure.records converts results to schema models.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from bisect import bisect_left, bisect_right
from typing import Literal

from lucebench.measure import energy as E
from lucebench.measure.energy import EnergyResult
from lucebench.measure.nvml import Nvml, NvmlError, resolve

log = logging.getLogger(__name__)

PowerSource = Literal["auto", "instant", "average"]
Sample = tuple[int, int | None, float | None]  # (monotonic ns, counter mJ or None, power W or None)


class PowerSampler:
    """Records ``(time.monotonic_ns(), energy counter mJ or None, power W or None)`` of one GPU on a
    background thread every ``interval_s`` (default 20 ms: 50 Hz, well above the 20 Hz floor).

    ``power_source``: "instant" reads NVML_FI_DEV_POWER_INSTANT, "average" nvmlDeviceGetPowerUsage (a
    1 s average on Ampere and newer), "auto" the instant reading where the driver has it. Where NVML or
    the GPU is unavailable the sampler records nothing and every result says "unavailable" (never 0 W).
    """

    def __init__(self, device_index: int, interval_s: float = 0.02, nvml: Nvml | None = None,
                 power_source: PowerSource = "auto"):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.device_index = device_index
        self.interval_s = interval_s
        self.nvml = resolve(nvml)
        self.reason: str | None = self.nvml.reason
        self.counter_supported = False
        self.power_source: Literal["instant", "average", "none"] = "none"
        if self.nvml.available:
            try:
                self.nvml.handle(device_index)
            except NvmlError as exc:  # index out of range: report, do not crash the run
                self.reason = str(exc)
            else:
                self.counter_supported = self.nvml.energy_mj(device_index) is not None
                if power_source in ("auto", "instant") and self.nvml.power_instant_w(device_index) is not None:
                    self.power_source = "instant"
                elif power_source != "instant" and self.nvml.power_w(device_index) is not None:
                    self.power_source = "average"
        self._times: list[int] = []
        self._samples: list[Sample] = []
        self._points: list[E.CounterPoint] = []  # counter change points, maintained as samples arrive
        self._power: list[E.PowerPoint] = []
        self._last_counter: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle
    @property
    def available(self) -> bool:
        """True when at least one of energy counter and power can be read."""
        return self.counter_supported or self.power_source != "none"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> PowerSampler:
        """Start the sampling thread (no-op when unavailable or already running)."""
        if self.available and not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"lucebench-power-{self.device_index}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; recorded samples stay available for queries."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> PowerSampler:  # noqa: PYI034  (typing.Self needs 3.11)
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_power(self) -> float | None:
        if self.power_source == "instant":
            return self.nvml.power_instant_w(self.device_index)
        if self.power_source == "average":
            return self.nvml.power_w(self.device_index)
        return None

    def sample_once(self) -> Sample:
        """Take and record one sample now (the thread's step; also usable without the thread)."""
        a = time.monotonic_ns()
        mj = self.nvml.energy_mj(self.device_index) if self.counter_supported else None
        w = self._read_power()
        t = (a + time.monotonic_ns()) // 2  # the readings happened between a and now
        with self._lock:
            self._times.append(t)
            self._samples.append((t, mj, w))
            if w is not None:
                self._power.append((t, w))
            if mj is not None:
                if self._last_counter is not None and mj != self._last_counter[1]:
                    self._points.append(((self._last_counter[0] + t) // 2, mj / 1000.0))
                self._last_counter = (t, mj)
        return t, mj, w

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # a sampler must never take the run down; the gap shows in the data
                log.exception("power sample failed")
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (GIL, slow NVML call): resume the grid from now, no burst
                next_t = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    # -- data
    def samples(self) -> list[Sample]:
        """A copy of all recorded samples."""
        with self._lock:
            return list(self._samples)

    def discard_before(self, t_ns: int) -> None:
        """Drop samples older than t_ns (keeps memory bounded over long runs; keeps one earlier sample)."""
        with self._lock:
            k = max(bisect_left(self._times, t_ns) - 1, 0)
            del self._times[:k], self._samples[:k]
            kp = max(bisect_left(self._power, (t_ns,)) - 1, 0)
            del self._power[:kp]
            kc = max(bisect_left(self._points, (t_ns,)) - 2, 0)
            del self._points[:kc]

    def counter_period_s(self) -> float | None:
        """Measured update period of the energy counter (median of recent update intervals), in s."""
        with self._lock:
            return E.update_period_s(self._points[-400:])

    def sample_rate_hz(self) -> float | None:
        """Achieved sampling rate (1 / median interval between samples)."""
        with self._lock:
            iv = E.median_interval_s(self._times[-2000:])
        return None if not iv else 1.0 / iv

    def _covered(self, t1_ns: int) -> bool:
        with self._lock:
            if self.counter_supported:
                return bool(self._points) and self._points[-1][0] >= t1_ns
            return bool(self._power) and self._power[-1][0] >= t1_ns

    def wait_covered(self, t1_ns: int, timeout_s: float | None = None) -> bool:
        """Wait until samples past t1_ns exist (the counter must update once after a window ends before
        its end can be interpolated). Returns False on timeout or when the sampler is not running."""
        if timeout_s is None:
            timeout_s = max(3 * (self.counter_period_s() or 0.1), 10 * self.interval_s, 0.5)
        deadline = time.monotonic() + timeout_s
        while not self._covered(t1_ns):
            if not self.running or time.monotonic() > deadline:
                return self._covered(t1_ns)
            time.sleep(self.interval_s / 2)
        return True

    # -- energy
    def energy_between(self, t0_ns: int, t1_ns: int, idle_w: float | None = None, *,
                       wait: bool = True) -> EnergyResult:
        """Energy of the window [t0_ns, t1_ns] (monotonic ns): counter difference interpolated at the
        edges, cross-checked by the power integral; gross and net of ``idle_w`` x window; avg/peak power.

        Windows shorter than the counter update period return energy None and a note starting with
        "window too short". With ``wait`` (default) the call first waits briefly for the counter to update
        past t1_ns when the sampler is still running.
        """
        if not self.available:
            return EnergyResult(window_s=max(t1_ns - t0_ns, 0) / 1e9, method="unavailable",
                                note=self.reason or "power unavailable on this GPU")
        if wait and self.running:
            self.wait_covered(t1_ns)
        period = self.counter_period_s()
        with self._lock:
            points = _slice(self._points, t0_ns, t1_ns)
            power = _slice(self._power, t0_ns, t1_ns)
            interval = E.median_interval_s(self._times[-2000:])
        return E.window_energy(t0_ns=t0_ns, t1_ns=t1_ns, idle_w=idle_w, points=points, power=power,
                               counter_supported=self.counter_supported, period_s=period,
                               sample_interval_s=interval, power_is_instant=self.power_source == "instant")

    def energy_over(self, windows: list[tuple[int, int]], idle_w: float | None = None) -> EnergyResult:
        """Summed energy of several disjoint windows of one phase (e.g. prefill windows of all reps);
        None-valued (with the reason) when any window cannot be resolved. Raises ValueError on overlap."""
        ordered = sorted(windows)
        for (a0, a1), (b0, _) in itertools.pairwise(ordered):
            if b0 < a1:
                raise ValueError(f"windows overlap: ({a0}, {a1}) and ({b0}, ...)")
        if ordered and self.running:
            self.wait_covered(ordered[-1][1])
        return E.combine([self.energy_between(t0, t1, None, wait=False) for t0, t1 in ordered], idle_w)

    def trace(self, t0_ns: int, t1_ns: int, max_points: int = 500) -> list[tuple[float, float]]:
        """Power timeline (seconds since t0_ns, W) over [t0_ns, t1_ns], bin-averaged to ``max_points``."""
        with self._lock:
            power = _slice(self._power, t0_ns, t1_ns)
        return E.decimate(power, t0_ns, t1_ns, max_points)


def _slice(points: list[tuple[int, float]], t0_ns: int, t1_ns: int, margin: int = 2) -> list[tuple[int, float]]:
    """The points within [t0, t1] plus ``margin`` on each side (enough to interpolate at the edges)."""
    lo = max(bisect_left(points, (t0_ns,)) - margin, 0)
    hi = bisect_right(points, (t1_ns, float("inf"))) + margin
    return points[lo:hi]


def measure_idle_power(device_index: int, seconds: float = 2.0, nvml: Nvml | None = None) -> float | None:
    """Median board power in W over ``seconds`` of sampling while the caller keeps the GPU quiet;
    None where power cannot be read. The median ignores short spikes from other processes."""
    sampler = PowerSampler(device_index, nvml=nvml)
    if sampler.power_source == "none" and not sampler.counter_supported:
        return None
    with sampler:
        time.sleep(seconds)
    watts = [w for _, _, w in sampler.samples() if w is not None]
    if watts:
        return statistics.median(watts)
    # No power reading but a counter: the average power between the first and last counter update.
    with sampler._lock:
        points = list(sampler._points)
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / ((points[-1][0] - points[0][0]) / 1e9)
