"""The engine protocol ``lucebench.engine/v1`` (docs/protocol.md), both sides of it, without torch.

Engine side (the Python baselines): `parse_request` turns a stdin line into a `GenerateRequest` or
`Shutdown` (or raises `RequestError`, answered with an error line while the engine keeps serving);
`ProtocolWriter.isolate_stdout` keeps the real stdout for protocol lines only; `ready_message` builds the
ready line. Harness side (lucebench.runner.process): `parse_reply` accepts a stdout line only when it is a
JSON object with a known reply type. The C++ engines speak the same lines (engines/core/server.cpp).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO, TypedDict

PROTOCOL = "lucebench.engine/v1"
REPLY_TYPES = frozenset({"ready", "result", "error"})
ErrorKind = Literal["load", "bad_request", "context_overflow", "unsupported", "oom", "internal"]


# ---------------------------------------------------------------------------------------------- requests
class RequestError(Exception):
    """A request the engine answers with an error line and then keeps serving."""

    def __init__(self, kind: str, message: str, request_id: Any = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class GenerateRequest:
    """``{"type": "generate", ...}``: greedy generation of ``n_gen`` tokens after ``prompt_ids``."""

    id: Any
    prompt_ids: list[int]
    n_gen: int
    ignore_eos: bool = True
    eos_ids: list[int] = field(default_factory=list)
    # Compressed prefill (pflash; other engines ignore them): the prompt in the drafter's tokens and each
    # token's [start, end) character span in the prompt's text, for both tokenisations (docs/protocol.md).
    drafter_ids: list[int] | None = None
    drafter_offsets: list[tuple[int, int]] | None = None
    target_offsets: list[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Shutdown:
    """``{"type": "shutdown"}``: exit with status 0."""


def _int_list(value: Any, name: str, rid: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise RequestError("bad_request", f"{name} must be a list of integers", rid)
    return list(value)


def parse_request(line: str, *, vocab_size: int | None = None) -> GenerateRequest | Shutdown:
    """One request line -> a request object. Raises RequestError (kind ``bad_request``) for anything else.

    Token ids must lie in ``[0, vocab_size)``; with ``vocab_size`` None (not known) only ``>= 0`` is checked.
    """
    try:
        msg = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RequestError("bad_request", f"not JSON: {exc.msg} (line {line[:80]!r})") from None
    if not isinstance(msg, dict):
        raise RequestError("bad_request", "a request must be a JSON object")
    rid = msg.get("id")
    kind = msg.get("type")
    if kind == "shutdown":
        return Shutdown()
    if kind != "generate":
        raise RequestError("bad_request", f"unknown request type {kind!r} (generate or shutdown)", rid)
    for required in ("id", "prompt_ids", "n_gen"):
        if required not in msg:
            raise RequestError("bad_request", f"missing field {required!r}", rid)
    prompt = _int_list(msg["prompt_ids"], "prompt_ids", rid)
    if not prompt:
        raise RequestError("bad_request", "prompt_ids is empty", rid)
    upper = vocab_size if vocab_size is not None else float("inf")
    bad = [t for t in prompt if not 0 <= t < upper]
    if bad:
        where = f"[0, {vocab_size})" if vocab_size is not None else "(negative)"
        raise RequestError("bad_request", f"prompt_ids outside the vocabulary {where}: {bad[:5]}", rid)
    n_gen = msg["n_gen"]
    if not isinstance(n_gen, int) or isinstance(n_gen, bool) or n_gen < 1:
        raise RequestError("bad_request", "n_gen must be an integer >= 1", rid)
    ignore_eos = msg.get("ignore_eos", True)
    if not isinstance(ignore_eos, bool):
        raise RequestError("bad_request", "ignore_eos must be true or false", rid)
    eos = _int_list(msg.get("eos_ids", []), "eos_ids", rid)
    drafter_ids = _int_list(msg["drafter_ids"], "drafter_ids", rid) if "drafter_ids" in msg else None
    if drafter_ids is not None and (not drafter_ids or min(drafter_ids) < 0):
        raise RequestError("bad_request", "drafter_ids must be a non-empty list of token ids >= 0", rid)
    drafter_offsets = _offsets(msg, "drafter_offsets", len(drafter_ids or []), rid)
    target_offsets = _offsets(msg, "target_offsets", len(prompt), rid)
    return GenerateRequest(id=rid, prompt_ids=prompt, n_gen=n_gen, ignore_eos=ignore_eos, eos_ids=eos,
                           drafter_ids=drafter_ids, drafter_offsets=drafter_offsets, target_offsets=target_offsets)


def _offsets(msg: dict[str, Any], key: str, n_tokens: int, rid: Any) -> list[tuple[int, int]] | None:
    """One [start, end] character span per token (0 <= start <= end), or None when the field is absent."""
    if key not in msg:
        return None
    value = msg[key]
    ok = isinstance(value, list) and len(value) == n_tokens and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
        and 0 <= p[0] <= p[1] for p in value)
    if not ok:
        raise RequestError("bad_request", f"{key} must hold one [start, end] pair per token ({n_tokens}), "
                                          "0 <= start <= end", rid)
    return [(int(a), int(b)) for a, b in value]


# ---------------------------------------------------------------------------------------------- replies
class Timing(TypedDict, total=False):
    """A result's phase durations (device-timed) and CLOCK_MONOTONIC boundaries."""

    prefill_ms: float
    decode_ms: float
    t_prefill_start_ns: int
    t_prefill_end_ns: int
    t_decode_start_ns: int
    t_decode_end_ns: int
    clock_error_ns: int
    clock_method: str


class ResultMessage(TypedDict, total=False):
    """``{"type": "result", ...}``: the reply to one generate request."""

    type: Literal["result"]
    id: Any
    output_ids: list[int]
    n_prompt: int
    n_gen: int
    stop: str
    timing: Timing
    decode_steps: int
    bytes_per_token: int
    peak_mem_bytes: int
    # Speculative decoding and compressed prefill: the typed, checked models are SpecStats and PrefillStats
    # in lucebench/results/schema.py (the runner validates a reply's objects with them and stores them).
    spec: dict[str, Any]
    prefill: dict[str, Any]


class ReadyMessage(TypedDict):
    """``{"type": "ready", ...}``: printed once, after the model is loaded."""

    type: Literal["ready"]
    protocol: str
    engine: dict[str, Any]
    model: dict[str, Any]
    device: dict[str, Any]
    limits: dict[str, Any]


class ErrorMessage(TypedDict, total=False):
    """``{"type": "error", ...}``: a failed load (no id) or a failed request (its id)."""

    type: Literal["error"]
    id: Any
    kind: str
    message: str


def ready_message(*, engine: dict[str, Any], model: dict[str, Any], device: dict[str, Any],
                  limits: dict[str, Any]) -> ReadyMessage:
    """The ready line of an engine speaking this protocol version."""
    return {"type": "ready", "protocol": PROTOCOL, "engine": engine, "model": model, "device": device,
            "limits": limits}


def error_message(kind: str, message: str, request_id: Any = None) -> ErrorMessage:
    """An error line; ``request_id`` None for a load failure."""
    obj: ErrorMessage = {"type": "error", "kind": kind, "message": message}
    if request_id is not None:
        obj["id"] = request_id
    return obj


def parse_reply(line: str) -> dict[str, Any] | None:
    """A reply line as a dict when it is a JSON object with a known ``type``; None for anything else."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(msg, dict) or msg.get("type") not in REPLY_TYPES:
        return None
    return msg


def why_not_a_reply(line: str) -> str:
    """Why parse_reply refused `line`, in words (for the protocol error that quotes it)."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc.msg} at column {exc.colno}"
    if isinstance(msg, dict):
        return f"a JSON object of unknown type {msg.get('type')!r}"
    return f"a JSON {type(msg).__name__}, not an object"


# ---------------------------------------------------------------------------------------------- stdout
class ProtocolWriter:
    """Writes protocol lines (one JSON object each, flushed) to the stream it was given."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    @classmethod
    def isolate_stdout(cls) -> ProtocolWriter:
        """Keep the real stdout for protocol lines only; everything else that writes to fd 1 goes to stderr.

        Libraries print from Python and from C (progress bars, kernels' messages, a child process that
        inherits fd 1): duplicating fd 1 and pointing fd 1 at stderr catches all of them.
        """
        sys.stdout.flush()
        proto_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return cls(os.fdopen(proto_fd, "w", buffering=1, encoding="utf-8"))

    def send(self, obj: dict[str, Any] | ReadyMessage | ResultMessage | ErrorMessage) -> None:
        self.stream.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.stream.flush()

    def error(self, kind: str, message: str, request_id: Any = None) -> None:
        self.send(error_message(kind, message, request_id))

    def close(self) -> None:
        self.stream.close()
