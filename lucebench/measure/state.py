"""The GPU's power-relevant state at the time of a cell (limit, clocks, temperature, throttle reasons) and the
other processes computing on it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lucebench.measure.nvml import Nvml, resolve


def describe_process(pid: int, used_bytes: int | None) -> str:
    """"pid N COMMAND (M MiB)": the command from /proc where this process can see it (a pid of another
    namespace, e.g. from inside a container, shows as "not visible from here")."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    text = f"pid {pid} {argv0 or '(not visible from here)'}"
    return text if used_bytes is None else f"{text} ({used_bytes / 2**20:.0f} MiB)"


def other_gpu_processes(device_index: int, exclude: Iterable[int] = (), nvml: Nvml | None = None) -> list[str] | None:
    """Processes other than this one (and ``exclude``) with a compute context on GPU ``device_index``, described
    by `describe_process`; None where NVML cannot tell. A process left on the card (a hung engine, another job)
    time-slices with the measured engine and silently slows it: lucebench reads this before each cell."""
    nv = resolve(nvml)
    if not nv.available or not 0 <= device_index < nv.device_count():
        return None
    procs = nv.compute_processes(device_index)
    if procs is None:
        return None
    ours = {os.getpid(), *exclude}
    return [describe_process(pid, used) for pid, used in procs if pid not in ours]


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
