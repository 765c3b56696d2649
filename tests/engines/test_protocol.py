"""lucebench.engines.protocol: the request parser the Python baselines share and the harness's reply check."""

from __future__ import annotations

import json

import pytest

from lucebench.engines.protocol import (
    PROTOCOL,
    GenerateRequest,
    RequestError,
    Shutdown,
    error_message,
    parse_reply,
    parse_request,
    ready_message,
)


def test_generate_request_parsed_with_defaults() -> None:
    req = parse_request('{"type": "generate", "id": "a", "prompt_ids": [0, 5, 9], "n_gen": 3}', vocab_size=10)
    assert req == GenerateRequest(id="a", prompt_ids=[0, 5, 9], n_gen=3, ignore_eos=True, eos_ids=[])
    assert isinstance(parse_request('{"type": "shutdown"}'), Shutdown)


@pytest.mark.parametrize("line", [
    "not json", "[1]", '{"type": "dance", "id": 1}',
    '{"type": "generate", "prompt_ids": [1], "n_gen": 1}',  # no id
    '{"type": "generate", "id": 1, "prompt_ids": [], "n_gen": 1}',
    '{"type": "generate", "id": 1, "prompt_ids": [1, true], "n_gen": 1}',
    '{"type": "generate", "id": 1, "prompt_ids": [-1], "n_gen": 1}',
    '{"type": "generate", "id": 1, "prompt_ids": [1], "n_gen": 0}',
    '{"type": "generate", "id": 1, "prompt_ids": [1], "n_gen": 2, "ignore_eos": "yes"}',
    '{"type": "generate", "id": 1, "prompt_ids": [1], "n_gen": 2, "eos_ids": [1.5]}',
])
def test_malformed_requests_are_bad_requests(line: str) -> None:
    with pytest.raises(RequestError) as e:
        parse_request(line)
    assert e.value.kind == "bad_request"


def test_vocabulary_bound_only_where_known() -> None:
    line = '{"type": "generate", "id": "x", "prompt_ids": [3, 10], "n_gen": 1}'
    assert parse_request(line).prompt_ids == [3, 10]  # type: ignore[union-attr]
    with pytest.raises(RequestError) as e:
        parse_request(line, vocab_size=10)
    assert e.value.request_id == "x" and "[0, 10)" in e.value.message


def test_reply_check_and_message_builders() -> None:
    ready = ready_message(engine={"name": "e"}, model={}, device={}, limits={"max_ctx": 8})
    assert ready["protocol"] == PROTOCOL and parse_reply(json.dumps(ready)) == ready
    assert error_message("oom", "m") == {"type": "error", "kind": "oom", "message": "m"}
    assert error_message("oom", "m", "r1")["id"] == "r1"
    for junk in ("hello", "[]", '{"type": "progress"}', '{"no": "type"}'):
        assert parse_reply(junk) is None


def test_compressed_prefill_fields_are_typed() -> None:
    """pflash's optional fields: the drafter's ids and one [start, end] span per id of either tokenisation."""
    base = {"type": "generate", "id": "p", "prompt_ids": [1, 2], "n_gen": 1}
    req = parse_request(json.dumps({**base, "drafter_ids": [7, 8, 9], "drafter_offsets": [[0, 1], [1, 3], [3, 3]],
                                    "target_offsets": [[0, 2], [2, 3]]}))
    assert isinstance(req, GenerateRequest) and req.drafter_ids == [7, 8, 9]
    assert req.drafter_offsets == [(0, 1), (1, 3), (3, 3)] and req.target_offsets == [(0, 2), (2, 3)]
    assert parse_request(json.dumps(base)).drafter_ids is None  # other engines' requests are unchanged
    for bad in ({"drafter_ids": [1], "drafter_offsets": [[0, 1], [1, 2]]},  # not one pair per id
                {"target_offsets": [[2, 1], [1, 2]]},  # start after end
                {"target_offsets": [[0, 1]]},  # not one pair per prompt id
                {"drafter_ids": []}):
        with pytest.raises(RequestError, match="drafter_ids|offsets"):
            parse_request(json.dumps({**base, **bad}))
