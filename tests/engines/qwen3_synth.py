"""Random-weight Qwen3 (dense) checkpoints built with transformers itself, for checking engines against it.

Weights are re-scaled as in qwen35_synth (matrices ~ N(0, 1/fan_in), embeddings N(0, 1), norm gains near 1,
the final gain of mixed sign) so that greedy decoding wanders over the vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# Odd tiny shapes (make_config overrides): untied GQA (the defaults), tied MHA with head_dim 14, and GQA
# with 6/2 heads of 32. test_qwen3_vs_transformers.py checks the CPU engine on them,
# scripts/device/check_qwen3_gpu.py the CUDA one.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "gqa-untied": dict(),
    "odd-tied": dict(vocab_size=397, hidden_size=40, intermediate_size=72, num_hidden_layers=4,
                     num_attention_heads=5, num_key_value_heads=5, head_dim=14, tie_word_embeddings=True),
    "wide-gqa": dict(vocab_size=1000, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                     num_attention_heads=6, num_key_value_heads=2, head_dim=32,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
}


def make_config(**overrides: Any) -> Qwen3Config:
    base: dict[str, Any] = dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False,
        max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    base.update(overrides)
    return Qwen3Config(**base)


@torch.no_grad()
def rescale_(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[-1])
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        elif name == "model.norm.weight":
            p.copy_(torch.randn(p.shape, generator=gen))  # mixed sign (see qwen35_synth)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + 1.0)


def make_model(seed: int = 0, **overrides: Any) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(make_config(**overrides)).float().eval()
    rescale_(model, seed)
    return model
