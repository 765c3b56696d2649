"""The DFlash block-diffusion draft as a plain PyTorch module, in the published z-lab layout.

What the draft owns (speculative.md §1): Qwen3-style decoder layers, `fc` and `hidden_norm`, a final `norm`;
no embedding table and no LM head. The block input is the *target's* embedding of
`[bonus, MASK x (block_size - 1)]` and the logits are the target's LM head applied to the draft's normed
output. Conditioning is "KV injection": the target's hidden states at `target_layer_ids` (the outputs of
those decoder layers) are concatenated, projected by `fc` and normalised by `hidden_norm` into one context
feature per committed position; in every draft layer that layer's own `k_proj`/`v_proj` (and `k_norm`) turn
the context features into K/V rows placed before the block's own K/V. Queries come from the block only.
Attention is unmasked over context + block for full-attention layers (training adds the mask that keeps
each block to the context before its anchor). RoPE is rotate-half over the whole head_dim; context keys sit
at their absolute positions, block rows at `start .. start + block_size - 1`.

Files: `config.json` (`architectures: ["DFlashDraftModel"]`, `model_type: "qwen3"`, Qwen3 sizes, top-level
`block_size` and `num_target_layers`, `dflash_config: {target_layer_ids, mask_token_id}`) and
`model.safetensors` with the published names (`fc.weight`, `hidden_norm.weight`, `norm.weight`,
`layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `layers.{i}.self_attn.{q,k}_norm.weight`,
`layers.{i}.{input,post_attention}_layernorm.weight`, `layers.{i}.mlp.{gate,up,down}_proj.weight`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lucebench.models.dflash_draft import parse_draft_config


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 32768
    layer_types: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if any(t != "full_attention" for t in self.layer_types):
            raise ValueError("this draft implements full-attention layers only (no sliding window)")

    def to_json(self) -> dict[str, Any]:
        """config.json in the z-lab layout."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": self.layer_types,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"target_layer_ids": self.target_layer_ids, "mask_token_id": self.mask_token_id},
        }

    @classmethod
    def from_json(cls, cfg: dict[str, Any]) -> DFlashConfig:
        """Reads the z-lab layout through `dflash_draft.parse_draft_config` (both placements of block_size,
        mask_token_id and target_layer_ids; every key checked, a UserError naming the bad one)."""
        d = parse_draft_config(cfg)
        return cls(
            hidden_size=d.hidden_size, num_hidden_layers=d.num_hidden_layers,
            num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads,
            head_dim=d.head_dim, intermediate_size=d.intermediate_size, vocab_size=d.vocab_size,
            num_target_layers=d.num_target_layers, target_layer_ids=list(d.target_layer_ids),
            mask_token_id=d.mask_token_id, block_size=d.block_size, rms_norm_eps=d.rms_norm_eps,
            rope_theta=d.rope_theta, max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            layer_types=list(d.layer_types),
        )


class RMSNorm(nn.Module):
    """Qwen3's plain RMSNorm: weight * x / rms(x), computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., head_dim] for rotate-half RoPE over the whole head_dim."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv_freq
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, hd]; cos/sin [B, T, hd]."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.theta = cfg.num_attention_heads, cfg.num_key_value_heads, hd, cfg.rope_theta
        self.q_proj = nn.Linear(h, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def context_kv(self, ctx: torch.Tensor, ctx_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of context features: [B, n_kv, C, hd] each."""
        b, c, _ = ctx.shape
        k = self.k_norm(self.k_proj(ctx).view(b, c, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(ctx).view(b, c, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(ctx_pos, self.head_dim, self.theta)
        return apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, pos: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, Q, H] block rows at positions pos [B, Q]; ctx_k/ctx_v from context_kv; mask [B, 1, Q, C+Q]
        (True = attend) or None (everything visible)."""
        b, q_len, _ = x.shape
        cos, sin = rope_cos_sin(pos, self.head_dim, self.theta)
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, q_len, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, q_len, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = torch.cat([ctx_k.to(k.dtype), k], dim=2)
        v = torch.cat([ctx_v.to(v.dtype), v], dim=2)
        rep = self.n_heads // self.n_kv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, x, pos, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftCache:
    """Per-layer context K/V of the committed positions (the block's own K/V are never kept)."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        n = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[B, C, n*H] concatenated target layer outputs -> [B, C, H] context features."""
        return self.hidden_norm(self.fc(target_hidden))

    def forward(self, block_embeds: torch.Tensor, block_pos: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
                mask: torch.Tensor | None = None, cache: DraftCache | None = None) -> torch.Tensor:
        """Normed hidden states of the block rows [B, Q, H].

        block_embeds: target embeddings of the block tokens [B, Q, H] at positions block_pos [B, Q].
        ctx: context features [B, C, H] (from `context_features`) at positions ctx_pos [B, C]. With a cache,
        ctx holds only the positions committed since the last call; their K/V are appended to the cache and
        the block attends to everything cached. mask: [B, 1, Q, C_total + Q] booleans (True = attend), or
        None for full visibility (inference).
        """
        x = block_embeds
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            k_new, v_new = attn.context_kv(ctx, ctx_pos) if ctx.shape[1] else (None, None)
            if cache is not None:
                if k_new is not None:
                    cache.k[i] = k_new if cache.k[i] is None else torch.cat([cache.k[i], k_new], dim=2)
                    cache.v[i] = v_new if cache.v[i] is None else torch.cat([cache.v[i], v_new], dim=2)
                k_ctx, v_ctx = cache.k[i], cache.v[i]
            else:
                k_ctx, v_ctx = k_new, v_new
            if k_ctx is None:
                b = x.shape[0]
                k_ctx = x.new_zeros(b, attn.n_kv, 0, attn.head_dim)
                v_ctx = k_ctx
            x = layer(x, block_pos, k_ctx, v_ctx, mask)
        return self.norm(x)

    # --- files -------------------------------------------------------------------------------------------
    def save(self, out: Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to(dtype).contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(self.config.to_json(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype = torch.float32) -> DFlashDraft:
        from safetensors.torch import load_file

        cfg = DFlashConfig.from_json(json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))
        model = cls(cfg)
        state = load_file(str(Path(path) / "model.safetensors"))
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
        return model.to(dtype).eval()

