"""The CUDA backend compiles (no GPU needed): every .cu source for sm_75 (fp16 weights), sm_86 and sm_90."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[2] / "engines"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["75", "86", "90"])
def test_cuda_sources_compile(arch, tmp_path):
    defines = ["-DLB_HAVE_GPU=1"] + (["-DLB_GPU_FP16=1"] if int(arch) < 80 else [])
    for src in sorted((ENGINES / "core" / "cuda").glob("*.cu")):
        proc = subprocess.run(["nvcc", "-std=c++17", "-O1", f"-arch=sm_{arch}", *defines, "-I", str(ENGINES), "-c",
                               str(src), "-o", str(tmp_path / (src.stem + ".o"))], capture_output=True, text=True)
        assert proc.returncode == 0, f"{src.name} for sm_{arch}:\n{proc.stderr[-3000:]}"


# Register budgets of the sm_90 decode kernels whose counts were measured to matter (docs/engines.md): a
# delta_out_kernel block (512 threads, <= 80 registers) and a fused-MLP block (512 threads, <= 48) fit in one
# multiprocessor's 64 K registers together, so the MLP's blocks start their weight copies while the DeltaNet
# step runs (at 120 registers delta_out delayed the MLP by 1.5 us a layer). A change that moves them past
# these budgets has to be re-measured on a GPU.
REGISTER_BUDGETS = {"mlp_fused_kernel": 48, "delta_out_kernel": 80}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_sm90_decode_kernel_register_budgets(tmp_path):
    stderr = ""
    for name in ("mlp.cu", "delta_decode.cu"):
        src = ENGINES / "core" / "cuda" / name
        proc = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-DLB_HAVE_GPU=1", "-DLB_CUDA=1", "-I",
                               str(ENGINES / "core"), "-I", str(ENGINES), "-cubin", str(src), "-o",
                               str(tmp_path / (src.stem + ".cubin")), "-Xptxas", "-v"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        stderr += proc.stderr
    regs: dict[str, int] = {}   # kernel -> registers, from ptxas -v ("Used N registers")
    spills: dict[str, str] = {}  # kernel -> its "N bytes spill stores, N bytes spill loads" line
    current = None
    for line in stderr.splitlines():
        if "Compiling entry function" in line:
            current = next((k for k in REGISTER_BUDGETS if k in line), None)
        elif current and "spill" in line:
            spills[current] = line.strip()
        elif current and "Used" in line and "registers" in line:
            regs[current] = int(line.split("Used")[1].split("registers")[0])
    missing = set(REGISTER_BUDGETS) - set(regs) | set(REGISTER_BUDGETS) - set(spills)
    assert not missing, f"kernels not found in ptxas output: {missing}"
    for name, budget in REGISTER_BUDGETS.items():
        assert regs[name] <= budget, f"{name}: {regs[name]} registers, budget {budget}"
        assert "0 bytes spill stores, 0 bytes spill loads" in spills[name], f"{name}: {spills[name]}"
    assert 512 * (regs["mlp_fused_kernel"] + regs["delta_out_kernel"]) <= 65536


DEVICE_SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "device"


# The device probes (docs/megakernel.md: latency floors, step floors) are run by hand on a lent GPU, so only this
# test keeps them compiling between those runs.
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("probe", ["latency_probe.cu", "step_floor.cu"])
def test_device_probes_compile(probe, tmp_path):
    proc = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-c", str(DEVICE_SCRIPTS / probe), "-o",
                           str(tmp_path / "probe.o")], capture_output=True, text=True)
    assert proc.returncode == 0, f"{probe}:\n{proc.stderr[-3000:]}"


# The prefill attention kernel keeps a warp's scores and output in registers (up to 255 a thread, one block of
# 8 warps a multiprocessor): a spill would put them in local memory on every key tile. A change that spills has
# to be re-measured on a GPU (scripts/device/check_attention_gpu.sh).
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_sm90_flash_attention_does_not_spill(tmp_path):
    src = ENGINES / "core" / "cuda" / "attention.cu"
    proc = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-DLB_HAVE_GPU=1", "-DLB_CUDA=1", "-I",
                           str(ENGINES / "core"), "-I", str(ENGINES), "-cubin", str(src), "-o",
                           str(tmp_path / "attention.cubin"), "-Xptxas", "-v"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found, current = 0, False
    for line in proc.stderr.splitlines():
        if "Compiling entry function" in line:
            current = "flash_attention_kernel" in line
        elif current and "spill" in line:
            found += 1
            assert "0 bytes spill stores, 0 bytes spill loads" in line, line
    assert found == 4, f"{found} flash_attention_kernel instances in ptxas output (want hd 128/256 x bf16/other)"
