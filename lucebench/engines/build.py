"""Configure and build the bundled engines (engines/, one CMake project) into a cache.

A build directory is keyed by the engine sources' hash, the backend, the GPU architecture and the
compiler version, so a finished build is reused until one of them changes. The compiler output of every
build is kept in `build.log` inside that directory; a failed build raises BuildError quoting its end.
The steps shared with the llama.cpp build (arch, compiler id, lock, logged steps) are in lucebench.engines.cmake.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from lucebench.engines.cmake import (
    BACKENDS,
    BuildError,
    build_jobs,
    cmake_exe,
    compiler_id,
    locked,
    log_tail,
    resolve_arch,
    run_logged,
    tree_hash,
)
from lucebench.errors import UserError

__all__ = ["BACKENDS", "BUNDLED_ENGINES", "BuildError", "build_dir", "build_engine", "build_info", "cache_root",
           "engines_source_dir", "source_hash"]

# Engine name -> CMake target / executable name.
BUNDLED_ENGINES: dict[str, str] = {"ar": "lucebench-ar", "megakernel": "lucebench-megakernel",
                                   "dflash": "lucebench-dflash", "pflash": "lucebench-pflash"}
_SOURCE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".txt", ".json", ".cmake", ".hip"})


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
    return tree_hash(src or engines_source_dir(), _SOURCE_SUFFIXES)


def _build_key(backend: str, arch: str | None) -> tuple[str, str, str | None, str]:
    """(cache folder, source hash, arch, compiler id) of a build for (sources, backend, arch, compiler)."""
    arch = resolve_arch(backend, arch)
    shash = source_hash()
    compiler = compiler_id(backend)
    key = hashlib.sha256(f"{shash}|{backend}|{arch}|{compiler}".encode()).hexdigest()[:16]
    return f"{backend}-{arch or 'host'}-{key}", shash, arch, compiler


def build_dir(backend: str, arch: str | None = None) -> Path:
    """The cache folder a build for (sources, backend, arch, compiler) lives in."""
    return cache_root() / _build_key(backend, arch)[0]


def build_engine(name: str, *, backend: str, arch: str | None = None, console: Any = None) -> Path:
    """Build (or reuse) bundled engine `name` for `backend` and return the executable's path.

    `arch` is the CUDA compute capability ("90", "sm_86") or the HIP gfx target; None auto-detects.
    Raises UserError for an unknown engine/backend and BuildError (with the log's last lines) when the
    compiler fails.
    """
    if name not in BUNDLED_ENGINES:
        raise UserError(f"unknown bundled engine {name!r}", hint=f"bundled engines: {', '.join(BUNDLED_ENGINES)}")
    target = BUNDLED_ENGINES[name]
    folder, shash, arch, compiler = _build_key(backend, arch)
    src = engines_source_dir()
    out = cache_root() / folder
    exe = out / target
    marker = out / f".built-{target}.json"
    if exe.is_file() and marker.is_file():
        return exe
    out.mkdir(parents=True, exist_ok=True)
    with locked(out / ".lock"):
        if exe.is_file() and marker.is_file():
            return exe
        log = out / "build.log"
        configure = [cmake_exe(), "-S", str(src), "-B", str(out), f"-DLUCEBENCH_BACKEND={backend}",
                     "-DCMAKE_BUILD_TYPE=Release", f"-DLUCEBENCH_SOURCE_HASH={shash}"]
        if backend == "cuda":
            configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
        if backend == "hip" and arch:
            configure.append(f"-DCMAKE_HIP_ARCHITECTURES={arch}")
        compile_ = [cmake_exe(), "--build", str(out), "--target", target, "-j", str(build_jobs())]
        if console is not None:
            console.print(f"building {name} ({backend}{' sm_' + arch if backend == 'cuda' and arch else ''}) in {out}")
        started = time.monotonic()
        for step, argv in (("configure", configure), ("build", compile_)):
            if run_logged(argv, log, cwd=out) != 0:
                raise BuildError(f"{step} of engine {name!r} for {backend} failed:\n{log_tail(log)}", log=log,
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
    folder, shash, arch, compiler = _build_key(backend, arch)
    marker = cache_root() / folder / f".built-{BUNDLED_ENGINES.get(name, name)}.json"
    if marker.is_file():
        record = json.loads(marker.read_text())
        return {"engine": name, "backend": backend, "compiler": record["compiler"], "flags": record.get("flags", ""),
                "arch": f"sm_{arch}" if backend == "cuda" else (arch or "host"), "source_hash": shash,
                "build_seconds": record.get("seconds")}
    return {"engine": name, "backend": backend, "compiler": compiler, "flags": "-O3 (CMake Release)",
            "arch": f"sm_{arch}" if backend == "cuda" else (arch or "host"), "source_hash": shash}
