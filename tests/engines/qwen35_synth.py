"""Random-weight Qwen3.5 checkpoints built with transformers itself, for checking engines against it.

Weights are re-scaled (matrices ~ N(0, 1/fan_in), norm weights ~ N(0, 0.1), the final norm's gain of
mixed sign, A_log and dt_bias varied) so that greedy decoding wanders over the vocabulary: transformers' default 0.02 init makes every model
repeat one token, which would hide most bugs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


def make_config(**overrides: Any) -> Qwen3_5TextConfig:
    """A small Qwen3_5TextConfig; keyword arguments override the defaults."""
    base: dict[str, Any] = dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    base.update(overrides)
    return Qwen3_5TextConfig(**base)


@torch.no_grad()
def rescale_(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter a scale at which activations stay O(1) and greedy outputs vary."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2 and "conv1d" not in name:
            fan_in = p.shape[-1]
            std = 1.0 / math.sqrt(fan_in)
            if "embed_tokens" in name:
                std = 1.0
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        elif "conv1d" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        elif name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(-2.0, 1.5, generator=gen))
        elif name.endswith("dt_bias"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        elif name == "model.norm.weight":
            # Final norm gain (1 + w) of mixed sign, N(0, 1) (lucebench's synth rule v2): with N(0, 1)
            # embeddings and a near-one gain a tied model scores its own input token highest and repeats
            # it for ever, which any engine reproduces without exercising its layers (docs/models.md).
            p.copy_(torch.randn(p.shape, generator=gen) - 1.0)
        elif "norm" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + (1.0 if name.endswith("linear_attn.norm.weight") else 0.0))


def make_model(seed: int = 0, **overrides: Any) -> Qwen3_5ForCausalLM:
    """A float32 model in eval mode with re-scaled random weights."""
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(make_config(**overrides)).float().eval()
    rescale_(model, seed)
    return model


def save(model: Qwen3_5ForCausalLM, out: Path, dtype: torch.dtype = torch.float32) -> Path:
    """save_pretrained in `dtype` (safetensors)."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    return out


@torch.no_grad()
def reference(model: Qwen3_5ForCausalLM, prompt: list[int], n_gen: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens (n_gen, first from the prompt) and the prompt's last-position logits, from transformers."""
    ids = torch.tensor([prompt])
    out = model(input_ids=ids, use_cache=True)
    last = out.logits[0, -1].float().clone()
    cache = out.past_key_values
    tokens = [int(torch.argmax(last))]
    for _ in range(n_gen - 1):
        out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        tokens.append(int(torch.argmax(out.logits[0, -1])))
    return tokens, last
