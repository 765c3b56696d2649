"""Build llama.cpp (llama-bench, llama-server, llama-quantize) with CMake, cached by what determines the binary.

The cache key is (commit, source hash, backend, arch, CMake flags, compiler, host CPU): a CPU build uses
``GGML_NATIVE`` (``-march=native``), so a cached binary is only reused on the same kind of CPU.
Every build writes its full configure + compile output to ``build.log`` beside the binaries; a failure
raises :class:`LlamaCppBuildError` naming that log, which is kept. Arch resolution, compiler id, the lock and
the logged steps are lucebench.engines.cmake's, shared with the bundled engines' build.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lucebench.baselines.llamacpp.source import LlamaCppSource, llamacpp_cache_dir, locate_source
from lucebench.engines.cmake import (
    BACKENDS,
    BuildError,
    build_jobs,
    check_backend,
    find_nvcc,
    host_compiler,
    locked,
    log_tail,
    normalize_cuda_arch,
    nvcc_release,
    resolve_arch,
    run_logged,
)
from lucebench.errors import UserError

__all__ = ["BACKENDS", "TARGETS", "LlamaCppBuild", "LlamaCppBuildError", "build_llamacpp", "cmake_flags_for",
           "normalize_cuda_arch", "prune_objects"]
#: Only what the baseline runs; the rest of llama.cpp's targets are never built.
TARGETS = ("llama-bench", "llama-server", "llama-quantize")
RECORD_NAME = "build.json"

# Flags common to every backend. Static libraries make the binaries self-contained (no RPATH into the
# build tree). The web UI would otherwise be downloaded from Hugging Face at build time, and HTTPS / curl
# pull in system libraries we neither need nor want to vary between machines.
_COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_NATIVE=ON",
)


class LlamaCppBuildError(BuildError):
    """A llama.cpp configure or compile step failed; the compiler output is kept in ``log``."""


@dataclass(frozen=True)
class LlamaCppBuild:
    """A finished llama.cpp build: where its binaries are and exactly how they were made."""

    bin_dir: Path
    commit: str
    backend: str
    arch: str | None
    cmake_flags: tuple[str, ...]
    compiler: str
    build_log: Path
    source_hash: str = ""
    source_root: str | None = None
    cuda_compiler: str | None = None
    generator: str | None = None
    build_seconds: float | None = None
    host: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        """The folder of the binaries (what `lucebench build llama.cpp` prints)."""
        return self.bin_dir

    @property
    def build_dir(self) -> Path:
        """The folder holding ``build.json`` and ``build.log`` (parent of the CMake tree)."""
        return self.build_log.parent

    def binary(self, name: str) -> Path:
        """Path of one built tool (``llama-bench``, ``llama-server``, ``llama-quantize``)."""
        p = self.bin_dir / name
        if not p.is_file():
            raise UserError(f"{name} is not in the llama.cpp build at {self.bin_dir}", where=str(self.bin_dir),
                            hint="run `lucebench build llama.cpp` again")
        return p

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (what results store under engine.build)."""
        d = asdict(self)
        d["bin_dir"] = str(self.bin_dir)
        d["build_log"] = str(self.build_log)
        d["cmake_flags"] = list(self.cmake_flags)
        d["flags"] = " ".join(self.cmake_flags)
        d["engine"] = "llama.cpp"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaCppBuild:
        return cls(bin_dir=Path(d["bin_dir"]), commit=d["commit"], backend=d["backend"], arch=d.get("arch"),
                   cmake_flags=tuple(d["cmake_flags"]), compiler=d["compiler"], build_log=Path(d["build_log"]),
                   source_hash=d.get("source_hash", ""), source_root=d.get("source_root"),
                   cuda_compiler=d.get("cuda_compiler"), generator=d.get("generator"),
                   build_seconds=d.get("build_seconds"), host=dict(d.get("host") or {}))

    @classmethod
    def load(cls, path: Path) -> LlamaCppBuild:
        """Read a build record (``build.json``, or the folder that holds it)."""
        p = path / RECORD_NAME if path.is_dir() else path
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise UserError(f"cannot read llama.cpp build record: {e}", where=str(p),
                            hint="run `lucebench build llama.cpp`") from None


def _host_signature() -> dict[str, str]:
    """CPU model and ISA flags: a -march=native binary is only valid on a CPU with the same flags."""
    model, flags = platform.processor() or "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = val.strip()
            elif key in ("flags", "Features") and not flags:
                flags = val.strip()
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": model,
            "cpu_flags_sha256": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16]}


def cmake_flags_for(backend: str, arch: str | None, commit: str, extra: Sequence[str] = ()) -> list[str]:
    """The CMake -D flags of a build (without -S/-B/-G), in the order they are passed."""
    check_backend(backend)
    flags = list(_COMMON_FLAGS)
    # Build info: the tree may have no .git, so llama.cpp's own detection would print 'unknown'.
    flags.append(f"-DLLAMA_BUILD_COMMIT={commit[:7] if commit != 'unknown' else 'unknown'}")
    if backend == "cuda":
        flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    elif backend == "hip":
        flags += ["-DGGML_HIP=ON", f"-DGPU_TARGETS={arch}"]
    flags += list(extra)
    return flags


def prune_objects(cmake_dir: Path) -> None:
    """Delete a finished build's intermediate files, keeping ``bin/`` and ``CMakeCache.txt``.

    The binaries are statically linked against llama/ggml, and a changed input always gets a new build
    folder (never an incremental rebuild), so the ~100 MB of objects only cost cache space (CI caches this).
    """
    for child in cmake_dir.iterdir():
        if child.name in ("bin", "CMakeCache.txt"):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def build_llamacpp(*, backend: str = "cpu", arch: str | None = None, source: Path | None = None, console: Any = None,
                   cmake_args: Sequence[str] = (), jobs: int | None = None) -> LlamaCppBuild:
    """Configure and build llama-bench, llama-server and llama-quantize; reuse a cached build when one matches.

    backend: 'cpu', 'cuda' (arch auto-detected from nvidia-smi when None) or 'hip' (from rocminfo).
    source: a llama.cpp tree or archive; None -> ``$LUCEBENCH_LLAMACPP_SRC`` or the pinned sdist.
    cmake_args: extra -D flags (recorded and part of the cache key). jobs: parallel compile jobs
    (default ``$LUCEBENCH_BUILD_JOBS`` or the CPU count).
    Raises UserError for bad arguments or a missing toolkit, LlamaCppBuildError when CMake fails.
    """
    check_backend(backend)
    src: LlamaCppSource = locate_source(source, console=console)
    if shutil.which("cmake") is None:
        raise UserError("cmake not found on PATH", where="llama.cpp build", hint="pip install cmake, or apt install cmake")
    env = dict(os.environ)
    cuda_compiler = None
    arch = resolve_arch(backend, arch)
    if backend == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise UserError("nvcc not found: cannot build the CUDA backend", where="--backend cuda",
                            hint="install the CUDA toolkit or set CUDA_HOME")
        cuda_compiler = nvcc_release(nvcc)
        env.setdefault("CUDACXX", nvcc)
    elif backend == "hip":
        if shutil.which("hipconfig"):
            # llama.cpp's documented HIP setup: ROCm's clang as the HIP compiler.
            env.setdefault("HIPCXX", str(Path(subprocess.run(["hipconfig", "-l"], capture_output=True, check=False,
                                                              text=True).stdout.strip()) / "clang"))
            env.setdefault("HIP_PATH", subprocess.run(["hipconfig", "-R"], capture_output=True, check=False, text=True).stdout.strip())
    flags = cmake_flags_for(backend, arch, src.commit, cmake_args)
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    compiler = host_compiler()
    host = _host_signature()
    key_doc = {"commit": src.commit, "source_hash": src.source_hash, "backend": backend, "arch": arch,
               "flags": flags, "compiler": compiler, "cuda_compiler": cuda_compiler, "generator": generator,
               "host": host, "targets": list(TARGETS)}
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:12]
    arch_tag = (arch or "native").replace(";", "+")
    out = llamacpp_cache_dir() / "build" / f"{src.commit_short}-{backend}-{arch_tag}-{key}"
    record = out / RECORD_NAME
    with locked(out.parent / f"{out.name}.lock"):
        if record.is_file():
            cached = LlamaCppBuild.load(record)
            if all((cached.bin_dir / t).is_file() for t in TARGETS):
                return cached
        out.mkdir(parents=True, exist_ok=True)
        log = out / "build.log"
        log.write_text(f"# llama.cpp {src.commit} ({src.origin}: {src.root}) backend={backend} arch={arch}\n")
        cmake_dir = out / "cmake"
        n_jobs = build_jobs(jobs)
        msg = f"llama.cpp: building {', '.join(TARGETS)} ({backend}{'/' + arch if arch else ''}, -j{n_jobs}); log: {log}"
        if console is not None:
            console.print(msg)
        else:
            print(msg, file=sys.stderr, flush=True)
        t0 = time.monotonic()
        for step, argv in (("CMake configure", ["cmake", "-S", str(src.root), "-B", str(cmake_dir), "-G", generator,
                                                *flags]),
                           ("compile", ["cmake", "--build", str(cmake_dir), "--config", "Release", "-j", str(n_jobs),
                                        "--target", *TARGETS])):
            rc = run_logged(argv, log, env=env)
            if rc != 0:
                raise LlamaCppBuildError(f"llama.cpp {step} failed (exit {rc}); full output kept in {log}\n"
                                         f"{log_tail(log)}", log=log,
                                         hint="read the log above; a wrong --arch or a missing toolkit is common")
        seconds = round(time.monotonic() - t0, 1)
        bin_dir = cmake_dir / "bin"
        missing = [t for t in TARGETS if not (bin_dir / t).is_file()]
        if missing:
            raise LlamaCppBuildError(f"llama.cpp build finished without {', '.join(missing)} in {bin_dir}", log=log)
        build = LlamaCppBuild(bin_dir=bin_dir, commit=src.commit, backend=backend, arch=arch, cmake_flags=tuple(flags),
                              compiler=compiler, build_log=log, source_hash=src.source_hash, source_root=str(src.root),
                              cuda_compiler=cuda_compiler, generator=generator, build_seconds=seconds, host=host)
        prune_objects(cmake_dir)
        with log.open("a") as fh:
            fh.write(f"\n# built in {seconds} s\n")
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(build.to_dict(), indent=1) + "\n")
        tmp.replace(record)
        return build
