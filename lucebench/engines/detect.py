"""Which compute backend and GPU architecture this machine has, for building the bundled engines.

Detection only reads: `nvidia-smi` or NVML for NVIDIA GPUs, `rocminfo` / `/dev/kfd` for ROCm. It never
changes a device setting.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    """stdout of a command, or None when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _nvml_capabilities() -> list[tuple[int, int]] | None:
    """Compute capabilities of all NVIDIA GPUs through NVML, or None when NVML is unavailable."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any NVML failure means "no NVIDIA GPU usable here"
        return None
    try:
        caps = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            caps.append(tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)))
        return caps
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def detect_backend() -> str:
    """"cuda" when an NVIDIA GPU is visible (nvidia-smi or NVML), else "hip" when ROCm sees a GPU, else "cpu".

    LUCEBENCH_BACKEND in the environment overrides detection.
    """
    forced = os.environ.get("LUCEBENCH_BACKEND")
    if forced in ("cpu", "cuda", "hip"):
        return forced
    out = _run(["nvidia-smi", "-L"])
    if out and "GPU" in out:
        return "cuda"
    caps = _nvml_capabilities()
    if caps:
        return "cuda"
    if os.path.exists("/dev/kfd"):
        info = _run(["rocminfo"])
        if info and "gfx" in info:
            return "hip"
    return "cpu"


def detect_cuda_arch(device: int = 0) -> str | None:
    """The CUDA architecture of GPU `device` as CMake wants it ("90" for an H200, "86" for an RTX 3090).

    None when no NVIDIA GPU (or no such index) is visible.
    """
    out = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", str(device)])
    if out:
        cap = out.strip().splitlines()[0].strip()
        if "." in cap:
            major, minor = cap.split(".", 1)
            if major.isdigit() and minor.isdigit():
                return f"{major}{minor}"
    caps = _nvml_capabilities()
    if caps and 0 <= device < len(caps):
        major, minor = caps[device]
        return f"{major}{minor}"
    return None


def detect_hip_arch(device: int = 0) -> str | None:
    """The gfx target of ROCm GPU `device` ("gfx90a", "gfx1100"), or None."""
    info = _run(["rocminfo"])
    if not info:
        return None
    targets = []
    for line in info.splitlines():
        line = line.strip()
        if line.startswith("Name:") and "gfx" in line:
            name = line.split(":", 1)[1].strip()
            if name.startswith("gfx") and name not in targets:
                targets.append(name)
    return targets[device] if 0 <= device < len(targets) else None
