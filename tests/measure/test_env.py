"""collect_environment and `lucebench env`."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from lucebench.cli import app
from lucebench.measure.env import collect_environment, git_state, package_version, parse_tool_version
from lucebench.measure.fake import FakeGpu, FakeNvmlBackend, no_nvml_backend
from lucebench.measure.nvml import Nvml
from lucebench.results.schema import Environment, GpuInfo


def test_gpus_and_driver_from_nvml():
    gpus = [FakeGpu(), FakeGpu(name="NVIDIA GeForce RTX 3090", uuid="GPU-b", limit_mw=300_000, default_limit_mw=350_000,
                    min_limit_mw=100_000, max_limit_mw=400_000, compute_capability=(8, 6), ecc=(0, 0))]
    env = collect_environment(nvml=Nvml(FakeNvmlBackend(gpus)), engines_build={"ar": {"compiler": "nvcc 13.0"}})
    assert env.power_available and env.driver_version == "570.124.06" and env.cuda_version == "12.8"
    assert [g.name for g in env.gpus] == ["NVIDIA Fake H200", "NVIDIA GeForce RTX 3090"]
    g = env.gpus[1]
    assert g == GpuInfo(index=1, name="NVIDIA GeForce RTX 3090", uuid="GPU-b", vbios="96.00.00.00.01",
                        pci_bus_id="00000000:01:00.0", memory_total_bytes=150_754_820_096,
                        compute_capability="8.6", power_limit_w=300.0, power_limit_default_w=350.0,
                        power_limit_min_w=100.0, power_limit_max_w=400.0, sm_clock_mhz=1980, mem_clock_mhz=2619,
                        sm_clock_max_mhz=1980, mem_clock_max_mhz=2619, ecc_enabled=False, energy_counter=True)
    assert env.compilers["engine:ar"] == "nvcc 13.0"


def test_no_gpu_is_fast_and_marks_power_unavailable():
    nv = Nvml(no_nvml_backend())
    timings = []
    for _ in range(2):
        t = time.perf_counter()
        env = collect_environment(nvml=nv)
        timings.append(time.perf_counter() - t)
    assert min(timings) < 1.0
    assert env.gpus == [] and env.power_available is False and env.driver_version is None
    assert env.os and env.python and env.lucebench_version
    assert env.packages["pydantic"] == package_version("pydantic") is not None
    assert "pynvml" in env.packages and "fla" in env.packages
    assert {"gcc", "g++", "nvcc", "hipcc", "cmake"} <= set(env.compilers)


def test_power_unavailable_when_gpu_has_no_readings():
    nv = Nvml(FakeNvmlBackend([FakeGpu(energy_supported=False, power_supported=False)]))
    env = collect_environment(nvml=nv)
    assert len(env.gpus) == 1 and env.power_available is False


def test_tool_version_parsing():
    nvcc = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.8, V12.8.93\n"
    assert parse_tool_version("nvcc", nvcc) == "12.8.93"
    assert parse_tool_version("gcc", "gcc (Debian 12.2.0-14) 12.2.0\nCopyright") == "12.2.0"
    assert parse_tool_version("cmake", "cmake version 3.31.4\n") == "3.31.4"
    assert parse_tool_version("hipcc", "HIP version: 6.2.41133-dd7f95766\nAMD clang") == "6.2.41133-dd7f95766"
    assert parse_tool_version("gcc", None) is None
    assert parse_tool_version("weird", "no digits here\n") == "no digits here"


def test_git_state_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == (None, None)


def test_env_cli_json_is_one_environment_object():
    result = CliRunner().invoke(app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    env = Environment.model_validate(json.loads(result.stdout))
    assert env.lucebench_version


def test_env_cli_table():
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    assert "System" in result.stdout and "Packages" in result.stdout
