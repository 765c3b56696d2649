"""The window arithmetic of lucebench.measure.energy on synthetic, exactly known samples."""

from __future__ import annotations

import pytest

from lucebench.measure import energy as E

MS = 1_000_000


def synth(power_w, t_end_ms=3000, period_ms=100, sample_ms=20, offset_ms=10):
    """Samples of a GPU drawing power_w(t_ms) W whose counter refreshes every period_ms (exact integral)."""
    def energy_at(t_ms):  # J, midpoint rule on 1 ms steps (power_w is piecewise constant on ms)
        return sum(power_w(k + 0.5) for k in range(int(t_ms))) / 1000.0

    samples, power = [], []
    for t in range(offset_ms, t_end_ms, sample_ms):
        tick = (t // period_ms) * period_ms
        samples.append((t * MS, energy_at(tick)))
        power.append((t * MS, power_w(t)))
    return samples, power


def run(samples, power, t0_ms, t1_ms, idle_w=None, counter=True):
    points = E.counter_points(samples)
    return E.window_energy(t0_ns=t0_ms * MS, t1_ns=t1_ms * MS, idle_w=idle_w, points=points, power=power,
                           counter_supported=counter, period_s=E.update_period_s(points),
                           sample_interval_s=E.median_interval_s([t for t, _ in power]))


def test_change_points_are_midpoints_and_period_is_measured():
    samples, _ = synth(lambda t: 200.0)
    points = E.counter_points(samples)
    assert points[0] == (100 * MS, 20.0)  # update at 100 ms seen at 110 ms, previous sample 90 ms
    assert E.update_period_s(points) == pytest.approx(0.1)
    assert E.update_period_s(points[:2]) is None
    assert E.counter_points([(0, None), (1, 5.0), (2, None), (3, 5.0)]) == []


def test_constant_power_window_is_exact_with_edges_between_updates():
    samples, power = synth(lambda t: 200.0)
    r = run(samples, power, 233, 2517, idle_w=50.0)
    assert r.method == "counter" and r.note is None
    assert r.window_s == pytest.approx(2.284)
    assert r.energy_j == pytest.approx(200 * 2.284, rel=1e-9)
    assert r.energy_integrated_j == pytest.approx(200 * 2.284, rel=1e-9)
    assert r.energy_net_j == pytest.approx(150 * 2.284, rel=1e-9)
    assert r.avg_power_w == pytest.approx(200.0) and r.peak_power_w == 200.0
    assert r.measured_j == r.energy_j


def test_step_load_counter_tracks_truth_within_one_update():
    # idle 80 W, 400 W from 1000 to 2500 ms; a long window over the load
    samples, power = synth(lambda t: 400.0 if 1000 <= t < 2500 else 80.0)
    r = run(samples, power, 1100, 2400)
    assert r.energy_j == pytest.approx(400 * 1.3, rel=1e-9)
    r = run(samples, power, 500, 2900)  # includes both edges of the load
    true = 80 * 0.5 + 400 * 1.5 + 80 * 0.4
    assert r.energy_j == pytest.approx(true, rel=0.01)


def test_window_shorter_than_update_period_gives_no_energy():
    samples, power = synth(lambda t: 300.0)
    r = run(samples, power, 1000, 1060)
    assert r.energy_j is None and r.energy_net_j is None and r.method == "unavailable"
    assert r.too_short and r.note.startswith("window too short")
    assert r.peak_power_w == 300.0
    assert run(samples, power, 1000, 1000).too_short  # empty decode phase (n_gen 1)


def test_window_outside_samples_is_not_covered():
    samples, power = synth(lambda t: 300.0, t_end_ms=1000)
    r = run(samples, power, 800, 1500)
    assert r.energy_j is None and "not covered" in r.note


def test_no_counter_uses_integrated_power():
    _samples, power = synth(lambda t: 250.0)
    r = run([], power, 100, 1100, idle_w=50.0, counter=False)
    assert r.method == "integrated" and r.energy_j is None
    assert r.energy_integrated_j == pytest.approx(250.0) and r.measured_j == pytest.approx(250.0)
    assert r.energy_net_j == pytest.approx(200.0)
    assert "no energy counter" in r.note
    assert run([], power, 100, 130, counter=False).too_short  # < 2 sampling intervals


def test_no_readings_at_all():
    r = E.window_energy(t0_ns=0, t1_ns=10**9, idle_w=None, points=[], power=[], counter_supported=False,
                        period_s=None, sample_interval_s=None)
    assert r.method == "unavailable" and r.energy_j is None and r.energy_integrated_j is None
    assert r.note == "power unavailable"


def test_counter_going_backwards_falls_back_to_integral():
    samples, power = synth(lambda t: 100.0)
    samples = [(t, e if t < 1500 * MS else e - 1000.0) for t, e in samples]  # driver reload
    r = run(samples, power, 1000, 2000)
    assert r.method == "integrated" and "backwards" in r.note
    assert r.energy_integrated_j == pytest.approx(100.0)


def test_disagreement_is_noted_on_long_windows_only():
    samples, _ = synth(lambda t: 200.0)
    low_power = [(t, 180.0) for t, _ in synth(lambda t: 200.0)[1]]  # a reading 10% low
    r = run(samples, low_power, 200, 2700)
    assert r.method == "counter" and "disagree by -10.0%" in r.note
    assert run(samples, low_power, 200, 1700).note is None  # 1.5 s: below the comparison threshold


def test_reversed_window_is_a_bug():
    samples, power = synth(lambda t: 200.0)
    with pytest.raises(ValueError):
        run(samples, power, 500, 400)


def test_combine_sums_and_refuses_partial_sums():
    samples, power = synth(lambda t: 200.0)
    wins = [(200, 400), (600, 900), (1000, 1700)]
    parts = [run(samples, power, a, b) for a, b in wins]
    total = E.combine(parts, idle_w=20.0)
    assert total.method == "counter"
    assert total.window_s == pytest.approx(1.2)
    assert total.energy_j == pytest.approx(240.0) and total.energy_net_j == pytest.approx(240.0 - 24.0)
    assert total.energy_integrated_j == pytest.approx(240.0)
    parts.append(run(samples, power, 2000, 2050))  # one unresolvable window
    partial = E.combine(parts, idle_w=20.0)
    assert partial.energy_j is None and partial.too_short and "1 of 4 windows" in partial.note
    assert E.combine([], None).note == "no windows"


def test_combine_without_idle_sums_the_windows_net_energies():
    parts = [E.EnergyResult(window_s=1.0, energy_j=100.0, energy_net_j=70.0, method="counter"),
             E.EnergyResult(window_s=3.0, energy_j=300.0, energy_net_j=210.0, method="counter")]
    total = E.combine(parts, idle_w=None)
    assert total.energy_j == 400.0 and total.energy_net_j == 280.0 and total.avg_power_w == 100.0
    assert E.gross_j(total) == total.measured_j == 400.0
    parts[1].energy_net_j = None  # a window without an idle reading: the net sum is unknown, not low
    assert E.combine(parts, idle_w=None).energy_net_j is None


def test_decimate():
    power = [(t * MS, float(t)) for t in range(0, 1000, 10)]
    full = E.decimate(power, 0, 999 * MS, 500)
    assert len(full) == 100 and full[1] == (0.01, 10.0)
    small = E.decimate(power, 0, 1000 * MS, 10)
    assert len(small) == 10
    assert small[0][1] == pytest.approx(45.0)  # mean of 0..90
    assert E.decimate(power, 0, 10**9, 0) == []
