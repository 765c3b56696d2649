"""engines/tests/gpu_op_check.cu, the check of every GPU op against the CPU reference: compiled where nvcc is
installed, built and run where a CUDA GPU is visible (the device machine runs it through
scripts/device/check_gpu_ops.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[2] / "engines"


def _gpu_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return proc.returncode == 0 and "GPU" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_gpu_op_check_compiles(tmp_path):
    proc = subprocess.run(["nvcc", "-std=c++17", "-O1", "-arch=sm_90", "--expt-relaxed-constexpr", "-DLB_HAVE_GPU=1",
                           "-I", str(ENGINES), "-c", str(ENGINES / "tests" / "gpu_op_check.cu"), "-o",
                           str(tmp_path / "gpu_op_check.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None or not _gpu_visible(), reason="needs nvcc and a CUDA GPU")
def test_gpu_ops_match_cpu_reference(tmp_path):
    from lucebench.engines.detect import detect_cuda_arch

    arch = detect_cuda_arch() or "90"
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ENGINES), "-B", str(build), "-DLUCEBENCH_BACKEND=cuda",
                    f"-DCMAKE_CUDA_ARCHITECTURES={arch}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", "4", "--target", "lucebench-gpu-op-check"], check=True,
                   capture_output=True)
    proc = subprocess.run([str(build / "lucebench-gpu-op-check")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and ", 0 failed" in proc.stdout, proc.stdout[-6000:] + proc.stderr[-2000:]
