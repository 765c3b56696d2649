"""Configure and build the bundled engines (engines/, one CMake project) into a cache.

A build directory is keyed by the engine sources' hash, the backend, the GPU architecture and the
compiler version, so a finished build is reused until one of them changes. The compiler output of every
build is kept in `build.log` inside that directory; a failed build raises BuildError quoting its end.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from lucebench.errors import UserError

# Engine name -> CMake target / executable name.
BUNDLED_ENGINES: dict[str, str] = {"ar": "lucebench-ar", "megakernel": "lucebench-megakernel"}
BACKENDS = ("cpu", "cuda", "hip")
_SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".txt", ".json", ".cmake", ".hip"}


class BuildError(UserError):
    """A build that failed: the message ends with the last lines of the compiler output."""

    def __init__(self, message: str, *, log: Path | None = None, hint: str | None = None):
        super().__init__(message, where=str(log) if log else None, hint=hint, exit_code=1)
        self.log = log


def engines_source_dir() -> Path:
    """The engines/ folder of this checkout (the package is used from a source tree)."""
    src = Path(__file__).resolve().parents[2] / "engines"
    if not (src / "CMakeLists.txt").is_file():
        raise UserError(f"engine sources not found at {src}",
                        hint="bundled engines are built from a lucebench source checkout (git clone, pip install -e .)")
    return src


def cache_root() -> Path:
    """Root of the build cache: $LUCEBENCH_CACHE/build, default ~/.cache/lucebench/build."""
    base = os.environ.get("LUCEBENCH_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "lucebench") / "build"


def source_hash(src: Path | None = None) -> str:
    """sha256 (first 16 hex digits) over the relative paths and contents of the engine sources."""
    src = src or engines_source_dir()
    digest = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in _SOURCE_SUFFIXES):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("build") or "/build/" in rel:
            continue
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        raise UserError("cmake not found", hint="install CMake >= 3.22 (pip install cmake, or your package manager)")
    return exe


def _first_line(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def compiler_version(backend: str) -> str:
    """The compiler that a build for `backend` uses, as its version line ("nvcc: ... release 13.0, V13.0.48")."""
    cxx = os.environ.get("CXX", "c++")
    host = _first_line([cxx, "--version"]) or "unknown c++"
    if backend == "cuda":
        if shutil.which("nvcc") is None:
            raise UserError("nvcc not found: cannot build the cuda backend",
                            hint="install the CUDA toolkit and put nvcc on PATH, or use --backend cpu")
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=False).stdout
        release = next((line.strip() for line in out.splitlines() if "release" in line), "nvcc")
        return f"{release} + {host}"
    if backend == "hip":
        if shutil.which("hipcc") is None:
            raise UserError("hipcc not found: cannot build the hip backend",
                            hint="install ROCm (hipcc), or use --backend cpu")
        return f"{_first_line(['hipcc', '--version']) or 'hipcc'} + {host}"
    return host


def _check(backend: str, arch: str | None) -> None:
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}", hint="use cpu, cuda or hip")
    if arch is not None and backend == "cuda":
        digits = arch.removeprefix("sm_")
        if not digits.isdigit() or not 75 <= int(digits) <= 121:
            raise UserError(f"CUDA arch {arch!r} is not supported", hint="give a compute capability from 75 to 120, e.g. 86 or 90")


def _resolve_arch(backend: str, arch: str | None) -> str | None:
    if backend == "cuda":
        if arch is None:
            from lucebench.engines.detect import detect_cuda_arch

            arch = detect_cuda_arch()
            if arch is None:
                raise UserError("cannot detect the CUDA architecture (no NVIDIA GPU visible)",
                                hint="pass --arch, e.g. --arch 90 for an H100/H200 or 86 for an RTX 3090")
        return arch.removeprefix("sm_")
    if backend == "hip":
        if arch is None:
            from lucebench.engines.detect import detect_hip_arch

            arch = detect_hip_arch()
        return arch
    return None


def build_dir(backend: str, arch: str | None = None) -> Path:
    """The cache folder a build for (sources, backend, arch, compiler) lives in."""
    _check(backend, arch)
    arch = _resolve_arch(backend, arch)
    key = hashlib.sha256(f"{source_hash()}|{backend}|{arch}|{compiler_version(backend)}".encode()).hexdigest()[:16]
    return cache_root() / f"{backend}-{arch or 'host'}-{key}"


def _log_tail(log: Path, n: int = 25) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    tail = lines[-n:]
    picked = errors[:10] + ["..."] + tail if errors and errors[0] not in tail else tail
    return "\n".join(picked)


def _run_logged(argv: list[str], log: Path, cwd: Path) -> int:
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, check=False)
        fh.write(f"[exit {proc.returncode}]\n")
    return proc.returncode


def build_engine(name: str, *, backend: str, arch: str | None = None, console: Any = None) -> Path:
    """Build (or reuse) bundled engine `name` for `backend` and return the executable's path.

    `arch` is the CUDA compute capability ("90", "sm_86") or the HIP gfx target; None auto-detects.
    Raises UserError for an unknown engine/backend and BuildError (with the log's last lines) when the
    compiler fails.
    """
    if name not in BUNDLED_ENGINES:
        raise UserError(f"unknown bundled engine {name!r}", hint=f"bundled engines: {', '.join(BUNDLED_ENGINES)}")
    target = BUNDLED_ENGINES[name]
    _check(backend, arch)
    arch = _resolve_arch(backend, arch)
    src = engines_source_dir()
    shash = source_hash(src)
    compiler = compiler_version(backend)
    key = hashlib.sha256(f"{shash}|{backend}|{arch}|{compiler}".encode()).hexdigest()[:16]
    out = cache_root() / f"{backend}-{arch or 'host'}-{key}"
    exe = out / target
    marker = out / f".built-{target}.json"
    if exe.is_file() and marker.is_file():
        return exe
    out.mkdir(parents=True, exist_ok=True)
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per folder at a time (parallel test workers)
        if exe.is_file() and marker.is_file():
            return exe
        log = out / "build.log"
        configure = [_cmake(), "-S", str(src), "-B", str(out), f"-DLUCEBENCH_BACKEND={backend}",
                     "-DCMAKE_BUILD_TYPE=Release", f"-DLUCEBENCH_SOURCE_HASH={shash}"]
        if backend == "cuda":
            configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
        if backend == "hip" and arch:
            configure.append(f"-DCMAKE_HIP_ARCHITECTURES={arch}")
        jobs = os.environ.get("LUCEBENCH_BUILD_JOBS") or str(max(1, min(os.cpu_count() or 1, 16)))
        compile_ = [_cmake(), "--build", str(out), "--target", target, "-j", jobs]
        if console is not None:
            console.print(f"building {name} ({backend}{' sm_' + arch if backend == 'cuda' else ''}) in {out}")
        started = time.monotonic()
        for step, argv in (("configure", configure), ("build", compile_)):
            if _run_logged(argv, log, out) != 0:
                raise BuildError(f"{step} of engine {name!r} for {backend} failed:\n{_log_tail(log)}", log=log,
                                 hint=f"the full compiler output is in {log}")
        if not exe.is_file():
            raise BuildError(f"build of {name!r} finished without producing {exe}", log=log)
        record = {"engine": name, "backend": backend, "arch": arch, "source_hash": shash, "compiler": compiler,
                  "configure": configure, "seconds": round(time.monotonic() - started, 1),
                  "flags": _cmake_flags(out, backend)}
        marker.write_text(json.dumps(record, indent=2))
        return exe


def _cmake_flags(out: Path, backend: str) -> str:
    """The optimisation flags the build used, read back from CMakeCache.txt."""
    cache = out / "CMakeCache.txt"
    values: dict[str, str] = {}
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if "=" in line and ":" in line.split("=", 1)[0]:
                key, value = line.split("=", 1)
                values[key.split(":", 1)[0]] = value
    flags = [values.get("CMAKE_CXX_FLAGS", ""), values.get("CMAKE_CXX_FLAGS_RELEASE", "")]
    if backend == "cuda":
        flags += [values.get("CMAKE_CUDA_FLAGS", ""), values.get("CMAKE_CUDA_FLAGS_RELEASE", "")]
        arch = values.get("CMAKE_CUDA_ARCHITECTURES")
        if arch:
            flags.append(f"-arch=sm_{arch}")
    return " ".join(f for f in flags if f).strip()


def build_info(name: str, *, backend: str, arch: str | None = None) -> dict[str, Any]:
    """What a result file records about an engine build: compiler, flags, arch, source hash, backend.

    Read from the finished build when there is one; otherwise what a build would use now.
    """
    _check(backend, arch)
    arch = _resolve_arch(backend, arch)
    shash = source_hash()
    compiler = compiler_version(backend)
    key = hashlib.sha256(f"{shash}|{backend}|{arch}|{compiler}".encode()).hexdigest()[:16]
    marker = cache_root() / f"{backend}-{arch or 'host'}-{key}" / f".built-{BUNDLED_ENGINES.get(name, name)}.json"
    if marker.is_file():
        record = json.loads(marker.read_text())
        return {"engine": name, "backend": backend, "compiler": record["compiler"], "flags": record.get("flags", ""),
                "arch": f"sm_{arch}" if backend == "cuda" else (arch or "host"), "source_hash": shash,
                "build_seconds": record.get("seconds")}
    return {"engine": name, "backend": backend, "compiler": compiler, "flags": "-O3 (CMake Release)",
            "arch": f"sm_{arch}" if backend == "cuda" else (arch or "host"), "source_hash": shash}
