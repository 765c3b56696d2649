"""The runner's view of power: one sampler per GPU for the whole run, idle power, energy per window.

Bridges lucebench.measure (NVML) to the result schema. Without an NVIDIA GPU every energy value is
None ("unavailable"), never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lucebench.results.schema import PhaseEnergy, Result

# A phase whose windows fill at least this share of the span from its first start to its last end is
# measured as that one span (scaled by the busy share): back-to-back pp520 prefills last ~20 ms each,
# far below the energy counter's ~100 ms update period, but their span of several seconds is resolved.
BUSY_SHARE_FOR_SPAN = 0.9


@dataclass
class RunPower:
    """Samplers and idle power per device index; empty on machines without NVML GPUs."""

    samplers: dict[int, Any] = field(default_factory=dict)
    idle_w: dict[int, float | None] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return bool(self.samplers)

    @classmethod
    def start(cls, devices: list[int], idle_s: float, console: Any = None,
              known_idle_w: dict[int, float] | None = None) -> RunPower:
        """Measure idle power on each device (or take it from `known_idle_w`: a resumed run's earlier cells on
        this machine), then start a background sampler on each."""
        from lucebench.measure.nvml import default_nvml
        from lucebench.measure.power import PowerSampler, measure_idle_power

        nvml = default_nvml()
        if not nvml.available:
            return cls()
        run = cls()
        for index in devices:
            if known_idle_w and index in known_idle_w:
                run.idle_w[index] = known_idle_w[index]
                if console is not None:
                    console.log(f"idle power of GPU {index}: {known_idle_w[index]:.1f} W, as the run's earlier cells "
                                "measured it (one net-energy baseline a run)")
            elif idle_s > 0:
                if console is not None:
                    console.log(f"measuring idle power of GPU {index} for {idle_s:g} s")
                run.idle_w[index] = measure_idle_power(index, seconds=idle_s, nvml=nvml)
            sampler = PowerSampler(index, nvml=nvml)
            if sampler.available:
                sampler.start()
                run.samplers[index] = sampler
        return run

    def stop(self) -> None:
        for sampler in self.samplers.values():
            sampler.stop()

    def _sampler(self, device: int | None) -> Any:
        return self.samplers.get(device) if device is not None else None

    def energy(self, device: int | None, t0_ns: int, t1_ns: int) -> PhaseEnergy | None:
        """Energy of one window; None without power, or when the window is too short to resolve."""
        from lucebench.measure.records import phase_energy

        sampler = self._sampler(device)
        if sampler is None or t1_ns <= t0_ns:
            return None
        return phase_energy(sampler.energy_between(t0_ns, t1_ns, self.idle_w.get(device)))

    def energy_over(self, device: int | None, windows: list[tuple[int, int]]) -> PhaseEnergy | None:
        """Energy of all of one phase's windows.

        When the windows run back to back (busy share >= BUSY_SHARE_FOR_SPAN), their whole span is one
        long window that the energy counter resolves well: its energy scaled by the busy share. Otherwise
        the sum of the windows' energies (each measured as `energy` measures it), or an 'unavailable'
        record with the reason.
        """
        from lucebench.measure.records import phase_energy

        sampler = self._sampler(device)
        windows = sorted((a, b) for a, b in windows if b > a)
        if sampler is None or not windows:
            return None
        idle = self.idle_w.get(device)
        span0, span1 = windows[0][0], windows[-1][1]
        busy_ns = sum(b - a for a, b in windows)
        busy = busy_ns / (span1 - span0)
        if busy >= BUSY_SHARE_FOR_SPAN:
            span = sampler.energy_between(span0, span1, idle)
            if span.measured_j is not None:
                record = phase_energy(span)
                for name in ("energy_j", "energy_integrated_j", "energy_net_j"):
                    value = getattr(record, name)
                    setattr(record, name, value * busy if value is not None else None)
                record.window_s = busy_ns / 1e9
                record.note = (f"{len(windows)} back-to-back windows measured as one {(span1 - span0) / 1e9:.2f} s "
                               f"span, scaled by the busy share {busy:.1%}")
                return record
        summed = phase_energy(sampler.energy_over(windows, idle))
        if summed.method == "unavailable" and busy < BUSY_SHARE_FOR_SPAN:
            summed.note = f"{summed.note}; windows too far apart to measure as one span (busy {busy:.0%} of it)"
        return summed

    def trace(self, device: int | None, t0_ns: int, t1_ns: int) -> list[tuple[float, float]]:
        sampler = self._sampler(device)
        return sampler.trace(t0_ns, t1_ns, max_points=500) if sampler is not None else []


def earlier_idle_power(result: Result) -> dict[int, float]:
    """Idle power per GPU index that a run's cells measured on this machine (those without an
    `environment_id`; a --resume elsewhere keeps its cells under another environment). A resume reuses it, so
    that every cell's net energy of one run subtracts the same baseline: measured again, the same card read
    126 W right after the run's start-up work and 81 W at rest (one H200, 2026-11-22)."""
    found: dict[int, float] = {}
    for cell in result.cells:
        gpu = cell.params.get("gpu")
        if (cell.environment_id is None and cell.power is not None and cell.power.idle_power_w is not None
                and isinstance(gpu, int)):
            found.setdefault(gpu, cell.power.idle_power_w)
    return found
