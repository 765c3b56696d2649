"""A thin wrapper over NVML (the `nvidia-ml-py` package, imported as `pynvml`).

Two layers:

* a *backend* (`NvmlBackend`): the handful of raw NVML calls lucebench uses, in NVML's own units
  (mW, mJ, MHz). `PynvmlBackend` forwards to pynvml; `lucebench.measure.fake.FakeNvmlBackend` simulates
  a GPU for tests. Backends raise `NvmlError` with NVML's return code.
* `Nvml`: what the rest of lucebench calls. Values in W, J-friendly units, `None` where the GPU or driver
  does not support a query (never 0 for "unknown"), and `available` False where there is no NVML library,
  no driver or no NVIDIA GPU.

No pydantic here: this module runs on bare device machines (scripts/device/check_power.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

log = logging.getLogger(__name__)

# NVML return codes lucebench distinguishes (values from nvml.h; identical in pynvml).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: "uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "invalid argument",
    NVML_ERROR_NOT_SUPPORTED: "not supported",
    NVML_ERROR_NO_PERMISSION: "insufficient permissions",
    NVML_ERROR_NOT_FOUND: "not found",
    NVML_ERROR_DRIVER_NOT_LOADED: "driver not loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML shared library not found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "function not found in this driver's NVML",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "unknown error",
}

# Clock event ("throttle") reason bits, nvml.h nvmlClocksEventReason*. Names are stable strings that go
# into results (PowerState.throttle_reasons).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

ClockKind = Literal["sm", "mem"]


class NvmlError(Exception):
    """An NVML call failed. ``code`` is NVML's return code (NVML_ERROR_*)."""

    def __init__(self, code: int, message: str | None = None):
        self.code = code
        self.message = message or _ERROR_NAMES.get(code, f"NVML error {code}")
        super().__init__(self.message)


class NvmlBackend(Protocol):
    """The raw NVML calls lucebench uses, in NVML units. Every method may raise `NvmlError`."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def name(self, h: Any) -> str: ...
    def uuid(self, h: Any) -> str: ...
    def vbios(self, h: Any) -> str: ...
    def pci_bus_id(self, h: Any) -> str: ...
    def memory_total(self, h: Any) -> int: ...
    def compute_capability(self, h: Any) -> tuple[int, int]: ...
    def total_energy_mj(self, h: Any) -> int: ...
    def power_usage_mw(self, h: Any) -> int: ...
    def power_instant_mw(self, h: Any) -> int: ...
    def power_limit_mw(self, h: Any) -> int: ...
    def power_default_limit_mw(self, h: Any) -> int: ...
    def power_limit_constraints_mw(self, h: Any) -> tuple[int, int]: ...
    def enforced_power_limit_mw(self, h: Any) -> int: ...
    def set_power_limit_mw(self, h: Any, milliwatts: int) -> None: ...
    def clock_mhz(self, h: Any, kind: ClockKind) -> int: ...
    def max_clock_mhz(self, h: Any, kind: ClockKind) -> int: ...
    def temperature_c(self, h: Any) -> int: ...
    def clock_event_reasons(self, h: Any) -> int: ...
    def ecc_mode(self, h: Any) -> tuple[int, int]: ...
    def compute_processes(self, h: Any) -> list[tuple[int, int | None]]: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """`NvmlBackend` over the real pynvml module. Import errors surface as NVML_ERROR_LIBRARY_NOT_FOUND."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py not installed
            raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND, f"pynvml not importable: {exc}") from exc
        self._n = pynvml

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._n.NVMLError as exc:
            raise NvmlError(int(getattr(exc, "value", NVML_ERROR_UNKNOWN)), str(exc)) from exc

    def init(self) -> None:
        self._call(self._n.nvmlInit)

    def shutdown(self) -> None:
        self._call(self._n.nvmlShutdown)

    def device_count(self) -> int:
        return int(self._call(self._n.nvmlDeviceGetCount))

    def handle(self, index: int) -> Any:
        return self._call(self._n.nvmlDeviceGetHandleByIndex, index)

    def name(self, h: Any) -> str:
        return _text(self._call(self._n.nvmlDeviceGetName, h))

    def uuid(self, h: Any) -> str:
        return _text(self._call(self._n.nvmlDeviceGetUUID, h))

    def vbios(self, h: Any) -> str:
        return _text(self._call(self._n.nvmlDeviceGetVbiosVersion, h))

    def pci_bus_id(self, h: Any) -> str:
        return _text(self._call(self._n.nvmlDeviceGetPciInfo, h).busId)

    def memory_total(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetMemoryInfo, h).total)

    def compute_capability(self, h: Any) -> tuple[int, int]:
        major, minor = self._call(self._n.nvmlDeviceGetCudaComputeCapability, h)
        return int(major), int(minor)

    def total_energy_mj(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetTotalEnergyConsumption, h))

    def power_usage_mw(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetPowerUsage, h))

    def power_instant_mw(self, h: Any) -> int:
        # NVML_FI_DEV_POWER_INSTANT: the instantaneous reading. nvmlDeviceGetPowerUsage is a 1 s average
        # on Ampere (except GA100) and newer, which smears phase boundaries.
        values = self._call(self._n.nvmlDeviceGetFieldValues, h, [self._n.NVML_FI_DEV_POWER_INSTANT])
        v = values[0]
        if v.nvmlReturn != NVML_SUCCESS:
            raise NvmlError(int(v.nvmlReturn))
        by_type = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
        return int(getattr(v.value, by_type.get(int(v.valueType), "uiVal")))

    def power_limit_mw(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetPowerManagementLimit, h))

    def power_default_limit_mw(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetPowerManagementDefaultLimit, h))

    def power_limit_constraints_mw(self, h: Any) -> tuple[int, int]:
        lo, hi = self._call(self._n.nvmlDeviceGetPowerManagementLimitConstraints, h)
        return int(lo), int(hi)

    def enforced_power_limit_mw(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetEnforcedPowerLimit, h))

    def set_power_limit_mw(self, h: Any, milliwatts: int) -> None:
        self._call(self._n.nvmlDeviceSetPowerManagementLimit, h, int(milliwatts))

    def clock_mhz(self, h: Any, kind: ClockKind) -> int:
        clock = self._n.NVML_CLOCK_SM if kind == "sm" else self._n.NVML_CLOCK_MEM
        return int(self._call(self._n.nvmlDeviceGetClockInfo, h, clock))

    def max_clock_mhz(self, h: Any, kind: ClockKind) -> int:
        clock = self._n.NVML_CLOCK_SM if kind == "sm" else self._n.NVML_CLOCK_MEM
        return int(self._call(self._n.nvmlDeviceGetMaxClockInfo, h, clock))

    def temperature_c(self, h: Any) -> int:
        return int(self._call(self._n.nvmlDeviceGetTemperature, h, self._n.NVML_TEMPERATURE_GPU))

    def clock_event_reasons(self, h: Any) -> int:
        fn = getattr(self._n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return int(self._call(fn, h))
            except NvmlError as exc:  # drivers older than 535 lack the new name
                if exc.code != NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
        return int(self._call(self._n.nvmlDeviceGetCurrentClocksThrottleReasons, h))

    def ecc_mode(self, h: Any) -> tuple[int, int]:
        current, pending = self._call(self._n.nvmlDeviceGetEccMode, h)
        return int(current), int(pending)

    def compute_processes(self, h: Any) -> list[tuple[int, int | None]]:
        out = []
        for proc in self._call(self._n.nvmlDeviceGetComputeRunningProcesses, h):
            used = getattr(proc, "usedGpuMemory", None)
            # NVML_VALUE_NOT_AVAILABLE (all bits set) where the driver cannot attribute memory (e.g. in a container)
            out.append((int(proc.pid), None if used is None or used >= 2**63 else int(used)))
        return out

    def driver_version(self) -> str:
        return _text(self._call(self._n.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._call(self._n.nvmlSystemGetCudaDriverVersion))


@dataclass(frozen=True)
class PowerLimits:
    """Power limits in W; None where NVML does not report them."""

    current_w: float | None
    default_w: float | None
    min_w: float | None
    max_w: float | None
    enforced_w: float | None


@dataclass(frozen=True)
class Clocks:
    sm_mhz: int | None
    mem_mhz: int | None
    sm_max_mhz: int | None
    mem_max_mhz: int | None


@dataclass(frozen=True)
class DeviceInfo:
    """Static facts of one GPU (the GpuInfo fields that do not change while running)."""

    index: int
    name: str
    uuid: str | None = None
    vbios: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    compute_capability: str | None = None
    ecc_enabled: bool | None = None
    energy_counter: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


T = TypeVar("T")


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the set bits of an NVML clock event (throttle) reason mask, unknown bits as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def format_cuda_version(value: int) -> str:
    """NVML's CUDA driver version integer (e.g. 12080) as "12.8"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


class Nvml:
    """NVML session: `available` tells whether GPU queries can work at all; queries return None where a
    single value is not supported by this GPU or driver.

    ``backend``: an `NvmlBackend`; None uses pynvml. Initialisation failures (no library, no driver, no
    GPU) leave ``available`` False with ``reason`` saying why; they never raise.
    """

    def __init__(self, backend: NvmlBackend | None = None):
        self.reason: str | None = None
        self._backend: NvmlBackend | None = None
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._count = 0
        try:
            self._backend = backend if backend is not None else PynvmlBackend()
            self._backend.init()
            self._count = self._backend.device_count()
        except NvmlError as exc:
            self.reason = f"NVML unavailable: {exc.message}"
            self._backend = None
            return
        if self._count == 0:
            self.reason = "no NVIDIA GPU found by NVML"

    # -- session
    @property
    def available(self) -> bool:
        """True when NVML initialised and sees at least one GPU."""
        return self._backend is not None and self._count > 0

    @property
    def backend(self) -> NvmlBackend:
        if self._backend is None:
            raise NvmlError(NVML_ERROR_UNINITIALIZED, self.reason)
        return self._backend

    def shutdown(self) -> None:
        """Release NVML (reference-counted by NVML itself, so other sessions stay valid)."""
        if self._backend is not None:
            try:
                self._backend.shutdown()
            except NvmlError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
            self._backend = None
            self._handles.clear()

    def __enter__(self) -> Nvml:  # noqa: PYI034  (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def device_count(self) -> int:
        return self._count if self._backend is not None else 0

    def handle(self, index: int) -> Any:
        """The NVML handle of GPU ``index``; raises NvmlError when out of range or unavailable."""
        with self._lock:
            if index not in self._handles:
                if not self.available or not 0 <= index < self._count:
                    raise NvmlError(NVML_ERROR_INVALID_ARGUMENT,
                                    f"no GPU with index {index} (NVML sees {self.device_count()})")
                self._handles[index] = self.backend.handle(index)
            return self._handles[index]

    def _opt(self, fn: Callable[[], T]) -> T | None:
        """Run an optional query: None when unsupported or failing (logged at debug level)."""
        try:
            return fn()
        except NvmlError as exc:
            log.debug("NVML query failed: %s", exc)
            return None

    # -- power and energy
    def energy_mj(self, index: int) -> int | None:
        """Total energy since driver load in mJ (Volta and newer), None where unsupported."""
        return self._opt(lambda: self.backend.total_energy_mj(self.handle(index)))

    def power_w(self, index: int) -> float | None:
        """Board power in W as nvmlDeviceGetPowerUsage reports it (1 s average on Ampere+), None if unknown."""
        mw = self._opt(lambda: self.backend.power_usage_mw(self.handle(index)))
        return None if mw is None else mw / 1000.0

    def power_instant_w(self, index: int) -> float | None:
        """Instantaneous board power in W (NVML_FI_DEV_POWER_INSTANT), None where the driver lacks it."""
        mw = self._opt(lambda: self.backend.power_instant_mw(self.handle(index)))
        return None if mw is None or mw <= 0 else mw / 1000.0

    def power_limits(self, index: int) -> PowerLimits:
        """Current, default, min, max and enforced power limits in W (each None if not reported)."""
        h = self.handle(index)
        b = self.backend
        cons = self._opt(lambda: b.power_limit_constraints_mw(h))
        def w(mw):
            return (None if mw is None else mw / 1000.0)
        return PowerLimits(
            current_w=w(self._opt(lambda: b.power_limit_mw(h))),
            default_w=w(self._opt(lambda: b.power_default_limit_mw(h))),
            min_w=None if cons is None else cons[0] / 1000.0,
            max_w=None if cons is None else cons[1] / 1000.0,
            enforced_w=w(self._opt(lambda: b.enforced_power_limit_mw(h))),
        )

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Set the power limit (needs root or admin); raises NvmlError (e.g. NVML_ERROR_NO_PERMISSION)."""
        self.backend.set_power_limit_mw(self.handle(index), round(watts * 1000))

    # -- clocks, temperature, reasons
    def clocks(self, index: int) -> Clocks:
        h = self.handle(index)
        b = self.backend
        return Clocks(
            sm_mhz=self._opt(lambda: b.clock_mhz(h, "sm")),
            mem_mhz=self._opt(lambda: b.clock_mhz(h, "mem")),
            sm_max_mhz=self._opt(lambda: b.max_clock_mhz(h, "sm")),
            mem_max_mhz=self._opt(lambda: b.max_clock_mhz(h, "mem")),
        )

    def temperature_c(self, index: int) -> float | None:
        t = self._opt(lambda: self.backend.temperature_c(self.handle(index)))
        return None if t is None else float(t)

    def throttle_reasons(self, index: int) -> list[str] | None:
        """Active clock event reasons by name (e.g. ["sw_power_cap"]); [] when none, None if unknown."""
        mask = self._opt(lambda: self.backend.clock_event_reasons(self.handle(index)))
        return None if mask is None else decode_clock_event_reasons(mask)

    def compute_processes(self, index: int) -> list[tuple[int, int | None]] | None:
        """(pid, GPU memory bytes or None) of every process with a compute context on GPU ``index``, None if
        unknown. The pids are in NVML's (the host's) pid namespace."""
        return self._opt(lambda: self.backend.compute_processes(self.handle(index)))

    def ecc_enabled(self, index: int) -> bool | None:
        mode = self._opt(lambda: self.backend.ecc_mode(self.handle(index)))
        return None if mode is None else bool(mode[0])

    # -- identity
    def device_info(self, index: int) -> DeviceInfo:
        """Name, UUID, VBIOS, PCI bus id, memory, compute capability, ECC and energy-counter support."""
        h = self.handle(index)
        b = self.backend
        cc = self._opt(lambda: b.compute_capability(h))
        return DeviceInfo(
            index=index,
            name=self._opt(lambda: b.name(h)) or f"GPU {index}",
            uuid=self._opt(lambda: b.uuid(h)),
            vbios=self._opt(lambda: b.vbios(h)),
            pci_bus_id=self._opt(lambda: b.pci_bus_id(h)),
            memory_total_bytes=self._opt(lambda: b.memory_total(h)),
            compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
            ecc_enabled=self.ecc_enabled(index),
            energy_counter=self.energy_mj(index) is not None,
        )

    def driver_version(self) -> str | None:
        return self._opt(lambda: self.backend.driver_version()) if self._backend else None

    def cuda_driver_version(self) -> str | None:
        """The CUDA version the driver supports, e.g. "12.8" (driver API, not the toolkit)."""
        if self._backend is None:
            return None
        v = self._opt(lambda: self.backend.cuda_driver_version())
        return None if v is None else format_cuda_version(v)


_default: Nvml | None = None
_default_lock = threading.Lock()


def default_nvml() -> Nvml:
    """The process-wide NVML session over pynvml, created on first use (NVML is thread-safe)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Nvml()
        return _default


def resolve(nvml: Nvml | None) -> Nvml:
    """``nvml`` or the process-wide session: the convention of every `nvml=None` parameter here."""
    return nvml if nvml is not None else default_nvml()
