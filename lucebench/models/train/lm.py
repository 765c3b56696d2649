"""Causal-LM training and evaluation for the target (Qwen3.5) and the drafter (Qwen3), on token streams.

Batches are windows of `seq_len + 1` tokens at positions drawn from a seeded generator, so a run is a
function of the stream, the recipe and the seed. AdamW (betas 0.9/0.95, weight decay on matrices only),
linear warm-up then cosine decay to a tenth, gradient-norm clip 1.0, bf16 autocast on CUDA with float32
master weights. `max_seconds` is a guard against a slow machine: reaching it ends training early and is
recorded (`stopped_by_guard`), since the steps then differ from the recipe's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LMRecipe:
    """Sizes and schedule of one causal LM. `arch` is qwen3_5 (target) or qwen3 (drafter)."""

    arch: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    seq_len: int
    batch: int
    steps: int
    lr: float
    max_seconds: float
    lin_heads: int = 0
    lin_head_dim: int = 0
    warmup_frac: float = 0.05

    def hf_config(self, *, eos_id: int, max_position_embeddings: int) -> dict[str, Any]:
        common = {
            "vocab_size": self.vocab_size, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": max_position_embeddings, "tie_word_embeddings": True,
            "use_cache": True, "initializer_range": 0.02, "bos_token_id": None, "eos_token_id": eos_id,
            "pad_token_id": eos_id,
        }
        if self.arch == "qwen3":
            return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **common,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
        # Qwen3.5: [DeltaNet x 3, gated attention] repeated, as the published models.
        layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(self.layers)]
        return {
            "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", **common,
            "attn_output_gate": True, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": self.lin_head_dim, "linear_value_head_dim": self.lin_head_dim,
            "linear_num_key_heads": self.lin_heads, "linear_num_value_heads": self.lin_heads,
            "full_attention_interval": 4, "layer_types": layer_types, "partial_rotary_factor": 0.25,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            "mamba_ssm_dtype": "float32",
        }


def build_model(config: dict[str, Any]):
    """A freshly initialised transformers model (caller seeds torch first)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    cfg = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    if config["model_type"] == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**cfg))
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg))


def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def make_optimizer(model, lr: float, device: str) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.startswith("cuda"))


def train_lm(model, stream: np.ndarray, recipe: LMRecipe, *, device: str, seed: int,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Trains in place; returns the run's record (steps, tokens, seconds, loss curve)."""
    model.to(device).train()
    opt = make_optimizer(model, recipe.lr, device)
    gen = np.random.default_rng(seed)
    data = torch.from_numpy(stream.astype(np.int64))
    n_windows = len(data) - recipe.seq_len - 1
    if n_windows <= 0:
        raise ValueError(f"token stream of {len(data)} tokens is shorter than a window of {recipe.seq_len + 1}")
    offsets = torch.arange(recipe.seq_len + 1)
    warmup = max(1, int(recipe.warmup_frac * recipe.steps))
    use_amp = device.startswith("cuda")
    curve: list[list[float]] = []
    t0 = time.perf_counter()
    step = 0
    stopped = False
    for step in range(recipe.steps):
        starts = torch.from_numpy(gen.integers(0, n_windows, size=recipe.batch))
        batch = data[starts[:, None] + offsets].to(device, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, recipe.steps, warmup, recipe.lr)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == recipe.steps - 1:
            lv = float(loss.detach())
            el = time.perf_counter() - t0
            curve.append([step, round(lv, 4), round(el, 1)])
            log(f"  step {step:5d}/{recipe.steps}  loss {lv:.3f}  {(step + 1) * recipe.batch * recipe.seq_len / el:,.0f} tok/s")
        if time.perf_counter() - t0 > recipe.max_seconds:
            stopped = True
            log(f"  time guard {recipe.max_seconds:.0f} s reached at step {step}")
            break
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    steps_done = step + 1
    return {"steps": steps_done, "steps_planned": recipe.steps, "stopped_by_guard": stopped,
            "tokens": steps_done * recipe.batch * recipe.seq_len, "seconds": round(seconds, 1),
            "tokens_per_s": round(steps_done * recipe.batch * recipe.seq_len / seconds), "loss_curve": curve}


@torch.no_grad()
def evaluate_lm(model, stream: np.ndarray, *, seq_len: int, max_tokens: int, device: str, batch: int = 16) -> dict[str, Any]:
    """Held-out loss, top-1 accuracy and the share of tokens predicted with p(top-1) > 0.9, over consecutive
    windows of the stream (float32)."""
    model.to(device).eval()
    n_win = min(len(stream) // (seq_len + 1), max(1, max_tokens // seq_len))
    data = torch.from_numpy(stream[: n_win * (seq_len + 1)].astype(np.int64)).view(n_win, seq_len + 1)
    tot_loss = tot_acc = tot_conf = tot = 0.0
    for i in range(0, n_win, batch):
        x = data[i:i + batch].to(device)
        logits = model(input_ids=x[:, :-1]).logits.float()
        y = x[:, 1:]
        tot_loss += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
        tot_acc += float((logits.argmax(-1) == y).sum())
        tot_conf += float((logits.softmax(-1).amax(-1) > 0.9).sum())
        tot += y.numel()
    return {"heldout_tokens": int(tot), "loss": round(tot_loss / tot, 4), "top1": round(tot_acc / tot, 4),
            "p_top1_gt_0.9": round(tot_conf / tot, 4)}
