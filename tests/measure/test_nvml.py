"""lucebench.measure.nvml against the simulated backend (and the real pynvml where there is no GPU)."""

from __future__ import annotations

import pytest

from lucebench.measure.fake import FakeGpu, FakeNvmlBackend, no_nvml_backend
from lucebench.measure.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_NOT_SUPPORTED,
    Nvml,
    NvmlError,
    decode_clock_event_reasons,
    format_cuda_version,
)


def test_no_library_means_unavailable_not_zero():
    nv = Nvml(no_nvml_backend())
    assert not nv.available
    assert "NVML unavailable" in (nv.reason or "")
    assert nv.device_count() == 0
    assert nv.driver_version() is None and nv.cuda_driver_version() is None
    with pytest.raises(NvmlError):
        nv.handle(0)


def test_driver_not_loaded_and_no_gpus():
    assert not Nvml(FakeNvmlBackend(init_error=NVML_ERROR_DRIVER_NOT_LOADED)).available
    nv = Nvml(FakeNvmlBackend(gpus=[]))
    assert not nv.available and nv.reason == "no NVIDIA GPU found by NVML"


def test_real_pynvml_without_gpu_is_unavailable_or_sees_gpus():
    nv = Nvml()  # this machine: real pynvml; on a GPU machine it sees devices
    assert nv.available == (nv.device_count() > 0)
    if not nv.available:
        assert nv.reason


def test_units_and_identity():
    gpu = FakeGpu(power=lambda t: 123.456, limit_mw=650_000, default_limit_mw=700_000)
    nv = Nvml(FakeNvmlBackend([gpu]))
    assert nv.available and nv.device_count() == 1
    assert nv.power_w(0) == pytest.approx(123.456)
    assert nv.power_instant_w(0) == pytest.approx(123.456)
    assert isinstance(nv.energy_mj(0), int)
    limits = nv.power_limits(0)
    assert (limits.current_w, limits.default_w, limits.min_w, limits.max_w) == (650.0, 700.0, 200.0, 700.0)
    clocks = nv.clocks(0)
    assert (clocks.sm_mhz, clocks.mem_mhz, clocks.sm_max_mhz) == (1980, 2619, 1980)
    assert nv.temperature_c(0) == 41.0
    assert nv.throttle_reasons(0) == ["gpu_idle"]
    info = nv.device_info(0)
    assert info.name == "NVIDIA Fake H200" and info.compute_capability == "9.0"
    assert info.ecc_enabled is True and info.energy_counter is True
    assert nv.driver_version() == "570.124.06" and nv.cuda_driver_version() == "12.8"


def test_unsupported_queries_are_none():
    gpu = FakeGpu(energy_supported=False, power_supported=False)
    nv = Nvml(FakeNvmlBackend([gpu], fail={"temperature_c": NVML_ERROR_NOT_SUPPORTED,
                                            "ecc_mode": NVML_ERROR_NOT_SUPPORTED}))
    assert nv.energy_mj(0) is None
    assert nv.power_w(0) is None and nv.power_instant_w(0) is None
    assert nv.temperature_c(0) is None
    info = nv.device_info(0)
    assert info.energy_counter is False and info.ecc_enabled is None


def test_index_out_of_range():
    nv = Nvml(FakeNvmlBackend())
    with pytest.raises(NvmlError, match="no GPU with index 3"):
        nv.handle(3)


def test_decode_reasons_and_cuda_version():
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x004 | 0x040) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_clock_event_reasons(0x1000) == ["unknown_0x1000"]
    assert format_cuda_version(12080) == "12.8"
    assert format_cuda_version(13000) == "13.0"


def test_shutdown_is_reference_balanced():
    backend = FakeNvmlBackend()
    with Nvml(backend) as nv:
        assert backend.initialised == 1
        assert nv.available
    assert backend.initialised == 0
