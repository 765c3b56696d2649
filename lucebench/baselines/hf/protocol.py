"""Request parsing and response lines of the engine protocol (``lucebench.engine/v1``), without torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

PROTOCOL = "lucebench.engine/v1"


class RequestError(Exception):
    """A request the engine answers with an error line and then keeps serving."""

    def __init__(self, kind: str, message: str, request_id: Any = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class GenerateRequest:
    id: Any
    prompt_ids: list[int]
    n_gen: int
    ignore_eos: bool = True
    eos_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Shutdown:
    pass


def _int_list(value: Any, name: str, rid: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise RequestError("bad_request", f"{name} must be a list of integers", rid)
    return list(value)


def parse_request(line: str, *, vocab_size: int) -> GenerateRequest | Shutdown:
    """One request line -> a request object. Raises RequestError (kind ``bad_request``) for anything else."""
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
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise RequestError("bad_request", f"prompt_ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", rid)
    n_gen = msg["n_gen"]
    if not isinstance(n_gen, int) or isinstance(n_gen, bool) or n_gen < 1:
        raise RequestError("bad_request", "n_gen must be an integer >= 1", rid)
    ignore_eos = msg.get("ignore_eos", True)
    if not isinstance(ignore_eos, bool):
        raise RequestError("bad_request", "ignore_eos must be true or false", rid)
    eos = _int_list(msg.get("eos_ids", []), "eos_ids", rid)
    return GenerateRequest(id=rid, prompt_ids=prompt, n_gen=n_gen, ignore_eos=ignore_eos, eos_ids=eos)


class Emitter:
    """Writes protocol lines (one JSON object each, flushed) to the real stdout."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def send(self, obj: dict[str, Any]) -> None:
        self.stream.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.stream.flush()

    def error(self, kind: str, message: str, request_id: Any = None) -> None:
        obj: dict[str, Any] = {"type": "error", "kind": kind, "message": message}
        if request_id is not None:
            obj["id"] = request_id
        self.send(obj)
