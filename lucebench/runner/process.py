"""One engine subprocess speaking docs/protocol.md (lucebench.engines.protocol): start, wait for ready,
request/reply, stop.

Crashes, hangs and protocol violations become EngineError with the exit status or signal and the last
lines of the engine's stderr, which goes to a log file that is kept.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from lucebench.engines.protocol import PROTOCOL, parse_reply, why_not_a_reply
from lucebench.errors import EngineError

_EOF = object()


def tail_lines(path: Path, n: int = 20) -> str:
    """The last n lines of a text file ('' if unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-n:])


def describe_exit(returncode: int) -> tuple[int | None, str | None, str]:
    """(exit code, signal name, human text) for a Popen returncode."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        text = f"killed by {name}"
        if name == "SIGKILL":
            text += " (often the out-of-memory killer)"
        return None, name, text
    return returncode, None, f"exited with status {returncode}"


_SHOWN_LINE = 300  # characters of an offending stdout line quoted in the error; the log keeps it whole


class EngineProcess:
    """A running engine. Use as a context manager so the process group is always reaped."""

    def __init__(self, argv: list[str], *, log_path: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None):
        self.argv = argv
        self.log_path = log_path
        self.ready: dict[str, Any] = {}
        self._lines: queue.Queue[Any] = queue.Queue()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = log_path.open("ab")
        self._log.write(f"$ {' '.join(argv)}\n".encode())
        self._log.flush()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise EngineError("crash", f"cannot start engine {argv[0]}: {exc}") from None
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    # -- plumbing -------------------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode("utf-8", errors="replace").rstrip("\n"))
        self._lines.put(_EOF)

    def _failure(self, kind: str, message: str) -> EngineError:
        code = self.proc.poll()
        exit_code, sig = None, None
        if code is not None:
            exit_code, sig, text = describe_exit(code)
            message = f"{message}; engine {text}"
            if sig == "SIGKILL" and kind == "crash":
                kind = "oom"
        return EngineError(kind, message, exit_code=exit_code, signal=sig, stderr_tail=tail_lines(self.log_path))

    def _next_message(self, deadline: float) -> dict[str, Any]:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise self._failure("timeout", "engine did not answer in time (killed)")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is _EOF:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill()
                raise self._failure("crash", "engine closed its output")
            if not line.strip():
                continue
            msg = parse_reply(line)
            if msg is None:
                why = why_not_a_reply(line)
                self._log_stdout_line(line)
                self.kill()
                text = line.rstrip("\n")
                shown = (repr(text) if len(text) <= _SHOWN_LINE else
                         f"{text[:_SHOWN_LINE]!r}... ({len(text) - _SHOWN_LINE} more characters; the whole line is in "
                         f"{self.log_path})")
                raise self._failure("protocol", f"engine printed a line that is not a protocol message ({why}): "
                                                f"{shown}")
            return msg

    def _log_stdout_line(self, line: str) -> None:
        """Keep an offending stdout line whole in the engine log (the error message shows its start)."""
        try:
            self._log.write(b"[lucebench] the engine's stdout line that is not a protocol message:\n"
                            + line.rstrip("\n").encode(errors="replace") + b"\n")
            self._log.flush()
        except (OSError, ValueError):
            pass

    # -- protocol -------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the `ready` line (the model is loaded). An `error` line instead fails the cell."""
        msg = self._next_message(time.monotonic() + timeout_s)
        if msg["type"] == "error":
            self.close()
            raise EngineError(msg.get("kind", "load"), f"engine failed to load: {msg.get('message', '')}",
                              stderr_tail=tail_lines(self.log_path))
        if msg["type"] != "ready":
            self.kill()
            raise self._failure("protocol", f"expected a ready line first, got {msg['type']!r}")
        if msg.get("protocol") != PROTOCOL:
            self.kill()
            raise self._failure("protocol", f"engine speaks {msg.get('protocol')!r}, lucebench speaks {PROTOCOL!r}")
        self.ready = msg
        return msg

    def request(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and return its `result`; an `error` reply raises EngineError of its kind."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failure("crash", "engine is no longer reading requests") from None
        reply = self._next_message(time.monotonic() + timeout_s)
        if reply.get("id") not in (None, msg.get("id")):
            self.kill()
            raise self._failure("protocol", f"reply for {reply.get('id')!r} while waiting for {msg.get('id')!r}")
        if reply["type"] == "error":
            raise EngineError(reply.get("kind", "engine_error"), reply.get("message", "engine error"),
                              stderr_tail=tail_lines(self.log_path))
        if reply["type"] != "result":
            self.kill()
            raise self._failure("protocol", f"expected a result line, got {reply['type']!r}")
        return reply

    def kill(self) -> None:
        """SIGKILL the whole process group (the engine and anything it started, e.g. llama-server)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self, timeout_s: float = 15.0) -> None:
        """Ask for shutdown, then SIGTERM, then SIGKILL the process group."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"type": "shutdown"}\n')
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGTERM)
                    self.proc.wait(timeout=5)
                except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                    self.kill()
        else:
            # The engine is gone; anything it started in its group must not outlive it.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._log.close()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            self.kill()  # Ctrl-C: no polite shutdown, the user is waiting
        self.close()
