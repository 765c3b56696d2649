"""Random-weight DFlash drafts in the published z-lab layout (BF16 safetensors + config.json), for the
engine tests (odd tiny shapes for the draft forward check, or shapes that fit a test target), and a
float64 PyTorch reference of the draft's block forward written from z-lab's DFlashDraftModel."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# Odd, tiny shapes: 3 layers, hidden 22, 3 query / 1 KV heads of 6, MLP 30, 3 target features, block 5.
ODD_SHAPE = dict(hidden=22, layers=3, heads=3, kv_heads=1, head_dim=6, inter=30, n_feat=3, vocab=41, block=5)


def make_draft(out: Path, *, seed: int, shape: dict[str, int] | None = None, mask_token_id: int | None = None,
               layer_types: list[str] | None = None, sliding_window: int | None = None,
               placement: str = "dflash_config", target_layer_ids: list[int] | None = (1, 4, 7),
               extra_tensors: dict[str, torch.Tensor] | None = None, drop: str | None = None,
               bad_shape: str | None = None) -> dict[str, torch.Tensor]:
    """A random draft in the published z-lab layout (BF16 safetensors + config.json); returns its fp32 weights."""
    s = shape or ODD_SHAPE
    g = torch.Generator().manual_seed(seed)
    H, hd, nh, nkv, inter = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["inter"]

    def rnd(*dims):
        return (torch.randn(*dims, generator=g) * dims[-1] ** -0.5).to(torch.bfloat16)

    def gain(n):
        return (1.0 + 0.2 * torch.randn(n, generator=g)).to(torch.bfloat16)

    w = {"fc.weight": rnd(H, s["n_feat"] * H), "hidden_norm.weight": gain(H), "norm.weight": gain(H)}
    for i in range(s["layers"]):
        p = f"layers.{i}."
        w |= {p + "input_layernorm.weight": gain(H), p + "post_attention_layernorm.weight": gain(H),
              p + "self_attn.q_proj.weight": rnd(nh * hd, H), p + "self_attn.k_proj.weight": rnd(nkv * hd, H),
              p + "self_attn.v_proj.weight": rnd(nkv * hd, H), p + "self_attn.o_proj.weight": rnd(H, nh * hd),
              p + "self_attn.q_norm.weight": gain(hd), p + "self_attn.k_norm.weight": gain(hd),
              p + "mlp.gate_proj.weight": rnd(inter, H), p + "mlp.up_proj.weight": rnd(inter, H),
              p + "mlp.down_proj.weight": rnd(H, inter)}
    w |= extra_tensors or {}
    saved = dict(w)
    if drop:
        saved.pop(drop)
    if bad_shape:
        saved[bad_shape] = saved[bad_shape][:-1].contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(saved, str(out / "model.safetensors"))
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
           "num_hidden_layers": s["layers"], "num_attention_heads": nh, "num_key_value_heads": nkv,
           "head_dim": hd, "intermediate_size": inter, "vocab_size": s["vocab"], "rms_norm_eps": 1e-6,
           "rope_theta": 1000.0, "num_target_layers": s.get("target_layers", 10), "torch_dtype": "bfloat16"}
    dflash = {"mask_token_id": s["vocab"] - 1 if mask_token_id is None else mask_token_id}
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    if placement == "dflash_config":
        cfg["block_size"] = s["block"]
        cfg["dflash_config"] = dflash
    else:  # other producers: everything at the top level
        cfg |= dflash | {"block_size": s["block"]}
    if layer_types:
        cfg["layer_types"] = layer_types
        cfg["sliding_window"] = sliding_window
    (out / "config.json").write_text(json.dumps(cfg))
    return {k: v.double() for k, v in w.items()}


def rmsnorm(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    """Rotate-half RoPE over the whole head: x [T, heads, hd], positions [T]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_block(w, feats, embed, *, shape=None, layer_types=None, window=None, theta=1000.0):
    """The draft's block forward from scratch in float64: context = every committed position's features
    (rows at positions 0..C-1), block at C..C+bs-1. Returns the final-normed rows 1.. [bs-1, H]."""
    s = shape or ODD_SHAPE
    nh, nkv, hd = s["heads"], s["kv_heads"], s["head_dim"]
    C, bs = feats.shape[0], embed.shape[0]
    ctx = rmsnorm(feats @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embed.clone()
    qpos, kpos = torch.arange(C, C + bs), torch.arange(C + bs)
    for i in range(s["layers"]):
        p = f"layers.{i}."
        sliding = bool(layer_types) and layer_types[i] == "sliding_attention"
        h = rmsnorm(x, w[p + "input_layernorm.weight"])
        q = rmsnorm((h @ w[p + "self_attn.q_proj.weight"].T).view(bs, nh, hd), w[p + "self_attn.q_norm.weight"])
        kv_in = torch.cat([ctx, h])
        k = rmsnorm((kv_in @ w[p + "self_attn.k_proj.weight"].T).view(C + bs, nkv, hd), w[p + "self_attn.k_norm.weight"])
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(C + bs, nkv, hd)
        q, k = rope(q, qpos, theta), rope(k, kpos, theta)
        visible = torch.ones(bs, C + bs, dtype=torch.bool)
        if sliding:  # z-lab: sliding layers are causal, with the window on the distance
            visible &= kpos[None] <= qpos[:, None]
            visible &= qpos[:, None] - kpos[None] < window
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
        scores = scores.masked_fill(~visible[None], float("-inf"))
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(bs, nh * hd)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
        x = x + (torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    return rmsnorm(x, w["norm.weight"])[1:]
