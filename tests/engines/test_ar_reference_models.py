"""The CPU `ar` engine on the trained reference target (tests/fixtures/reference-models): its greedy tokens
equal the stored transformers reference. A trained model's logits are peaked, so a rounding tie cannot
explain a difference here; a first divergence is a bug."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference-models"


def test_ar_reproduces_transformers_greedy_tokens_on_the_trained_target(engine):
    record = json.loads((FIXTURES / "reference_outputs.json").read_text(encoding="utf-8"))
    e = engine(FIXTURES / "target")
    assert e.ready["type"] == "ready", e.ready
    for i, case in enumerate(record["greedy"]["target"]):
        res = e.generate(case["prompt_ids"], record["greedy_tokens"], id=f"p{i}", ignore_eos=True)
        assert res["type"] == "result", res
        got, want = res["output_ids"], case["tokens"]
        first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, f"prompt {i}: first divergence at token {first}"
    assert e.close() == 0
