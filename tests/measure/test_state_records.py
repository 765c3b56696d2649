"""read_gpu_state and the conversion of measurement results into result-schema models."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebench.measure.energy import EnergyResult
from lucebench.measure.fake import FakeGpu, FakeNvmlBackend, no_nvml_backend
from lucebench.measure.nvml import Nvml
from lucebench.measure.power_limit import LimitState
from lucebench.measure.records import phase_energy, power_state
from lucebench.measure.state import read_gpu_state
from lucebench.results.schema import PhaseEnergy, PowerState


def test_gpu_state_keys_are_power_state_fields():
    gpu = FakeGpu(limit_mw=450_000, reasons_mask=0x004, temperature=67, clocks_mhz={"sm": 1755, "mem": 2619})
    state = read_gpu_state(0, nvml=Nvml(FakeNvmlBackend([gpu])))
    assert state == {"limit_w": 450.0, "default_limit_w": 700.0, "sm_clock_mhz": 1755, "mem_clock_mhz": 2619,
                     "temperature_c": 67.0, "throttle_reasons": ["sw_power_cap"]}
    assert set(state) <= set(PowerState.model_fields)


def test_gpu_state_without_nvml_or_out_of_range():
    empty = read_gpu_state(0, nvml=Nvml(no_nvml_backend()))
    assert empty["limit_w"] is None and empty["throttle_reasons"] == []
    assert read_gpu_state(4, nvml=Nvml(FakeNvmlBackend())) == empty


def test_power_state_model():
    state = {"limit_w": 300.0, "default_limit_w": 700.0, "sm_clock_mhz": 1500, "mem_clock_mhz": None,
             "temperature_c": 60.0, "throttle_reasons": ["sw_power_cap"]}
    model = power_state(state, limit=LimitState(300.0, True, 300.0, 700.0), idle_power_w=75.5)
    assert model == PowerState(requested_limit_w=300.0, applied=True, limit_w=300.0, default_limit_w=700.0,
                               idle_power_w=75.5, temperature_c=60.0, sm_clock_mhz=1500,
                               throttle_reasons=["sw_power_cap"])
    skipped = power_state(None, requested_limit_w=250.0)
    assert skipped.requested_limit_w == 250.0 and skipped.applied is False


def test_phase_energy_model_round_trips_every_field():
    r = EnergyResult(window_s=2.5, energy_j=1000.0, energy_integrated_j=990.0, energy_net_j=800.0,
                     avg_power_w=400.0, peak_power_w=420.0, method="counter", note=None)
    model = phase_energy(r)
    assert isinstance(model, PhaseEnergy) and model.model_dump() == r.to_dict()
    assert phase_energy(EnergyResult(window_s=0.01, note="window too short")).energy_j is None


@pytest.mark.parametrize("method", ["counter", "integrated", "unavailable"])
def test_methods_are_schema_literals(method):
    assert phase_energy(EnergyResult(window_s=1.0, method=method)).method == method


def test_other_gpu_processes_leave_this_process_and_the_excluded_out():
    import os

    from lucebench.measure.fake import FakeGpu, FakeNvmlBackend
    from lucebench.measure.nvml import Nvml
    from lucebench.measure.state import describe_process, other_gpu_processes

    nv = Nvml(FakeNvmlBackend([FakeGpu(processes=[(os.getpid(), None), (2**22 + 1, None), (2**22 + 2, 2**30)])]))
    assert other_gpu_processes(0, exclude=[2**22 + 1], nvml=nv) == [f"pid {2**22 + 2} (not visible from here) (1024 MiB)"]
    assert other_gpu_processes(1, nvml=nv) is None  # no such GPU
    # a visible process is named by its command
    argv0 = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert describe_process(os.getpid(), None) == f"pid {os.getpid()} {argv0}"
    assert describe_process(os.getpid(), 3 * 2**20) == f"pid {os.getpid()} {argv0} (3 MiB)"
