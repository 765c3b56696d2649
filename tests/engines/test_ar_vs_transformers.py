"""The CPU `ar` engine against transformers' Qwen3_5ForCausalLM (fp32, random re-scaled weights).

Done means: greedy tokens identical on >= 99% of positions and last-position logits within 1e-4
relative error, for several configurations (layer patterns, head counts and dims, odd sizes, tied and
untied embeddings, more DeltaNet value heads than key heads), prompts that cross the 64-token chunk of
the chunked delta rule, and the multimodal, sharded and GGUF checkpoint layouts.
"""

from __future__ import annotations

import random

import pytest
import qwen35_synth as synth
import torch
from gguf_writer import write_qwen35_gguf

N_GEN = 32

CONFIGS = {
    # hybrid 3:1, GQA 2:1, 2 value heads per key head, untied
    "base": dict(),
    # odd sizes, full attention first, MHA, tied embeddings, one value head per key head
    "odd-tied": dict(vocab_size=397, hidden_size=40, intermediate_size=72, num_hidden_layers=5,
                     num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                     layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention",
                                  "linear_attention"],
                     linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=8,
                     linear_value_head_dim=24, tie_word_embeddings=True),
    # kernel 3, 4 value heads per key head, small head dim, theta 1e7 as Qwen3.5
    "wide-groups": dict(vocab_size=1000, hidden_size=64, intermediate_size=64, num_hidden_layers=6,
                        num_attention_heads=6, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=3,
                        linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=32,
                        linear_value_head_dim=8,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}),
}


def prompts(vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab)] for _ in range(1)] + [
        [rng.randrange(vocab) for _ in range(n)] for n in (7, 70)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def check_against_reference(engine_proc, model, vocab: int, seed: int) -> None:
    matched = total = repeats = 0
    seen: set[int] = set()
    for i, prompt in enumerate(prompts(vocab, seed)):
        want, want_logits = synth.reference(model, prompt, N_GEN)
        res = engine_proc.generate(prompt, N_GEN, id=f"p{i}", return_logits=True)
        assert res["type"] == "result", res
        got = res["output_ids"]
        assert len(got) == N_GEN and res["n_gen"] == N_GEN and res["decode_steps"] == N_GEN - 1
        matched += sum(a == b for a, b in zip(got, want))
        total += N_GEN
        seen.update(want)
        repeats += sum(a == b for a, b in zip(want, [prompt[-1], *want[:-1]]))  # output = its input token
        err = rel_err(torch.tensor(res["last_logits"]), want_logits)
        assert err < 1e-4, f"prompt {i}: last-logit relative error {err:.2e}"
    assert len(seen) > 4, "the test model repeats itself: weights are not varied enough"
    assert repeats / total < 0.5, f"the test model echoes its input token at {repeats}/{total} steps"
    assert matched / total >= 0.99, f"greedy tokens agree on {matched}/{total} positions"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_transformers(name, engine, tmp_path):
    model = synth.make_model(seed=len(name), **CONFIGS[name])
    path = synth.save(model, tmp_path / name)
    e = engine(path, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "128")
    assert e.ready["model"]["n_layers"] == model.config.num_hidden_layers
    check_against_reference(e, model, model.config.vocab_size, seed=3)


@pytest.mark.slow
def test_multimodal_layout(engine, tmp_path):
    """Qwen3_5ForConditionalGeneration checkpoints keep the text model under model.language_model."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = synth.make_model(seed=11)
    cfg = Qwen3_5Config(text_config=text.config.to_dict(), vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
        temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16))
    mm = Qwen3_5ForConditionalGeneration(cfg).float().eval()
    # Same text weights as `text`, under the multimodal names.
    missing = mm.model.language_model.load_state_dict(text.model.state_dict())
    assert not missing.missing_keys
    mm.lm_head.load_state_dict(text.lm_head.state_dict())
    path = tmp_path / "mm"
    mm.save_pretrained(path)
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("model.language_model.layers.0.") for k in keys)
    assert any(k.startswith("model.visual.") for k in keys)
    e = engine(path, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "128")
    check_against_reference(e, text, text.config.vocab_size, seed=5)


@pytest.mark.slow
def test_sharded_bf16_checkpoint(engine, tmp_path):
    """A sharded (index.json) BF16 checkpoint loads; the engine computes in fp32 from the bf16 values."""
    model = synth.make_model(seed=21)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "sh", max_shard_size="100KB")
    model.to(torch.float32)
    assert (tmp_path / "sh" / "model.safetensors.index.json").is_file()
    # The reference sees the same bf16-rounded weights, in fp32.
    ref = synth.make_model(seed=21)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    e = engine(tmp_path / "sh", "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "128")
    assert e.ready["model"]["dtype"] == "bf16"
    check_against_reference(e, ref, ref.config.vocab_size, seed=6)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
def test_gguf_qwen35(engine, tmp_path, qtype):
    """llama.cpp's qwen35 GGUF naming and value transforms (norm +1, -exp(A_log), tiled value heads)."""
    model = synth.make_model(seed=31, **CONFIGS["wide-groups"])
    path = write_qwen35_gguf(model, tmp_path / f"m-{qtype}.gguf", qtype)
    e = engine(path, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "128")
    assert e.ready["model"]["dtype"] == qtype
    if qtype == "f32":
        check_against_reference(e, model, model.config.vocab_size, seed=7)
        return
    # Q8_0 weights: the prefill logits stay within quantisation noise and pick the same first token.
    # (Later tokens of a random model diverge chaotically after the first near-tie, so they are not compared.)
    for prompt in prompts(model.config.vocab_size, 8):
        want, want_logits = synth.reference(model, prompt, N_GEN)
        res = e.generate(prompt, N_GEN, return_logits=True)
        assert rel_err(torch.tensor(res["last_logits"]), want_logits) < 0.05
        assert res["output_ids"][0] == want[0]
