"""The runner's view of power: one sampler per GPU for the whole run, idle power, energy per window.

Bridges lucebench.measure (NVML) to the result schema. Without an NVIDIA GPU every energy value is
None ("unavailable"), never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lucebench.results.schema import PhaseEnergy


def to_phase_energy(raw: Any) -> PhaseEnergy:
    """Convert lucebench.measure's plain energy record into the schema's PhaseEnergy."""
    return PhaseEnergy(
        window_s=float(raw.window_s),
        energy_j=raw.energy_j,
        energy_integrated_j=raw.energy_integrated_j,
        energy_net_j=raw.energy_net_j,
        avg_power_w=raw.avg_power_w,
        peak_power_w=raw.peak_power_w,
        method=raw.method,
        note=raw.note,
    )


@dataclass
class RunPower:
    """Samplers and idle power per device index; empty on machines without NVML GPUs."""

    samplers: dict[int, Any] = field(default_factory=dict)
    idle_w: dict[int, float | None] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return bool(self.samplers)

    @classmethod
    def start(cls, devices: list[int], idle_s: float, console: Any = None) -> RunPower:
        """Measure idle power on each device, then start a background sampler on each."""
        from lucebench.measure import power as mpower
        from lucebench.measure.nvml import Nvml

        nvml = Nvml.open()
        if not nvml.available:
            return cls()
        run = cls()
        for index in devices:
            if console is not None:
                console.log(f"measuring idle power of GPU {index} for {idle_s:g} s")
            run.idle_w[index] = mpower.measure_idle_power(index, seconds=idle_s, nvml=nvml) if idle_s > 0 else None
            sampler = mpower.PowerSampler(index, nvml=nvml)
            sampler.start()
            run.samplers[index] = sampler
        return run

    def stop(self) -> None:
        for sampler in self.samplers.values():
            sampler.stop()

    def energy(self, device: int | None, t0_ns: int, t1_ns: int) -> PhaseEnergy | None:
        sampler = self.samplers.get(device) if device is not None else None
        if sampler is None or t1_ns <= t0_ns:
            return None
        return to_phase_energy(sampler.energy_between(t0_ns, t1_ns, self.idle_w.get(device)))

    def energy_over(self, device: int | None, windows: list[tuple[int, int]]) -> PhaseEnergy | None:
        sampler = self.samplers.get(device) if device is not None else None
        windows = [(a, b) for a, b in windows if b > a]
        if sampler is None or not windows:
            return None
        return to_phase_energy(sampler.energy_over(windows, self.idle_w.get(device)))

    def trace(self, device: int | None, t0_ns: int, t1_ns: int) -> list[tuple[float, float]]:
        sampler = self.samplers.get(device) if device is not None else None
        return sampler.trace(t0_ns, t1_ns, max_points=500) if sampler is not None else []
