"""A reply's `spec` and `prefill` objects become typed, checked sample fields; malformed ones are protocol errors."""

from __future__ import annotations

import pytest

from lucebench.errors import EngineError
from lucebench.runner.cell import _sample
from lucebench.suites.base import Prompt


def _reply(**extra):
    return {"type": "result", "id": "r", "output_ids": [1] * 8, "n_prompt": 40, "n_gen": 8, "stop": "length",
            "timing": {"prefill_ms": 10.0, "decode_ms": 20.0, "t_prefill_start_ns": 0, "t_prefill_end_ns": 10_000_000,
                       "t_decode_start_ns": 10_000_000, "t_decode_end_ns": 30_000_000}, "decode_steps": 3, **extra}


PROMPT = Prompt(id="p", token_ids=list(range(40)),
                reference={"needles": [{"token_span": [5, 9], "depth": 0.1}, {"token_span": [30, 34], "depth": 0.8}]})


def test_spec_and_prefill_are_typed_and_needle_survival_is_checked():
    spec = {"draft_steps": 3, "accepted_tokens": 7, "accepted_per_depth": [2, 2, 0], "al_histogram": [0, 1, 0, 2],
            "time_ms": {"draft": 1.5, "verify": 4.0}}
    prefill = {"prompt_tokens": 40, "kept_tokens_target": 12, "kept_ranges": [[0, 4], [4, 10], [32, 40]],
               "time_ms": {"score": 3.0, "target_prefill": 2.0}}
    s = _sample(_reply(spec=spec, prefill=prefill), 0, PROMPT, 0.05, keep_ids=False)
    assert s.draft_steps == 3 and s.accepted_tokens == 7 and s.spec.al_histogram == [0, 1, 0, 2]
    assert s.prefill.kept_tokens_target == 12
    # The first needle (5..9) lies in the merged range 0..10; the second (30..34) starts before 32.
    assert s.prefill.needles_kept == [True, False] and s.prefill.needle_depths == [0.1, 0.8]


@pytest.mark.parametrize(("extra", "fragment"), [
    ({"spec": {"draft_steps": 3, "accepted_tokens": 7, "al_histogram": [0, 1, 0, 1]}}, "al_histogram counts 2"),
    ({"spec": {"draft_steps": "three", "accepted_tokens": 7}}, "spec.draft_steps"),
    ({"prefill": {"prompt_tokens": 40, "kept_tokens_target": 5, "kept_ranges": [[10, 20], [15, 25]]}},
     "out of order"),
    ({"prefill": {"prompt_tokens": 40}}, "prefill.kept_tokens_target"),
])
def test_malformed_objects_are_protocol_errors(extra, fragment):
    with pytest.raises(EngineError) as err:
        _sample(_reply(**extra), 0, PROMPT, 0.05, keep_ids=False)
    assert err.value.kind == "protocol" and fragment in err.value.message
