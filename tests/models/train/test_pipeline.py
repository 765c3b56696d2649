"""The whole training pipeline at toy sizes on the CPU (`--recipe tiny`): every output loads and is consistent."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lucebench.models.dflash_reference import greedy_reference, load_pair, load_target, speculative_greedy  # noqa: E402
from lucebench.models.dflash_torch import DFlashDraft  # noqa: E402
from lucebench.models.train.pipeline import RECIPES, train_reference  # noqa: E402

from .test_text_corpus import _datasets  # noqa: E402


@pytest.mark.slow
def test_tiny_recipe_end_to_end(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "models"
    report = train_reference(out, recipe=RECIPES["tiny"], datasets_dir=_datasets(tmp_path), device="cpu",
                             log=lambda m: None)
    assert json.loads((out / "train_report.json").read_text()) == json.loads(json.dumps(report))
    tiny = RECIPES["tiny"]
    target = load_target(out / "target")
    assert type(target).__name__ == "Qwen3_5ForCausalLM" and target.config.vocab_size == tiny.target.vocab_size
    assert target.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    drafter = load_target(out / "drafter")
    assert type(drafter).__name__ == "Qwen3ForCausalLM" and drafter.config.vocab_size == tiny.drafter.vocab_size
    draft = DFlashDraft.load(out / "draft")
    assert draft.config.mask_token_id == report["tokens"]["mask_token_id"] == 5
    assert draft.config.block_size == tiny.draft.block_size
    for phase in ("target", "drafter"):
        assert report[phase]["train"]["steps"] == getattr(tiny, phase).steps
        assert 0 < report[phase]["heldout"]["loss"] < 10
    assert len(report["draft"]["heldout"]["accuracy_per_position"]) == tiny.draft.block_size - 1
    # Both kinds of prefixes (the stdlib has function docstrings), every continuation generated.
    data = report["draft"]["data"]
    assert data["continuations"] == tiny.draft.n_sequences and not data["stopped_by_guard"]
    assert 0 < data["function_body_prefixes"] <= tiny.draft.n_sequences // 2
    assert data["stream_prefixes"] == tiny.draft.n_sequences - data["function_body_prefixes"]
    assert report["draft"]["train"]["steps"] == tiny.draft.steps
    # The reference loop runs on the pair and equals greedy decoding.
    t, d = load_pair(out / "target", out / "draft")
    spec = speculative_greedy(t, d, [10, 11, 12, 13, 14], 20, set())
    assert spec.tokens == greedy_reference(t, [10, 11, 12, 13, 14], 20, set())
