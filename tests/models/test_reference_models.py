"""The trained reference models kept as fixtures (tests/fixtures/reference-models, README there).

Checks the files' sha256, that transformers loads the target and the drafter and reproduces the stored
greedy tokens, that the DFlash draft is in the published layout, and that the reference speculative loop
is lossless and reproduces its stored tokens per round (so its AL) on two HumanEval prompts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lucebench.models.dflash_reference import (  # noqa: E402
    FeatureTarget,
    first_divergence,
    greedy_reference,
    load_pair,
    load_target,
    speculative_greedy,
)
from lucebench.models.dflash_torch import DFlashDraft  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference-models"
RECORD = json.loads((FIXTURES / "reference_outputs.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Small sequential forwards: extra threads only spin on a shared CI machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def pair():
    return load_pair(FIXTURES / "target", FIXTURES / "draft")


def test_fixture_files_match_their_recorded_sha256():
    for rel, digest in RECORD["sha256"].items():
        assert hashlib.sha256((FIXTURES / rel).read_bytes()).hexdigest() == digest, rel


@pytest.mark.parametrize("sub", ["target", "drafter"])
def test_transformers_greedy_tokens_match_the_stored_reference(sub):
    model = load_target(FIXTURES / sub)
    assert type(model).__name__ == {"target": "Qwen3_5ForCausalLM", "drafter": "Qwen3ForCausalLM"}[sub]
    ft = FeatureTarget(model, [])
    for case in RECORD["greedy"][sub]:
        got = greedy_reference(ft, case["prompt_ids"], RECORD["greedy_tokens"], set())
        assert got == case["tokens"], f"{sub}: first divergence at {first_divergence(got, case['tokens'])}"


def test_target_and_drafter_tokenizers_differ():
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(FIXTURES / "target" / "tokenizer.json"))
    d = Tokenizer.from_file(str(FIXTURES / "drafter" / "tokenizer.json"))
    assert t.get_vocab_size() != d.get_vocab_size()
    text = RECORD["prompts"][0]
    assert t.encode(text).ids != d.encode(text).ids
    assert t.decode(t.encode(text).ids) == d.decode(d.encode(text).ids) == text  # the text bridge round-trips


def test_draft_is_in_the_published_layout():
    from safetensors import safe_open

    cfg = json.loads((FIXTURES / "draft" / "config.json").read_text(encoding="utf-8"))
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 16 and set(cfg["dflash_config"]) == {"target_layer_ids", "mask_token_id"}
    target_cfg = json.loads((FIXTURES / "target" / "config.json").read_text(encoding="utf-8"))
    assert cfg["num_target_layers"] == target_cfg["num_hidden_layers"]
    assert cfg["hidden_size"] == target_cfg["hidden_size"] and cfg["vocab_size"] == target_cfg["vocab_size"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(FIXTURES / "target" / "tokenizer.json"))
    assert tok.id_to_token(cfg["dflash_config"]["mask_token_id"]) == "<|mask|>"
    with safe_open(str(FIXTURES / "draft" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    n = len(cfg["dflash_config"]["target_layer_ids"])
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    for i in range(cfg["num_hidden_layers"]):
        for part in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                     "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            assert f"layers.{i}.{part}.weight" in names
    draft = DFlashDraft.load(FIXTURES / "draft")
    assert tuple(draft.fc.weight.shape) == (cfg["hidden_size"], n * cfg["hidden_size"])


def test_reference_loop_is_lossless_and_reproduces_its_rounds(pair):
    target, draft = pair
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(FIXTURES / "target" / "tokenizer.json"))
    stop = set(RECORD["stop_ids"])
    for case in RECORD["loop"]:
        ids = tok.encode(case["prompt"], add_special_tokens=False).ids
        spec = speculative_greedy(target, draft, ids, RECORD["loop_tokens"], stop)
        ar = greedy_reference(target, ids, RECORD["loop_tokens"], stop)
        assert first_divergence(spec.tokens, ar) is None
        assert spec.tokens == case["tokens"]
        assert spec.committed_per_round == case["committed_per_round"]
        assert spec.acceptance_length == pytest.approx(case["al"])
