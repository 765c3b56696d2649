"""What every CMake build of lucebench shares: the bundled engines (lucebench.engines.build) and llama.cpp
(lucebench.baselines.llamacpp.build).

* the GPU architecture: `resolve_arch` validates a given one or detects the card's, one contract for both;
* the compiler identity that goes into cache keys and results: `host_compiler`, `nvcc_release`,
  `compiler_id`;
* the steps: `locked` (one build per folder at a time), `run_logged` (every command and its output
  appended to the build's log), `log_tail` (what a failure message quotes), `build_jobs`;
* `tree_hash`: the content hash of a source tree that keys a build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from lucebench.errors import UserError

BACKENDS = ("cpu", "cuda", "hip")
# The bundled engines' CUDA kernels need sm_75 or newer; 121 is the newest architecture CUDA 13 knows.
CUDA_ARCH_RANGE = (75, 121)
MAX_DEFAULT_JOBS = 16  # nvcc takes ~1-2 GB per job; more jobs than this buy little and can exhaust memory


class BuildError(UserError):
    """A configure or compile step that failed: the message ends with the log's telling lines; the log is kept."""

    def __init__(self, message: str, *, log: Path | None = None, hint: str | None = None):
        super().__init__(message, where=str(log) if log else None, hint=hint, exit_code=1)
        self.log = log


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}", where="--backend", hint=f"one of {', '.join(BACKENDS)}")


def cmake_exe() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        raise UserError("cmake not found", hint="install CMake >= 3.22 (pip install cmake, or your package manager)")
    return exe


# ---------------------------------------------------------------------------------------------- arch
def normalize_cuda_arch(arch: str) -> str:
    """'sm_90' / '9.0' / '90' / '90a' -> CMake's form ('90', '90a'); several may be ';'- or ','-separated.

    UserError for anything that is not a compute capability in CUDA_ARCH_RANGE.
    """
    lo, hi = CUDA_ARCH_RANGE
    out = []
    for part in re.split(r"[;,\s]+", arch.strip()):
        if not part:
            continue
        a = part.lower().removeprefix("sm_").removeprefix("compute_")
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)", a)
        if m:
            a = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        m = re.fullmatch(r"(\d{2,3})[af]?(-real|-virtual)?", a)
        if not m:
            raise UserError(f"not a CUDA architecture: {part!r}", where="--arch",
                            hint="use e.g. sm_90, 90 or 8.6 (compute capability)")
        if not lo <= int(m.group(1)) <= hi:
            raise UserError(f"CUDA arch {part!r} is not supported", where="--arch",
                            hint=f"give a compute capability from {lo} to {hi}, e.g. 86 or 90")
        out.append(a)
    if not out:
        raise UserError("empty CUDA architecture", where="--arch", hint="use e.g. sm_90")
    return ";".join(out)


def resolve_arch(backend: str, arch: str | None) -> str | None:
    """The GPU architecture a build targets: ``arch`` validated, else the first visible GPU's.

    cuda: CMake's form ("90", "86"; from ``sm_90``, ``9.0``...); hip: the gfx target ("gfx1100"); cpu: None.
    UserError for an unknown backend, an invalid arch, or a GPU backend with no arch given and none detected.
    """
    check_backend(backend)
    if backend == "cuda":
        if arch is None:
            from lucebench.engines.detect import detect_cuda_arch

            arch = detect_cuda_arch()
            if arch is None:
                raise UserError("cannot detect the CUDA architecture (no NVIDIA GPU visible)", where="--arch",
                                hint="pass --arch, e.g. --arch 90 for an H100/H200 or 86 for an RTX 3090")
        return normalize_cuda_arch(arch)
    if backend == "hip":
        if arch is None:
            from lucebench.engines.detect import detect_hip_arch

            arch = detect_hip_arch()
            if arch is None:
                raise UserError("cannot detect the AMD GPU architecture (no rocminfo output)", where="--arch",
                                hint="pass --arch, e.g. --arch gfx1100")
        if not re.fullmatch(r"gfx[0-9a-f]{3,4}", arch):
            raise UserError(f"not an AMD GPU architecture: {arch!r}", where="--arch", hint="use e.g. gfx1100 or gfx90a")
        return arch
    return None


# ---------------------------------------------------------------------------------------------- compilers
def first_line(argv: Sequence[str]) -> str | None:
    """The first non-empty line a tool prints (stdout, else stderr); None when it is missing or fails to run."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (r.stdout or r.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else None


def host_compiler() -> str:
    """The C++ compiler's version line ($CXX, else c++), e.g. "g++ (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0"."""
    cxx = os.environ.get("CXX") or "c++"
    return first_line([cxx, "--version"]) or f"unknown {cxx}"


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME, $CUDA_PATH or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for cand in (os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"):
        if cand and (Path(cand) / "bin" / "nvcc").is_file():
            return str(Path(cand) / "bin" / "nvcc")
    return None


def nvcc_release(nvcc: str) -> str:
    """nvcc's release line ("Cuda compilation tools, release 13.0, V13.0.88")."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), "nvcc")


def compiler_id(backend: str) -> str:
    """The compilers a build for ``backend`` uses, as one string: the device compiler's release + the host's.

    UserError when the backend's compiler is not installed.
    """
    check_backend(backend)
    host = host_compiler()
    if backend == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise UserError("nvcc not found: cannot build the cuda backend", where="--backend cuda",
                            hint="install the CUDA toolkit and put nvcc on PATH (or set CUDA_HOME), or use --backend cpu")
        return f"{nvcc_release(nvcc)} + {host}"
    if backend == "hip":
        if shutil.which("hipcc") is None:
            raise UserError("hipcc not found: cannot build the hip backend", where="--backend hip",
                            hint="install ROCm (hipcc), or use --backend cpu")
        return f"{first_line(['hipcc', '--version']) or 'hipcc'} + {host}"
    return host


# ---------------------------------------------------------------------------------------------- steps
@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path``: two processes asking for one build wait for one compile."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_logged(argv: Sequence[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    """Run one build step with its command line, output and exit status appended to ``log``; its exit status."""
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(list(argv), cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
        fh.write(f"[exit {proc.returncode}]\n")
    return proc.returncode


def log_tail(log: Path, n: int = 25) -> str:
    """What a failure message quotes: the first error lines (when the tail does not show them) and the last n lines."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    tail = lines[-n:]
    picked = errors[:10] + ["..."] + tail if errors and errors[0] not in tail else tail
    return "\n".join(picked)


def build_jobs(jobs: int | None = None) -> int:
    """Parallel compile jobs: ``jobs``, else $LUCEBENCH_BUILD_JOBS, else the CPU count up to MAX_DEFAULT_JOBS."""
    if jobs:
        return jobs
    env = os.environ.get("LUCEBENCH_BUILD_JOBS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_JOBS))


# ---------------------------------------------------------------------------------------------- sources
def tree_hash(root: Path, suffixes: frozenset[str] | set[str]) -> str:
    """sha256 (first 16 hex digits) over the relative paths and contents of the files under ``root`` with one of
    ``suffixes``, build folders (``build*`` at the top, ``*/build/*``) left out."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("build") or "/build/" in rel:
            continue
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
