"""PowerSampler on a simulated GPU, in real time (short windows keep the suite fast).

Windows here are short (0.15-1.2 s) and the sampler thread competes for the CPU, so change points can be
off by a sampling interval: tolerances are a few percent. The exact arithmetic is in test_energy.py.
"""

from __future__ import annotations

import time

import pytest

from lucebench.measure.fake import FakeGpu, FakeNvmlBackend, no_nvml_backend
from lucebench.measure.nvml import Nvml
from lucebench.measure.power import PowerSampler, measure_idle_power


def fake(**kw) -> Nvml:
    return Nvml(FakeNvmlBackend([FakeGpu(**kw)]))


def test_sampler_rate_counter_period_and_energy():
    t_on = time.monotonic() + 0.25
    def load(t):
        return 450.0 if t_on <= t < t_on + 1.4 else 90.0
    with PowerSampler(0, nvml=fake(power=load, counter_period_s=0.05)) as s:
        time.sleep(1.8)
        assert s.sample_rate_hz() >= 20
        assert s.counter_period_s() == pytest.approx(0.05, rel=0.2)
        assert s.power_source == "instant"
        t0, t1 = int((t_on + 0.1) * 1e9), int((t_on + 1.3) * 1e9)
        r = s.energy_between(t0, t1, idle_w=90.0)
    assert r.method == "counter"
    assert r.energy_j == pytest.approx(450 * 1.2, rel=0.03)
    assert r.energy_integrated_j == pytest.approx(450 * 1.2, rel=0.03)
    assert r.energy_net_j == pytest.approx(360 * 1.2, rel=0.04)
    assert r.peak_power_w == 450.0
    samples = s.samples()
    assert all(isinstance(mj, int) and w is not None for _, mj, w in samples)
    assert [t for t, _, _ in samples] == sorted(t for t, _, _ in samples)


def test_energy_between_waits_for_the_counter_to_pass_the_window_end():
    with PowerSampler(0, nvml=fake(power=lambda t: 300.0, counter_period_s=0.1)) as s:
        time.sleep(0.5)
        t0 = time.monotonic_ns()
        time.sleep(0.3)
        t1 = time.monotonic_ns()
        r = s.energy_between(t0, t1)  # right after the window: must wait for the next counter update
    assert r.energy_j == pytest.approx(300 * (t1 - t0) / 1e9, rel=0.06)


def test_short_windows_and_energy_over():
    with PowerSampler(0, nvml=fake(power=lambda t: 200.0, counter_period_s=0.1)) as s:
        time.sleep(0.3)
        base = time.monotonic_ns()
        time.sleep(0.9)
        short = s.energy_between(base, base + 30_000_000)
        assert short.energy_j is None and short.too_short
        wins = [(base + k * 200_000_000, base + k * 200_000_000 + 150_000_000) for k in range(4)]
        total = s.energy_over(wins, idle_w=50.0)
        # 150 ms windows are under 10 counter periods: measured by the instantaneous-power integral
        assert total.method == "integrated"
        assert total.measured_j == pytest.approx(200 * 0.6, rel=0.06)
        assert total.energy_net_j == pytest.approx(150 * 0.6, rel=0.08)
        with pytest.raises(ValueError, match="overlap"):
            s.energy_over([(base, base + 10**8), (base + 5 * 10**7, base + 2 * 10**8)])
        trace = s.trace(base, base + 800_000_000, max_points=10)
    assert 1 <= len(trace) <= 10
    assert all(0 <= t <= 0.8 and w == 200.0 for t, w in trace)


def test_long_windows_use_the_counter_short_ones_the_instant_integral():
    with PowerSampler(0, nvml=fake(power=lambda t: 120.0, counter_period_s=0.02)) as s:
        time.sleep(0.2)
        t0 = time.monotonic_ns()
        time.sleep(0.5)
        t1 = time.monotonic_ns()
        long = s.energy_between(t0, t1)  # 25 counter periods
        short = s.energy_between(t0, t0 + 100_000_000)  # 5 counter periods
    assert long.method == "counter" and long.energy_j == pytest.approx(60.0, rel=0.06)
    assert short.method == "integrated" and short.energy_integrated_j == pytest.approx(12.0, rel=0.1)
    assert short.energy_j is not None and "counter" in short.note  # the counter stays as the cross-check


def test_average_power_source_and_no_counter():
    nv = fake(power=lambda t: 150.0, energy_supported=False, instant_supported=False, power_average_s=1.0)
    with PowerSampler(0, nvml=nv) as s:
        assert s.power_source == "average" and not s.counter_supported
        time.sleep(0.4)
        t0 = time.monotonic_ns()
        time.sleep(0.3)
        r = s.energy_between(t0, time.monotonic_ns())
    assert r.method == "integrated" and r.energy_integrated_j == pytest.approx(150 * 0.3, rel=0.05)


def test_unavailable_gpu_reports_unavailable_never_zero():
    for nv in (Nvml(no_nvml_backend()), fake(energy_supported=False, power_supported=False)):
        s = PowerSampler(0, nvml=nv)
        assert not s.available
        with s:
            assert not s.running
        r = s.energy_between(0, 10**9, idle_w=50.0)
        assert r.method == "unavailable" and r.energy_j is None and r.avg_power_w is None
        assert r.note
        assert s.trace(0, 10**9) == []
    assert measure_idle_power(0, seconds=0.1, nvml=Nvml(no_nvml_backend())) is None
    bad_index = PowerSampler(5, nvml=fake())
    assert not bad_index.available and "index 5" in bad_index.reason


def test_sampler_survives_failing_reads():
    backend = FakeNvmlBackend([FakeGpu()])
    nv = Nvml(backend)
    with PowerSampler(0, nvml=nv) as s:
        time.sleep(0.1)
        backend.fail["power_instant_mw"] = 999  # reads start failing: samples carry None, thread lives
        time.sleep(0.1)
        assert s.running
    assert any(w is None for _, _, w in s.samples())


def test_idle_power_is_the_median_despite_spikes():
    start = time.monotonic()
    def spiky(t):
        return 400.0 if int((t - start) * 50) % 10 == 0 else 60.0
    assert measure_idle_power(0, seconds=0.5, nvml=fake(power=spiky)) == pytest.approx(60.0)
    no_power = fake(power=lambda t: 70.0, power_supported=False)
    assert measure_idle_power(0, seconds=0.5, nvml=no_power) == pytest.approx(70.0, rel=0.05)


def test_discard_before_keeps_recent_windows_measurable():
    with PowerSampler(0, nvml=fake(power=lambda t: 100.0, counter_period_s=0.05)) as s:
        time.sleep(0.4)
        cut = time.monotonic_ns()
        time.sleep(0.5)
        s.discard_before(cut)
        assert s.samples()[1][0] >= cut
        r = s.energy_between(cut + 10**8, cut + 4 * 10**8)
    assert r.energy_j == pytest.approx(30.0, rel=0.06)
