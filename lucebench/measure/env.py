"""The environment record that goes into every result (lucebench.results.schema.Environment).

Fast by construction (well under a second without a GPU): no heavy imports (package versions come from
importlib.metadata), external tools (compilers, git) run in parallel with a timeout.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lucebench
from lucebench.measure.nvml import Nvml, resolve
from lucebench.results.schema import Environment, GpuInfo

_TOOL_TIMEOUT_S = 10.0

# Environment.packages key -> distribution names to try (the import name often differs).
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "tokenizers": ("tokenizers",),
    "datasets": ("datasets",),
    "huggingface_hub": ("huggingface_hub",),
    "safetensors": ("safetensors",),
    "numpy": ("numpy",),
    "pynvml": ("nvidia-ml-py", "pynvml"),
    "fla": ("flash-linear-attention", "fla-core"),
    "flash_attn": ("flash-attn",),
    "triton": ("triton", "pytorch-triton-rocm"),
    "llama-cpp-python": ("llama-cpp-python",),
    "gguf": ("gguf",),
    "accelerate": ("accelerate",),
    "pydantic": ("pydantic",),
}


def package_version(*dists: str) -> str | None:
    """The installed version of the first of ``dists`` that is installed, without importing it."""
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    """stdout+stderr of a command, or None when it is missing, fails or hangs."""
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, cwd=cwd,
                              env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return (proc.stdout or "") + (proc.stderr or "")


def _find(tool: str, *extra: str) -> str | None:
    # The interpreter's own bin directory first: the pip-installed cmake lucebench depends on lives there
    # even when the virtual environment is not activated.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    found = shutil.which(tool, path=search)
    if found:
        return found
    return next((p for p in extra if os.access(p, os.X_OK)), None)


def parse_tool_version(tool: str, text: str | None) -> str | None:
    """The version number in a tool's --version output (first line as-is if no number is found)."""
    if not text:
        return None
    patterns = {
        "nvcc": r"release [\d.]+, V([\d.]+)",
        "hipcc": r"HIP version:\s*([\w.\-]+)",
        "cmake": r"cmake version\s+([\w.\-]+)",
    }
    m = re.search(patterns.get(tool, r"(\d+\.\d+(?:\.\d+)?)"), text)
    if m:
        return m.group(1)
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else None


def _tool_commands() -> dict[str, list[str] | None]:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
    paths = {
        "gcc": _find("gcc"),
        "g++": _find("g++"),
        "clang": _find("clang"),
        "nvcc": _find("nvcc", f"{cuda_home}/bin/nvcc"),
        "hipcc": _find("hipcc", f"{rocm}/bin/hipcc"),
        "cmake": _find("cmake"),
    }
    return {name: ([path, "--version"] if path else None) for name, path in paths.items()}


def collect_compilers() -> dict[str, str | None]:
    """Versions of gcc, g++, clang, nvcc, hipcc and cmake (None where absent), queried in parallel."""
    cmds = _tool_commands()
    with ThreadPoolExecutor(max_workers=len(cmds)) as pool:
        futures = {name: pool.submit(_run, cmd) for name, cmd in cmds.items() if cmd}
        return {name: parse_tool_version(name, futures[name].result()) if name in futures else None
                for name in cmds}


def rocm_version() -> str | None:
    """ROCm version from $ROCM_PATH/.info/version (or /opt/rocm), None without ROCm."""
    roots = [os.environ.get("ROCM_PATH"), "/opt/rocm"]
    for root in filter(None, roots):
        try:
            text = Path(root, ".info", "version").read_text().strip()
        except OSError:
            continue
        if text:
            return text.split("-")[0]
    return None


def git_state(repo: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the lucebench checkout, or (None, None) when not running from a git checkout.

    Only the repository whose top level holds this package counts: an installed copy that happens to
    sit inside some other repository must not report that repository's commit.
    """
    root = repo or Path(lucebench.__file__).resolve().parent.parent
    if not (root / ".git").exists() or not shutil.which("git"):
        return None, None
    top = _run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"])
    if not top:
        return None, None
    lines = top.split()
    if len(lines) < 2 or Path(lines[0]).resolve() != root:
        return None, None
    status = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return lines[1], None if status is None else bool(status.strip())


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _memory_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def collect_gpus(nvml: Nvml | None = None) -> list[GpuInfo]:
    """One GpuInfo per NVML GPU (all fields NVML can fill); [] without NVML."""
    nv = resolve(nvml)
    gpus: list[GpuInfo] = []
    for i in range(nv.device_count() if nv.available else 0):
        info = nv.device_info(i)
        limits = nv.power_limits(i)
        clocks = nv.clocks(i)
        gpus.append(GpuInfo(
            index=i, name=info.name, uuid=info.uuid, vbios=info.vbios, pci_bus_id=info.pci_bus_id,
            memory_total_bytes=info.memory_total_bytes, compute_capability=info.compute_capability,
            power_limit_w=limits.current_w, power_limit_default_w=limits.default_w,
            power_limit_min_w=limits.min_w, power_limit_max_w=limits.max_w,
            sm_clock_mhz=clocks.sm_mhz, mem_clock_mhz=clocks.mem_mhz,
            sm_clock_max_mhz=clocks.sm_max_mhz, mem_clock_max_mhz=clocks.mem_max_mhz,
            ecc_enabled=info.ecc_enabled, energy_counter=info.energy_counter))
    return gpus


def collect_environment(*, engines_build: dict[str, Any] | None = None, nvml: Nvml | None = None) -> Environment:
    """The environment record of this machine and process.

    ``engines_build``: engine name -> its build info (the `build` object of the engine's ready line, or
    the build step's record); each engine's compiler is recorded in ``compilers`` as "engine:<name>"
    (Environment has no dedicated field). ``nvml``: the NVML session (default: the process-wide one).
    """
    nv = resolve(nvml)
    jobs: dict[str, Callable[[], Any]] = {"compilers": collect_compilers, "git": git_state}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {k: pool.submit(fn) for k, fn in jobs.items()}
        gpus = collect_gpus(nv)
        results = {k: f.result() for k, f in futures.items()}
    compilers: dict[str, str | None] = results["compilers"]
    for name, build in sorted((engines_build or {}).items()):
        compiler = build.get("compiler") if isinstance(build, dict) else build
        compilers[f"engine:{name}"] = None if compiler is None else str(compiler)
    commit, dirty = results["git"]
    power_available = nv.available and any(
        g.energy_counter or nv.power_w(g.index) is not None for g in gpus)
    return Environment(
        hostname=socket.gethostname() or None,
        os=_os_name(),
        kernel=platform.release() or None,
        cpu=_cpu_model(),
        cpu_count=os.cpu_count(),
        memory_total_bytes=_memory_total(),
        python=f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        packages={key: package_version(*dists) for key, dists in PACKAGES.items()},
        driver_version=nv.driver_version() if nv.available else None,
        cuda_version=nv.cuda_driver_version() if nv.available else None,
        rocm_version=rocm_version(),
        gpus=gpus,
        compilers=compilers,
        lucebench_version=lucebench.__version__,
        lucebench_commit=commit,
        lucebench_dirty=dirty,
        power_available=power_available,
        lb_env={k: v for k, v in sorted(os.environ.items()) if k.startswith("LB_")},
    )
