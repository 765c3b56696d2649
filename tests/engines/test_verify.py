"""The C++ verify checks (engines/tests/verify_tests.cpp): verify + commit + continue == autoregressive
greedy on scripted trees (accepted depths 0..15, wrong siblings, random branches, chains) for Qwen3.5 and
Qwen3 random models, states after commit == AR states, two models in one process, truncate."""

from __future__ import annotations

import os
import subprocess


def test_verify_forward_and_commit(ar_exe):
    build = ar_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-verify-tests", "-j", "2"], check=True,
                   capture_output=True)
    proc = subprocess.run([str(build / "lucebench-verify-tests")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("verify rounds == AR greedy") == 3, proc.stdout
