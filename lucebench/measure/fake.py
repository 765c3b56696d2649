"""A simulated NVML backend (test double) for tests of lucebench.measure and of the runner.

`FakeNvmlBackend` implements `lucebench.measure.nvml.NvmlBackend` over simulated GPUs (`FakeGpu`):

* power follows a profile (a function of monotonic time in seconds), capped by the power limit;
* the total-energy counter is the exact integral of that power, but only refreshed every
  ``counter_period_s`` (real counters update every ~20-100 ms), so short windows behave as on hardware;
* nvmlDeviceGetPowerUsage can be a trailing average (``power_average_s``, 1 s on Ampere+ GPUs);
* limits, permissions (NVML_ERROR_NO_PERMISSION on set), unsupported queries and arbitrary failures
  (``fail``: method name -> NVML error code) are configurable;
* with ``state_file`` the power limits and the log of set calls live in a JSON file, so a test can
  check what a killed subprocess left behind.

Nothing here touches a real GPU.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lucebench.measure.nvml import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    ClockKind,
    NvmlError,
)

_STEP_S = 0.0005  # integration step of the simulated energy counter


@dataclass
class FakeGpu:
    """One simulated GPU. Powers in W, limits in mW (as NVML stores them)."""

    name: str = "NVIDIA Fake H200"
    uuid: str = "GPU-00000000-fake-0000-0000-000000000000"
    vbios: str = "96.00.00.00.01"
    pci_bus_id: str = "00000000:01:00.0"
    memory_total: int = 150_754_820_096
    compute_capability: tuple[int, int] = (9, 0)
    power: Callable[[float], float] = field(default=lambda t: 80.0)  # W at monotonic time t (s)
    limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    counter_period_s: float = 0.05
    power_average_s: float = 0.0  # >0: nvmlDeviceGetPowerUsage is a trailing average over this many s
    energy_supported: bool = True
    power_supported: bool = True
    instant_supported: bool = True
    can_set_limit: bool = True
    clocks_mhz: dict[str, int] = field(default_factory=lambda: {"sm": 1980, "mem": 2619})
    max_clocks_mhz: dict[str, int] = field(default_factory=lambda: {"sm": 1980, "mem": 2619})
    temperature: int = 41
    reasons_mask: int = 0x001
    ecc: tuple[int, int] = (1, 1)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # compute contexts: (pid, bytes)


class FakeNvmlBackend:
    """`NvmlBackend` over `FakeGpu`s. ``init_error``: an NVML error code that nvmlInit raises (e.g.
    NVML_ERROR_LIBRARY_NOT_FOUND for "no NVML"); ``gpus=[]`` simulates NVML without GPUs."""

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: int | None = None,
                 fail: dict[str, int] | None = None, state_file: str | os.PathLike[str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.gpus = [FakeGpu()] if gpus is None else gpus
        self.init_error = init_error
        self.fail = dict(fail or {})
        self.state_file = Path(state_file) if state_file is not None else None
        self.clock = clock
        self.calls: list[str] = []
        self.set_calls: list[tuple[int, int]] = []
        self.initialised = 0
        self._lock = threading.Lock()
        t0 = clock()
        # per GPU: (time integrated up to, energy J so far)
        self._integ = [(t0, 0.0) for _ in self.gpus]
        if self.state_file is not None and not self.state_file.exists():
            self._save({"limits_mw": [g.limit_mw for g in self.gpus], "set_calls": []})

    # -- state file
    def _load(self) -> dict[str, Any]:
        assert self.state_file is not None
        return json.loads(self.state_file.read_text())

    def _save(self, state: dict[str, Any]) -> None:
        assert self.state_file is not None
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)  # atomic, so a killed writer never leaves half a file

    def _limit(self, i: int) -> int:
        if self.state_file is not None:
            return int(self._load()["limits_mw"][i])
        return self.gpus[i].limit_mw

    # -- helpers
    def _check(self, method: str) -> None:
        self.calls.append(method)
        if method in self.fail:
            raise NvmlError(self.fail[method])

    def _gpu(self, h: Any) -> tuple[int, FakeGpu]:
        if not isinstance(h, int) or not 0 <= h < len(self.gpus):
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT)
        return h, self.gpus[h]

    def _true_power(self, i: int, t: float) -> float:
        g = self.gpus[i]
        return min(g.power(t), g.limit_mw / 1000.0)

    def _energy_at(self, i: int, t: float) -> float:
        """Exact (to the integration step) energy in J from backend creation to time t (t not decreasing)."""
        with self._lock:
            t_done, e = self._integ[i]
            while t_done < t:
                dt = min(_STEP_S, t - t_done)
                e += 0.5 * (self._true_power(i, t_done) + self._true_power(i, t_done + dt)) * dt
                t_done += dt
            self._integ[i] = (t_done, e)
            return e

    # -- NvmlBackend
    def init(self) -> None:
        self._check("init")
        if self.init_error is not None:
            raise NvmlError(self.init_error)
        self.initialised += 1

    def shutdown(self) -> None:
        self._check("shutdown")
        self.initialised -= 1

    def device_count(self) -> int:
        self._check("device_count")
        return len(self.gpus)

    def handle(self, index: int) -> Any:
        self._check("handle")
        self._gpu(index)
        return index

    def name(self, h: Any) -> str:
        self._check("name")
        return self._gpu(h)[1].name

    def uuid(self, h: Any) -> str:
        self._check("uuid")
        return self._gpu(h)[1].uuid

    def vbios(self, h: Any) -> str:
        self._check("vbios")
        return self._gpu(h)[1].vbios

    def pci_bus_id(self, h: Any) -> str:
        self._check("pci_bus_id")
        return self._gpu(h)[1].pci_bus_id

    def memory_total(self, h: Any) -> int:
        self._check("memory_total")
        return self._gpu(h)[1].memory_total

    def compute_capability(self, h: Any) -> tuple[int, int]:
        self._check("compute_capability")
        return self._gpu(h)[1].compute_capability

    def total_energy_mj(self, h: Any) -> int:
        self._check("total_energy_mj")
        i, g = self._gpu(h)
        if not g.energy_supported:
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED)
        now = self.clock()
        # The counter holds the value of its last refresh tick (ticks on a fixed grid of monotonic time).
        tick = math.floor(now / g.counter_period_s) * g.counter_period_s
        return int(self._energy_at(i, max(tick, self._integ[i][0])) * 1000)

    def power_usage_mw(self, h: Any) -> int:
        self._check("power_usage_mw")
        i, g = self._gpu(h)
        if not g.power_supported:
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED)
        now = self.clock()
        if g.power_average_s <= 0:
            return int(self._true_power(i, now) * 1000)
        n = 50
        pts = [self._true_power(i, now - g.power_average_s * k / (n - 1)) for k in range(n)]
        return int(sum(pts) / n * 1000)

    def power_instant_mw(self, h: Any) -> int:
        self._check("power_instant_mw")
        i, g = self._gpu(h)
        if not (g.power_supported and g.instant_supported):
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED)
        return int(self._true_power(i, self.clock()) * 1000)

    def power_limit_mw(self, h: Any) -> int:
        self._check("power_limit_mw")
        i, _ = self._gpu(h)
        return self._limit(i)

    def power_default_limit_mw(self, h: Any) -> int:
        self._check("power_default_limit_mw")
        return self._gpu(h)[1].default_limit_mw

    def power_limit_constraints_mw(self, h: Any) -> tuple[int, int]:
        self._check("power_limit_constraints_mw")
        g = self._gpu(h)[1]
        return g.min_limit_mw, g.max_limit_mw

    def enforced_power_limit_mw(self, h: Any) -> int:
        self._check("enforced_power_limit_mw")
        i, _ = self._gpu(h)
        return self._limit(i)

    def set_power_limit_mw(self, h: Any, milliwatts: int) -> None:
        self._check("set_power_limit_mw")
        i, g = self._gpu(h)
        if not g.can_set_limit:
            raise NvmlError(NVML_ERROR_NO_PERMISSION)
        if not g.min_limit_mw <= milliwatts <= g.max_limit_mw:
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT)
        self._energy_at(i, self.clock())  # integrate up to now under the old limit
        g.limit_mw = int(milliwatts)
        self.set_calls.append((i, int(milliwatts)))
        if self.state_file is not None:
            state = self._load()
            state["limits_mw"][i] = int(milliwatts)
            state["set_calls"].append([i, int(milliwatts)])
            self._save(state)

    def clock_mhz(self, h: Any, kind: ClockKind) -> int:
        self._check("clock_mhz")
        return self._gpu(h)[1].clocks_mhz[kind]

    def max_clock_mhz(self, h: Any, kind: ClockKind) -> int:
        self._check("max_clock_mhz")
        return self._gpu(h)[1].max_clocks_mhz[kind]

    def temperature_c(self, h: Any) -> int:
        self._check("temperature_c")
        return self._gpu(h)[1].temperature

    def clock_event_reasons(self, h: Any) -> int:
        self._check("clock_event_reasons")
        return self._gpu(h)[1].reasons_mask

    def ecc_mode(self, h: Any) -> tuple[int, int]:
        self._check("ecc_mode")
        return self._gpu(h)[1].ecc

    def compute_processes(self, h: Any) -> list[tuple[int, int | None]]:
        self._check("compute_processes")
        return list(self._gpu(h)[1].processes)

    def driver_version(self) -> str:
        self._check("driver_version")
        return "570.124.06"

    def cuda_driver_version(self) -> int:
        self._check("cuda_driver_version")
        return 12080


def no_nvml_backend() -> FakeNvmlBackend:
    """A backend whose nvmlInit fails as on a machine without the NVIDIA driver."""
    return FakeNvmlBackend(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
