"""The runner's energy per phase: back-to-back short windows are measured as one counter-resolved span."""

from __future__ import annotations

import time

import pytest

from lucebench.measure.fake import FakeGpu, FakeNvmlBackend
from lucebench.measure.nvml import Nvml
from lucebench.measure.power import PowerSampler
from lucebench.runner.power import RunPower


def _run_power(watts: float = 300.0) -> RunPower:
    nvml = Nvml(FakeNvmlBackend([FakeGpu(power=lambda t: watts, counter_period_s=0.1)]))
    sampler = PowerSampler(0, nvml=nvml)
    sampler.start()
    return RunPower(samplers={0: sampler}, idle_w={0: 100.0})


def test_back_to_back_windows_use_the_span():
    power = _run_power()
    try:
        time.sleep(0.2)
        t = time.monotonic_ns()
        # 40 windows of 28 ms every 30 ms (pp520-like prefills with a 2 ms round trip between them)
        windows = [(t + i * 30_000_000, t + i * 30_000_000 + 28_000_000) for i in range(40)]
        time.sleep(1.35)
        energy = power.energy_over(0, windows)
    finally:
        power.stop()
    assert energy is not None and "back-to-back" in energy.note
    assert energy.window_s == pytest.approx(40 * 0.028)
    assert energy.energy_j == pytest.approx(300.0 * 40 * 0.028, rel=0.05)
    assert energy.energy_net_j == pytest.approx(200.0 * 40 * 0.028, rel=0.08)


def test_sparse_short_windows_are_not_reported():
    power = _run_power()
    try:
        time.sleep(0.2)
        t = time.monotonic_ns()
        windows = [(t + i * 300_000_000, t + i * 300_000_000 + 20_000_000) for i in range(4)]  # 20 ms each
        time.sleep(1.1)
        energy = power.energy_over(0, windows)
    finally:
        power.stop()
    assert energy is not None and energy.method == "unavailable"
    assert "too short" in energy.note and "too far apart" in energy.note
