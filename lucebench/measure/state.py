"""The GPU's power-relevant state at the time of a cell (limit, clocks, temperature, throttle reasons)."""

from __future__ import annotations

from typing import Any

from lucebench.measure.nvml import Nvml, resolve


def read_gpu_state(device_index: int, nvml: Nvml | None = None) -> dict[str, Any]:
    """Current state of GPU ``device_index`` with keys named as lucebench.results.schema.PowerState fields:
    ``limit_w``, ``default_limit_w``, ``sm_clock_mhz``, ``mem_clock_mhz``, ``temperature_c``,
    ``throttle_reasons`` (list of names, e.g. ["sw_power_cap"]). Values are None (reasons: []) where NVML
    or the GPU cannot tell; the dict is all-None when NVML is unavailable.

    Read it while the cell's load runs (or just after) so clocks and reasons describe the measured work.
    """
    state: dict[str, Any] = {"limit_w": None, "default_limit_w": None, "sm_clock_mhz": None,
                             "mem_clock_mhz": None, "temperature_c": None, "throttle_reasons": []}
    nv = resolve(nvml)
    if not nv.available or not 0 <= device_index < nv.device_count():
        return state
    limits = nv.power_limits(device_index)
    clocks = nv.clocks(device_index)
    state.update(limit_w=limits.current_w, default_limit_w=limits.default_w, sm_clock_mhz=clocks.sm_mhz,
                 mem_clock_mhz=clocks.mem_mhz, temperature_c=nv.temperature_c(device_index),
                 throttle_reasons=nv.throttle_reasons(device_index) or [])
    return state
