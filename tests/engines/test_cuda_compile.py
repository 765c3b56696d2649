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
