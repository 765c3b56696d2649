"""The llama.cpp baseline as an engine process speaking ``lucebench.engine/v1`` (docs/protocol.md).

``python -m lucebench.baselines.llamacpp --mode server|bench --gguf FILE --build DIR ...``

* ``server``: runs ``llama-server`` on a free 127.0.0.1 port and sends each generate request to
  ``/completion`` with token ids, greedy decoding pinned and prompt caching off. Output ids come back
  from the server. Its ``timings`` (prompt_ms, predicted_ms) become our prefill / decode durations; the
  phase boundaries are placed on our CLOCK_MONOTONIC by anchoring the end of decode at the moment the
  reply was read. The true boundaries lie in ``[stamp - clock_error_ns, stamp]`` (see docs/baselines.md).
* ``bench``: each generate request runs ``llama-bench`` for its shape (``pp P`` at depth 0, then
  ``tg N-1`` at depth P). llama-bench warms up on its own, uses its own random prompt tokens and returns
  no output ids. Phase windows end when the row's line appeared on stdout.

stdout carries protocol lines only; everything else (our logs, llama-server's output) goes to stderr or
the server log file. llama-server is stopped on every exit path: shutdown, EOF, SIGTERM, errors.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from lucebench.baselines.llamacpp.bench import (
    binary_version,
    flash_attn_flag,
    kv_type_flag,
    llama_bench_version,
    run_llama_bench,
)
from lucebench.baselines.llamacpp.build import LlamaCppBuild
from lucebench.engines.protocol import (
    GenerateRequest,
    ProtocolWriter,
    ReadyMessage,
    RequestError,
    ResultMessage,
    Shutdown,
    parse_request,
    ready_message,
)
from lucebench.errors import EngineError, UserError

MODES = ("server", "bench")
_HOST = "127.0.0.1"
_PORT_ATTEMPTS = 8
# GGUF general.file_type -> our dtype name (the types the baseline makes; others print as ftype<N>).
_FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 7: "q8_0", 15: "q4_k_m", 17: "q5_k_m", 18: "q6_k", 32: "bf16"}


def command(gguf: Path, *, build: LlamaCppBuild, mode: str, ctx: int, kv_k: str, kv_v: str, flash_attn: bool,
            n_gpu_layers: int, threads: int | None, ubatch: int | None = None) -> list[str]:
    """The argv that starts the llama.cpp baseline adapter for the runner (validated here, so errors are early).

    The adapter reads the build record from ``build.build_dir``; ``gguf`` comes from :func:`prepare_gguf`.
    """
    if mode not in MODES:
        raise UserError(f"unknown llama.cpp mode {mode!r}", where="mode", hint=f"one of {', '.join(MODES)}")
    kv_type_flag(kv_k, where="kv_k")
    kv_type_flag(kv_v, where="kv_v")
    if ctx < 1:
        raise UserError(f"context size must be positive, got {ctx}", where="ctx")
    argv = [sys.executable, "-m", "lucebench.baselines.llamacpp", "--mode", mode, "--gguf", str(gguf),
            "--build", str(build.build_dir), "--ctx", str(int(ctx)), "--kv-k", kv_k, "--kv-v", kv_v,
            "--flash-attn", flash_attn_flag(flash_attn), "--n-gpu-layers", str(int(n_gpu_layers))]
    if threads:
        argv += ["--threads", str(int(threads))]
    if ubatch:
        argv += ["--ubatch", str(int(ubatch))]
    return argv


def log(msg: str) -> None:
    print(f"[llama.cpp adapter] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ model / device
def model_info(gguf: Path, source_root: str | None = None) -> dict[str, Any]:
    """The ready line's model block, read from the GGUF header (gguf package, else the source tree's gguf-py)."""
    from lucebench.baselines.llamacpp.convert import gguf_metadata

    meta = gguf_metadata(gguf, source_root=Path(source_root) if source_root else None)
    ft = meta.get("file_type")
    ft_int = int(ft) if isinstance(ft, (int, float)) else None
    sidecar = gguf.with_suffix(".gguf.json")
    info: dict[str, Any] = {"arch": meta.get("arch"), "n_layers": meta.get("n_layers"), "hidden_size": meta.get("hidden_size"),
                            "vocab_size": meta.get("vocab_size"),
                            "dtype": _FILE_TYPES.get(ft_int, f"ftype{ft_int}") if ft_int is not None else None,
                            "n_params": meta.get("n_params"), "weight_bytes": meta.get("weight_bytes"),
                            "path": str(gguf)}
    if sidecar.is_file():
        try:
            side = json.loads(sidecar.read_text())
            info["gguf_sha256"] = side.get("gguf_sha256")
            info["checkpoint_files"] = side.get("checkpoint_files")
        except json.JSONDecodeError:
            pass
    return info


def device_info(backend: str) -> dict[str, Any]:
    """Name and memory of the device the baseline runs on (GPU 0 of the visible ones, or the CPU)."""
    if backend == "cuda":
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, check=False, text=True, timeout=30)
            first = r.stdout.strip().splitlines()[0].split(", ")
            return {"name": first[1], "index": int(first[0]), "memory_bytes": int(float(first[2])) * 1024 * 1024}
        except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
            return {"name": "cuda", "index": 0}
    cpu = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"name": cpu, "index": 0 if backend != "cpu" else None}


def ready_line(build: LlamaCppBuild, gguf: Path, *, mode: str, ctx: int, version: str, command_line: list[str] | None,
               extra: dict[str, Any]) -> ReadyMessage:
    """The protocol's ready message for this baseline."""
    b = build.to_dict()
    return ready_message(
        engine={"name": "llama.cpp", "version": version, "backend": build.backend, "mode": mode,
                "build": {"compiler": b["compiler"], "flags": b["flags"], "arch": b["arch"],
                          "source_hash": b["source_hash"], "commit": b["commit"], "cmake_flags": b["cmake_flags"],
                          "cuda_compiler": b["cuda_compiler"], "generator": b["generator"]},
                "command": command_line, **extra},
        model=model_info(gguf, build.source_root), device=device_info(build.backend), limits={"max_ctx": ctx})


# ------------------------------------------------------------------------------------------------ server mode
def _set_pdeathsig() -> None:
    # Linux: the server dies with the adapter even if the adapter is SIGKILLed (no orphan holding the GPU).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((_HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


def greedy_payload(prompt_ids: list[int], n_gen: int, ignore_eos: bool) -> dict[str, Any]:
    """/completion body: token-id prompt, greedy with every sampler pinned, no prompt cache, ids returned."""
    return {"prompt": prompt_ids, "n_predict": n_gen, "ignore_eos": ignore_eos, "cache_prompt": False,
            "return_tokens": True, "stream": False, "n_probs": 0,
            # Greedy: only top_k=1 in the sampler chain; the rest are set neutral in case a chain is ignored.
            "samplers": ["top_k"], "top_k": 1, "temperature": 0.0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
            "repeat_penalty": 1.0, "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "seed": 0, "n_keep": 0}


class LlamaServer:
    """One llama-server process on a loopback port, healthy or an EngineError('load')."""

    def __init__(self, build: LlamaCppBuild, gguf: Path, *, ctx: int, kv_k: str, kv_v: str, flash_attn: str,
                 n_gpu_layers: int, threads: int | None, log_path: Path, port: int | None = None,
                 startup_timeout_s: float = 600.0, request_timeout_s: float = 3600.0, ubatch: int | None = None):
        self.build, self.gguf, self.ctx = build, gguf, ctx
        self.kv_k, self.kv_v, self.flash_attn = kv_type_flag(kv_k, where="kv_k"), kv_type_flag(kv_v, where="kv_v"), flash_attn
        self.n_gpu_layers, self.threads, self.ubatch = n_gpu_layers, threads, ubatch
        self.log_path, self.preferred_port = log_path, port
        self.startup_timeout_s, self.request_timeout_s = startup_timeout_s, request_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.argv: list[str] = []
        self.ports_tried: list[int] = []

    def server_argv(self, port: int) -> list[str]:
        """llama-server's command line: one slot, no prompt cache or context checkpoints, no web UI."""
        argv = [str(self.build.binary("llama-server")), "-m", str(self.gguf), "--host", _HOST, "--port", str(port),
                "-c", str(self.ctx), "-np", "1", "-ctk", self.kv_k, "-ctv", self.kv_v, "-fa", self.flash_attn,
                "-ngl", str(self.n_gpu_layers), "--no-cache-prompt", "--cache-ram", "0", "--ctx-checkpoints", "0",
                "--no-webui", "--seed", "0"]
        if self.threads:
            argv += ["-t", str(self.threads)]
        if self.ubatch:  # the logical batch at least the physical one, as llama.cpp requires
            argv += ["-b", str(max(2048, self.ubatch)), "-ub", str(self.ubatch)]
        return argv

    def _log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"http://{_HOST}:{self.port}/health", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError):
            return None

    def start(self) -> None:
        """Start and wait until /health answers 200; retry another port when the chosen one is taken."""
        for attempt in range(_PORT_ATTEMPTS):
            port = self.preferred_port if (attempt == 0 and self.preferred_port) else _free_port()
            self.ports_tried.append(port)
            if not _port_free(port):
                log(f"port {port} is taken; trying another")
                continue
            self.port = port
            self.argv = self.server_argv(port)
            log(f"starting {' '.join(self.argv)} (log: {self.log_path})")
            with self.log_path.open("ab") as logf:
                logf.write(f"\n$ {' '.join(self.argv)}\n".encode())
                logf.flush()
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                             preexec_fn=_set_pdeathsig)  # noqa: PLW1509 (no threads here)
            deadline = time.monotonic() + self.startup_timeout_s
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    tail = self._log_tail()
                    self.proc = None
                    if "couldn't bind" in tail or "Address already in use" in tail:
                        log(f"llama-server could not bind port {port}; trying another")
                        break
                    raise EngineError("load", f"llama-server exited with status {rc} during start-up", exit_code=rc,
                                      stderr_tail=tail)
                if self._health() == 200:
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise EngineError("load", f"llama-server did not become healthy within {self.startup_timeout_s:g} s",
                                      stderr_tail=self._log_tail())
                time.sleep(0.05)
        raise EngineError("load", f"no free loopback port after {_PORT_ATTEMPTS} attempts (tried {self.ports_tried})")

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def completion(self, prompt_ids: list[int], n_gen: int, ignore_eos: bool) -> tuple[dict[str, Any], int, int]:
        """POST /completion; return (reply, t_send_ns, t_recv_ns) on CLOCK_MONOTONIC."""
        if self.proc is None or self.proc.poll() is not None:
            raise EngineError("internal", "llama-server is not running", stderr_tail=self._log_tail())
        body = json.dumps(greedy_payload(prompt_ids, n_gen, ignore_eos)).encode()
        req = urllib.request.Request(f"http://{_HOST}:{self.port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        t_send = time.monotonic_ns()
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise RequestError("bad_request" if 400 <= e.code < 500 else "internal",
                               f"llama-server answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            alive = self.proc is not None and self.proc.poll() is None
            raise EngineError("internal", f"llama-server request failed: {e} (server {'alive' if alive else 'gone'})",
                              stderr_tail=self._log_tail()) from None
        t_recv = time.monotonic_ns()
        return json.loads(raw), t_send, t_recv


def server_result(req: GenerateRequest, reply: dict[str, Any], t_send: int, t_recv: int) -> ResultMessage:
    """Map a /completion reply to a protocol result, with phase stamps placed on our monotonic clock.

    The server times prefill (request start -> first token known) and decode (first -> last token) on its
    own clock. We anchor the end of decode at ``t_recv`` and lay the durations back from it. The reply
    window [t_send, t_recv] holds both phases, so every stamp is late by at most
    ``slack = (t_recv - t_send) - (prompt + predicted)``, reported as ``clock_error_ns``.
    """
    prompt_ids, n_gen = req.prompt_ids, req.n_gen
    ids = reply.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise RequestError("internal", "llama-server returned no token ids (return_tokens unsupported?)")
    timings = reply.get("timings") or {}
    stop = "eos" if reply.get("stop_type") == "eos" else "length"
    if not req.ignore_eos:
        eos = set(req.eos_ids)
        for i, t in enumerate(ids):
            if t in eos:  # the server stops at the GGUF's EOG tokens; the request's own eos_ids apply too
                ids, stop = ids[: i + 1], "eos"
                break
    elif len(ids) != n_gen:
        raise RequestError("internal", f"llama-server generated {len(ids)} tokens, expected exactly {n_gen}")
    prompt_ms = float(timings.get("prompt_ms") or 0.0)
    decode_ms = float(timings.get("predicted_ms") or 0.0) if len(ids) > 1 else 0.0
    t_decode_end = t_recv
    t_decode_start = t_decode_end - round(decode_ms * 1e6)
    t_prefill_start = t_decode_start - round(prompt_ms * 1e6)
    slack = max(0, (t_recv - t_send) - round((prompt_ms + decode_ms) * 1e6))
    return {"type": "result", "id": req.id, "output_ids": ids, "n_prompt": len(prompt_ids), "n_gen": len(ids),
            "stop": stop,
            "timing": {"prefill_ms": prompt_ms, "decode_ms": decode_ms,
                       "t_prefill_start_ns": t_prefill_start, "t_prefill_end_ns": t_decode_start,
                       "t_decode_start_ns": t_decode_start, "t_decode_end_ns": t_decode_end,
                       "clock_error_ns": slack, "clock_method": "server-durations-anchored-at-reply"},
            "decode_steps": max(0, len(ids) - 1),
            # llama.cpp's ignore_eos bans end-of-generation tokens (logit bias -inf) rather than generating past them
            "llamacpp": {"mode": "server", "timings": timings, "prompt_n": timings.get("prompt_n"),
                         "cache_n": timings.get("cache_n"), "eog_banned": req.ignore_eos}}


# ------------------------------------------------------------------------------------------------ bench mode
def bench_result(req: GenerateRequest, build: LlamaCppBuild, gguf: Path, *, ctx: int, kv_k: str, kv_v: str,
                 flash_attn: str, n_gpu_layers: int, threads: int | None, reps: int, version: str,
                 stderr_path: Path, ubatch: int | None = None) -> ResultMessage:
    """Run llama-bench for the request's shape and map its rows to a protocol result (no output ids).

    Windows: a row's line is printed right after its last repetition, so that repetition ran during
    [line_time - last_sample, line_time]; we report the last repetition's window and duration and keep all
    samples under ``llamacpp``.
    """
    p, n = len(req.prompt_ids), req.n_gen
    fa = None if flash_attn == "auto" else flash_attn == "on"
    common: dict[str, Any] = {"reps": reps, "flash_attn": fa, "kv_k": kv_k, "kv_v": kv_v, "n_gpu_layers": n_gpu_layers,
                              "threads": threads, "stderr_path": stderr_path, "version": version}
    if ubatch:
        common["extra"] = ["-b", str(max(2048, ubatch)), "-ub", str(ubatch)]
    pp = run_llama_bench(build, gguf, n_prompt=[p], n_gen=[0], depth=[0], **common)
    pp_rec = pp.records[-1]
    assert pp_rec.line_time_ns is not None
    pf_ns = pp_rec.samples_ns[-1]
    t_pf_end = pp_rec.line_time_ns
    info: dict[str, Any] = {"mode": "bench", "pp": pp.to_dict(), "outputs_available": False}
    if n > 1:
        tg = run_llama_bench(build, gguf, n_prompt=[0], n_gen=[n - 1], depth=[p], **common)
        tg_rec = tg.records[-1]
        assert tg_rec.line_time_ns is not None
        dec_ns, t_dec_end = tg_rec.samples_ns[-1], tg_rec.line_time_ns
        info["tg"] = tg.to_dict()
    else:
        dec_ns, t_dec_end = 0, t_pf_end
    return {"type": "result", "id": req.id, "output_ids": [], "n_prompt": p, "n_gen": n, "stop": "length",
            "timing": {"prefill_ms": pf_ns / 1e6, "decode_ms": dec_ns / 1e6,
                       "t_prefill_start_ns": t_pf_end - pf_ns, "t_prefill_end_ns": t_pf_end,
                       "t_decode_start_ns": t_dec_end - dec_ns, "t_decode_end_ns": t_dec_end,
                       "clock_method": "llama-bench-line-time-minus-sample"},
            "decode_steps": n - 1, "llamacpp": info}


# ------------------------------------------------------------------------------------------------ main loop
def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m lucebench.baselines.llamacpp",
                                 description="llama.cpp baseline speaking lucebench.engine/v1 on stdin/stdout")
    ap.add_argument("--mode", choices=MODES, default="server")
    ap.add_argument("--gguf", "--model", dest="gguf", required=True, type=Path)
    ap.add_argument("--build", required=True, type=Path, help="llama.cpp build folder (holds build.json)")
    ap.add_argument("--ctx", "--max-ctx", dest="ctx", type=int, default=4096)
    ap.add_argument("--kv-k", default="f16")
    ap.add_argument("--kv-v", default="f16")
    ap.add_argument("--flash-attn", choices=("on", "off", "auto"), default="auto")
    ap.add_argument("--n-gpu-layers", type=int, default=None, help="default: all on GPU builds, 0 on CPU")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ubatch", type=int, default=None, help="-ub (and -b at least as large); default: llama.cpp's")
    ap.add_argument("--port", type=int, default=None, help="preferred port (another is used if taken)")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--request-timeout", type=float, default=3600.0)
    ap.add_argument("--bench-reps", type=int, default=1, help="llama-bench -r per request (bench mode)")
    ap.add_argument("--log", type=Path, default=None, help="llama-server / llama-bench log file")
    return ap.parse_args(argv)


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the adapter until shutdown or EOF; returns the exit status."""
    args = _parse_args(argv)
    out = ProtocolWriter.isolate_stdout()
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    server: LlamaServer | None = None
    try:
        try:
            build = LlamaCppBuild.load(args.build)
            if not args.gguf.is_file():
                raise UserError(f"GGUF file not found: {args.gguf}", where="--gguf")
            kv_type_flag(args.kv_k, where="--kv-k")
            kv_type_flag(args.kv_v, where="--kv-v")
            ngl = args.n_gpu_layers if args.n_gpu_layers is not None else (0 if build.backend == "cpu" else 99)
            log_path = args.log or Path(os.environ.get("TMPDIR", "/tmp")) / f"lucebench-llamacpp-{os.getpid()}.log"
            if args.mode == "server":
                server = LlamaServer(build, args.gguf, ctx=args.ctx, kv_k=args.kv_k, kv_v=args.kv_v,
                                     flash_attn=args.flash_attn, n_gpu_layers=ngl, threads=args.threads, log_path=log_path,
                                     port=args.port, startup_timeout_s=args.startup_timeout,
                                     request_timeout_s=args.request_timeout, ubatch=args.ubatch)
                server.start()
                version = binary_version(build, "llama-server")
                extra = {"port": server.port, "ports_tried": server.ports_tried, "log": str(log_path),
                         "server_pid": server.proc.pid if server.proc else None}
                cmdline = server.argv
            else:
                version = llama_bench_version(build)
                extra = {"log": str(log_path), "bench_reps": args.bench_reps}
                cmdline = None
            ready = ready_line(build, args.gguf, mode=args.mode, ctx=args.ctx, version=version, command_line=cmdline,
                               extra=extra)
            out.send(ready)
            vocab_size = ready["model"].get("vocab_size")
        except (UserError, EngineError) as e:
            tail = getattr(e, "stderr_tail", None)
            msg = str(e) if isinstance(e, UserError) else e.message
            out.error("load", msg + (f"\n--- llama-server log tail ---\n{tail}" if tail else ""))
            if tail:
                log(f"start-up failed; log tail:\n{tail}")
            return 1
        for line in sys.stdin:
            if not line.strip():
                continue
            req_id = None
            try:
                req = parse_request(line, vocab_size=vocab_size if isinstance(vocab_size, int) else None)
                if isinstance(req, Shutdown):
                    return 0
                req_id = req.id
                if len(req.prompt_ids) + req.n_gen > args.ctx:
                    raise RequestError("context_overflow", f"prompt {len(req.prompt_ids)} + n_gen {req.n_gen} "
                                                           f"exceeds max_ctx {args.ctx}")
                if server is not None:
                    reply, t_send, t_recv = server.completion(req.prompt_ids, req.n_gen, req.ignore_eos)
                    out.send(server_result(req, reply, t_send, t_recv))
                else:
                    out.send(bench_result(req, build, args.gguf, ctx=args.ctx, kv_k=args.kv_k, kv_v=args.kv_v,
                                          flash_attn=args.flash_attn, n_gpu_layers=ngl, threads=args.threads,
                                          reps=args.bench_reps, version=version, stderr_path=log_path,
                                          ubatch=args.ubatch))
            except RequestError as e:
                out.error(e.kind, e.message, e.request_id if e.request_id is not None else req_id)
            except EngineError as e:
                out.error(e.kind if e.kind in ("oom", "internal") else "internal",
                          e.message + (f"\n{e.stderr_tail}" if e.stderr_tail else ""), req_id)
                if server is not None and (server.proc is None or server.proc.poll() is not None):
                    return 1  # the server died: nothing more can be served
            except UserError as e:
                out.error("bad_request", str(e), req_id)
            except Exception as e:  # noqa: BLE001 -- a bug of ours: answer the request, traceback to stderr
                traceback.print_exc(file=sys.stderr)
                out.error("internal", f"{type(e).__name__}: {e}", req_id)
        return 0  # EOF on stdin
    finally:
        if server is not None:
            server.stop()
