"""engines/tests/quant_blocks_check.cu: the CUDA backend's block readers (core/cuda/quant_blocks.cuh) equal the
CPU reference decode_row on random q4_K, q5_K, q6_K, q8_0 and q4_0 blocks. Host code compiled by nvcc: runs
wherever nvcc is installed, no GPU needed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[2] / "engines"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_block_readers_match_decode_row(tmp_path):
    exe = tmp_path / "quant_blocks_check"
    proc = subprocess.run(["nvcc", "-std=c++17", "-O2", "-arch=sm_90", "-x", "cu", "-DLB_HAVE_GPU=1", "-I", str(ENGINES),
                           str(ENGINES / "tests" / "quant_blocks_check.cu"), str(ENGINES / "core" / "quant.cpp"),
                           "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert run.stdout.count(" ok ") == 5
