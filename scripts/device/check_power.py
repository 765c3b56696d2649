#!/usr/bin/env python3
"""Check lucebench's energy measurement on a real NVIDIA GPU (read-only: changes no GPU setting).

Runs a steady torch matmul load and cuts windows of 2-5 s inside it; for each window it compares the
NVML total-energy counter (interpolated at the edges) with the integral of the power samples, for both
power readings (instantaneous field and nvmlDeviceGetPowerUsage, which is a 1 s average on Ampere+).
Also reports idle power, the counter's update period, the sampling rate achieved, short-window
behaviour, GPU state under load, the power limits (read only) and the device copy bandwidth.

Done means: every window >= 2 s agrees within 5% (counter vs integrated instantaneous power).

    PYTHONPATH=. OUT=/tmp/out python3 scripts/device/check_power.py [--device 0]

Writes $OUT/check_power.json (or ./check_power.json) and prints a table. Needs torch with CUDA and
nvidia-ml-py; no pydantic (imports only the pydantic-free lucebench.measure modules).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lucebench.measure.bandwidth import datasheet_bandwidth, measure_copy_bandwidth
from lucebench.measure.energy import EnergyResult
from lucebench.measure.nvml import Nvml
from lucebench.measure.power import PowerSampler, measure_idle_power
from lucebench.measure.state import read_gpu_state

WINDOWS_S = [2.0, 2.0, 3.0, 3.0, 5.0, 5.0]
IDLE_S = 4.5
WARMUP_S = 4.0
TOLERANCE = 0.05


def rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else (a - b) / b


def matmul_load(torch: Any, device: Any, until: float, on_tick: Any = None) -> int:
    """bf16 8192^3 matmuls in batches with a sync between them, until monotonic time ``until``."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    n = 0
    while time.monotonic() < until:
        for _ in range(8):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(device)  # releases the GIL: the sampler threads run meanwhile
        n += 8
        if on_tick is not None:
            on_tick()
    return n


def window_row(name: str, t0: int, t1: int, inst: PowerSampler, avg: PowerSampler, idle_w: float | None) -> dict:
    ri: EnergyResult = inst.energy_between(t0, t1, idle_w, wait=False)
    ra: EnergyResult = avg.energy_between(t0, t1, idle_w, wait=False)
    return {
        "window": name, "window_s": ri.window_s, "method": ri.method,
        "counter_j": ri.energy_j, "net_j": ri.energy_net_j, "avg_power_w": ri.avg_power_w,
        "peak_power_w": ri.peak_power_w,
        "integrated_instant_j": ri.energy_integrated_j, "rel_diff_instant": rel(ri.energy_integrated_j, ri.energy_j),
        "counter_j_avg_sampler": ra.energy_j,
        "integrated_average_j": ra.energy_integrated_j, "rel_diff_average": rel(ra.energy_integrated_j, ra.energy_j),
        "note": ri.note,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device_index": args.device}

    nv = Nvml()
    if not nv.available:
        report["error"] = nv.reason
        (out_dir / "check_power.json").write_text(json.dumps(report, indent=2))
        print(f"NVML unavailable: {nv.reason}")
        return 1
    info = nv.device_info(args.device)
    limits = nv.power_limits(args.device)
    report["gpu"] = {**{k: v for k, v in info.__dict__.items() if k != "extra"},
                     "driver": nv.driver_version(), "cuda_driver": nv.cuda_driver_version()}
    report["limits_w"] = limits.__dict__  # read only

    import torch

    device = torch.device("cuda", args.device)
    torch.ones(1, device=device)  # CUDA context first: idle is measured as an engine would see it
    torch.cuda.synchronize(device)
    idle_fn_w = measure_idle_power(args.device, 2.0, nvml=nv)  # the runner's function, before any load

    inst = PowerSampler(args.device, nvml=nv, power_source="auto")
    avg = PowerSampler(args.device, nvml=nv, power_source="average")
    report["power_sources"] = {"auto": inst.power_source, "second": avg.power_source,
                               "counter_supported": inst.counter_supported}
    # Cost of one NVML read cycle (counter + power), measured before the threads start.
    costs = []
    for _ in range(50):
        t = time.perf_counter()
        inst.sample_once()
        costs.append(time.perf_counter() - t)
    report["sample_cost_ms_median"] = statistics.median(costs) * 1e3

    inst.start()
    avg.start()
    t_idle0 = time.monotonic_ns()
    time.sleep(IDLE_S)
    t_idle1 = time.monotonic_ns()
    idle_powers = [w for t, _, w in inst.samples() if w is not None and t_idle0 + 5e8 <= t <= t_idle1]
    idle_w = statistics.median(idle_powers) if idle_powers else None
    idle_counter = inst.energy_between(t_idle0 + 500_000_000, t_idle1 - 500_000_000, wait=False)
    report["idle"] = {"measure_idle_power_w": idle_fn_w, "median_power_w": idle_w, "counter_avg_power_w": idle_counter.avg_power_w,
                      "window_s": idle_counter.window_s}

    state_under_load: dict[str, Any] = {}

    def grab_state() -> None:
        if not state_under_load and time.monotonic() > t_load + WARMUP_S:
            state_under_load.update(read_gpu_state(args.device, nvml=nv))

    t_load = time.monotonic()
    load_start_ns = time.monotonic_ns()
    win_start = t_load + WARMUP_S
    total = WARMUP_S + sum(WINDOWS_S) + 1.0
    n_matmuls = matmul_load(torch, device, t_load + total, grab_state)
    t_end = time.monotonic()
    time.sleep(1.5)  # let the counter and the 1 s average pass the last window
    report["load"] = {"kind": "bf16 matmul 8192^3, batches of 8", "seconds": t_end - t_load,
                      "matmuls": n_matmuls, "tflops": n_matmuls * 2 * 8192**3 / (t_end - t_load) / 1e12}
    report["state_under_load"] = state_under_load

    rows = []
    # Idle windows (low power), then the steady windows inside the load.
    rows.append(window_row("idle 2s", t_idle0 + 1_000_000_000, t_idle0 + 3_000_000_000, inst, avg, idle_w))
    t = win_start
    for k, w in enumerate(WINDOWS_S):
        rows.append(window_row(f"load {k + 1} ({w:g}s)", int(t * 1e9), int((t + w) * 1e9), inst, avg, idle_w))
        t += w
    # Load onset: includes the ramp, where a 1 s averaged power reading lags behind.
    rows.append(window_row("onset 2s", load_start_ns, load_start_ns + 2_000_000_000, inst, avg, idle_w))
    report["windows"] = rows

    period = inst.counter_period_s()
    short = [inst.energy_between(int((win_start + 0.5 * k) * 1e9), int((win_start + 0.5 * k + 0.01) * 1e9),
                                 wait=False) for k in range(5)]
    sum_short = inst.energy_over([(int((win_start + 0.5 * k) * 1e9), int((win_start + 0.5 * k + 0.4) * 1e9))
                                  for k in range(8)], idle_w)
    report["counter_update_period_ms"] = None if period is None else period * 1e3
    report["sample_rate_hz"] = {"instant_sampler": inst.sample_rate_hz(), "average_sampler": avg.sample_rate_hz()}
    report["short_windows_10ms"] = [r.note for r in short]
    report["energy_over_8x0.4s"] = sum_short.to_dict()
    inst.stop()
    avg.stop()
    report["n_samples"] = len(inst.samples())
    report["trace_points"] = len(inst.trace(load_start_ns, load_start_ns + int(total * 1e9)))

    bw = measure_copy_bandwidth(args.device)
    sheet = datasheet_bandwidth(info.name)
    report["bandwidth"] = {"measured_bytes_per_s": bw,
                           "datasheet_bytes_per_s": sheet.bytes_per_s if sheet else None,
                           "datasheet_source": sheet.source if sheet else None,
                           "measured_over_datasheet": rel(bw, sheet.bytes_per_s) if bw and sheet else None}

    long_rows = [r for r in rows if r["window_s"] >= 2.0 and r["window"].startswith("load")]
    ok = bool(long_rows) and all(r["rel_diff_instant"] is not None and abs(r["rel_diff_instant"]) <= TOLERANCE
                                 for r in long_rows)
    report["pass"] = ok
    report["criterion"] = "counter vs integrated instantaneous power within 5% on every steady window >= 2 s"
    (out_dir / "check_power.json").write_text(json.dumps(report, indent=2, default=str))

    print(f"GPU {args.device}: {info.name}  driver {report['gpu']['driver']}  CUDA {report['gpu']['cuda_driver']}")
    print(f"limits (read only): current {limits.current_w} W, default {limits.default_w} W, "
          f"range {limits.min_w}..{limits.max_w} W")
    print(f"idle: median {idle_w} W, counter average {idle_counter.avg_power_w} W")
    print(f"counter update period: {report['counter_update_period_ms']} ms; sample rate: "
          f"{report['sample_rate_hz']}; NVML read cycle {report['sample_cost_ms_median']:.3f} ms")
    print(f"load: {report['load']['tflops']:.0f} TFLOP/s; state under load: {state_under_load}")
    head = f"{'window':<16}{'s':>6}{'counter J':>11}{'integ(inst) J':>15}{'diff':>8}{'integ(avg) J':>14}{'diff':>8}{'avg W':>8}"
    print(head)
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for r in rows:
        print(f"{r['window']:<16}{r['window_s']:>6.2f}{fmt(r['counter_j'], '11.1f')}"
              f"{fmt(r['integrated_instant_j'], '15.1f')}{fmt(r['rel_diff_instant'], '+8.2%')}"
              f"{fmt(r['integrated_average_j'], '14.1f')}{fmt(r['rel_diff_average'], '+8.2%')}"
              f"{fmt(r['avg_power_w'], '8.1f')}")
    print(f"10 ms windows: {short[0].note}")
    print(f"sum of 8 x 0.4 s windows: {sum_short.energy_j} J ({sum_short.method})")
    if bw:
        print(f"copy bandwidth: {bw / 1e9:.0f} GB/s measured; datasheet {fmt(sheet and sheet.bytes_per_s / 1e9, '.0f')} GB/s")
    print("PASS" if ok else "FAIL", report["criterion"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
