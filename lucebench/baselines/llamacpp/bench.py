"""pp / tg / depth measurements through ``llama-bench -o jsonl``, parsed defensively.

llama-bench's stdout can carry backend log lines (ggml/CUDA init messages; llama.cpp issue 15554), so the
parser keeps only JSON objects that have the keys of a llama-bench test row, wherever on a line they start.
Each row carries its per-repetition ``samples_ns``; we keep them raw and remember when the row appeared
on our CLOCK_MONOTONIC, so the adapter can place the measured windows on the harness's clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lucebench.baselines.llamacpp.build import LlamaCppBuild
from lucebench.errors import EngineError, UserError

#: Our KV-cache element types (protocol --kv-k/--kv-v) -> llama.cpp's -ctk/-ctv names.
KV_TYPES: dict[str, str] = {"f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0"}
#: Keys every llama-bench test row has; a JSON object without them is not a result (e.g. a log record).
ROW_KEYS = frozenset({"n_prompt", "n_gen", "n_depth", "samples_ns", "avg_ns", "build_commit"})
_DECODER = json.JSONDecoder()


def kv_type_flag(kv: str, *, where: str = "kv_type") -> str:
    """llama.cpp's name for one of our KV types; UserError for anything else (with the allowed list)."""
    key = str(kv).strip().lower()
    if key not in KV_TYPES:
        raise UserError(f"KV-cache type {kv!r} is not supported by the llama.cpp baseline", where=where,
                        hint=f"one of {', '.join(KV_TYPES)}")
    return KV_TYPES[key]


def flash_attn_flag(flash_attn: bool | None) -> str:
    """-fa value: on / off, or auto when the config leaves it open."""
    return "auto" if flash_attn is None else ("on" if flash_attn else "off")


@dataclass
class BenchRecord:
    """One llama-bench test row (one shape, all repetitions)."""

    n_prompt: int
    n_gen: int
    n_depth: int
    samples_ns: list[int]
    build_commit: str
    raw: dict[str, Any] = field(repr=False)
    line_time_ns: int | None = None  # CLOCK_MONOTONIC when the row's line was read (None when parsed offline)

    @property
    def test(self) -> str:
        """'pp', 'tg' or 'pg' (prompt + generation in one timing)."""
        if self.n_prompt and self.n_gen:
            return "pg"
        return "pp" if self.n_prompt else "tg"

    @property
    def name(self) -> str:
        """llama-bench's label, e.g. 'pp512', 'tg128 @ d4096'."""
        base = {"pp": f"pp{self.n_prompt}", "tg": f"tg{self.n_gen}", "pg": f"pp{self.n_prompt}+tg{self.n_gen}"}[self.test]
        return base + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def tokens(self) -> int:
        return self.n_prompt + self.n_gen

    def tokens_per_s(self) -> list[float]:
        """Per-repetition throughput (tokens of the timed test / sample seconds)."""
        return [self.tokens / (s / 1e9) for s in self.samples_ns if s > 0]

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.name, "n_prompt": self.n_prompt, "n_gen": self.n_gen, "n_depth": self.n_depth,
                "samples_ns": self.samples_ns, "build_commit": self.build_commit, "line_time_ns": self.line_time_ns,
                "row": self.raw}


def parse_row(line: str, *, line_time_ns: int | None = None) -> BenchRecord | None:
    """The llama-bench row on ``line``, or None when the line holds none (log text, other JSON, garbage)."""
    start = line.find("{")
    while start != -1:
        try:
            obj, _ = _DECODER.raw_decode(line, start)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and ROW_KEYS <= obj.keys():
            try:
                samples = [int(s) for s in obj["samples_ns"]]
                return BenchRecord(n_prompt=int(obj["n_prompt"]), n_gen=int(obj["n_gen"]), n_depth=int(obj["n_depth"]),
                                   samples_ns=samples, build_commit=str(obj["build_commit"]), raw=obj,
                                   line_time_ns=line_time_ns)
            except (TypeError, ValueError):
                return None
        start = line.find("{", start + 1)
    return None


def parse_bench_output(text: str | Iterable[str]) -> list[BenchRecord]:
    """Every llama-bench row in jsonl output that may be interleaved with log lines."""
    lines = text.splitlines() if isinstance(text, str) else text
    return [r for r in (parse_row(ln) for ln in lines) if r is not None]


def bench_argv(binary: Path | str, gguf: Path | str, *, n_prompt: Sequence[int] = (512,), n_gen: Sequence[int] = (128,),
               depth: Sequence[int] = (0,), reps: int = 5, flash_attn: bool | None = None, kv_k: str = "f16",
               kv_v: str = "f16", n_gpu_layers: int = 99, threads: int | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """The exact llama-bench command line for a sweep (every combination of the list-valued axes)."""
    if reps < 1:
        raise UserError(f"repetitions must be >= 1, got {reps}", where="repetitions")
    argv = [str(binary), "-m", str(gguf), "-o", "jsonl",
            "-p", ",".join(str(int(p)) for p in n_prompt), "-n", ",".join(str(int(n)) for n in n_gen),
            "-d", ",".join(str(int(d)) for d in depth), "-r", str(int(reps)),
            "-fa", flash_attn_flag(flash_attn), "-ctk", kv_type_flag(kv_k, where="kv_k"),
            "-ctv", kv_type_flag(kv_v, where="kv_v"), "-ngl", str(int(n_gpu_layers))]
    if threads:
        argv += ["-t", str(int(threads))]
    return argv + list(extra)


def binary_version(build: LlamaCppBuild, tool: str) -> str:
    """What ``<tool> --version`` prints, one line (llama.cpp writes its build info to stderr)."""
    try:
        r = subprocess.run([str(build.binary(tool)), "--version"], capture_output=True, check=False, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    text = (r.stdout + r.stderr).strip()
    # keep the build-info lines only: some backends log device probing before them
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("version:", "built with"))]
    return " | ".join(lines) or " | ".join(ln.strip() for ln in text.splitlines() if ln.strip())


def llama_bench_version(build: LlamaCppBuild) -> str:
    """What ``llama-bench --version`` prints, e.g. 'version: 0 (0c1e570) | built with GNU 12.2.0 for Linux x86_64'."""
    return binary_version(build, "llama-bench")


@dataclass
class BenchRun:
    """A finished llama-bench process: its argv, version string, rows and the tail of its stderr."""

    argv: list[str]
    version: str
    records: list[BenchRecord]
    seconds: float
    stderr_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"argv": self.argv, "version": self.version, "seconds": self.seconds,
                "records": [r.to_dict() for r in self.records]}


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_llama_bench(build: LlamaCppBuild, gguf: Path, *, n_prompt: Sequence[int] = (512,), n_gen: Sequence[int] = (128,),
                    depth: Sequence[int] = (0,), reps: int = 5, flash_attn: bool | None = None, kv_k: str = "f16",
                    kv_v: str = "f16", n_gpu_layers: int | None = None, threads: int | None = None,
                    timeout_s: float | None = None, stderr_path: Path | None = None, version: str | None = None,
                    extra: Sequence[str] = ()) -> BenchRun:
    """Run llama-bench on ``gguf`` and return its rows with per-repetition samples and line arrival times.

    n_gpu_layers defaults to all layers on a GPU build and 0 on a CPU build. stderr goes to
    ``stderr_path`` (or a temporary file) so a chatty backend cannot block the pipe.
    extra: more llama-bench arguments (e.g. -ub / -b, --no-warmup), appended to the command line.
    Raises EngineError (kind 'internal') when llama-bench fails or prints no row.
    """
    if not Path(gguf).is_file():
        raise UserError(f"GGUF file not found: {gguf}", where="model")
    ngl = n_gpu_layers if n_gpu_layers is not None else (0 if build.backend == "cpu" else 99)
    argv = bench_argv(build.binary("llama-bench"), gguf, n_prompt=n_prompt, n_gen=n_gen, depth=depth, reps=reps,
                      flash_attn=flash_attn, kv_k=kv_k, kv_v=kv_v, n_gpu_layers=ngl, threads=threads, extra=extra)
    ver = version if version is not None else llama_bench_version(build)
    own_tmp = stderr_path is None
    err_path = stderr_path or Path(tempfile.mkstemp(prefix="llama-bench-", suffix=".log")[1])
    records: list[BenchRecord] = []
    t0 = time.monotonic()
    deadline = None if timeout_s is None else t0 + timeout_s
    try:
        with err_path.open("ab") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
                                    bufsize=1, start_new_session=True)
            # llama-bench prints a row only when a test ends, so reading stdout can block past the deadline: a
            # watchdog kills it there.
            fired = threading.Event()

            def expire() -> None:
                fired.set()
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)

            watchdog = threading.Timer(timeout_s, expire) if timeout_s is not None else None
            if watchdog is not None:
                watchdog.daemon = True
                watchdog.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    rec = parse_row(line, line_time_ns=time.monotonic_ns())
                    if rec is not None:
                        records.append(rec)
                    if deadline is not None and time.monotonic() > deadline:
                        raise subprocess.TimeoutExpired(argv, timeout_s or 0)
                rc = proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.monotonic()))
                if fired.is_set():
                    raise subprocess.TimeoutExpired(argv, timeout_s or 0)
            except subprocess.TimeoutExpired:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                proc.wait()
                raise EngineError("timeout", f"llama-bench ran past {timeout_s} s", stderr_tail=_tail(err_path)) from None
            except BaseException:
                # Ctrl-C or an error of ours: never leave llama-bench running on the GPU.
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                raise
            finally:
                if watchdog is not None:
                    watchdog.cancel()
        tail = _tail(err_path)
        if rc != 0:
            raise EngineError("internal", f"llama-bench exited with status {rc}: {' '.join(argv)}", exit_code=rc,
                              stderr_tail=tail)
        if not records:
            raise EngineError("protocol", "llama-bench printed no result row", exit_code=rc, stderr_tail=tail)
        return BenchRun(argv=argv, version=ver, records=records, seconds=round(time.monotonic() - t0, 3), stderr_tail=tail)
    finally:
        if own_tmp:
            err_path.unlink(missing_ok=True)
