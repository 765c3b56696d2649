"""The DFlash engine's CPU pieces: DDTree, the walk and the acceptance statistics (C++ unit checks), and the
CPU draft forward against a PyTorch reference of the same forward (z-lab's DFlashDraftModel semantics:
KV injection of the context features, unmasked full-attention layers, windowed-causal sliding layers,
rotate-half RoPE over the whole head at absolute positions, the target's embedding and LM head)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture(scope="module")
def dflash_tests_exe(ar_exe) -> Path:
    """lucebench-dflash-tests, built in the CPU engine build directory."""
    build = ar_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-dflash-tests", "-j", "2"], check=True,
                   capture_output=True)
    return build / "dflash" / "lucebench-dflash-tests"


def test_dflash_unit_tests(dflash_tests_exe):
    """DDTree against brute-force enumeration, chain / chain seed / ties, scripted walks, statistics."""
    proc = subprocess.run([str(dflash_tests_exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "all passed" in proc.stderr


# ------------------------------------------------------------------------------------------- the draft

# Odd, tiny shapes: 3 layers, hidden 22, 3 query / 1 KV heads of 6, MLP 30, 3 target features, block 5.
SHAPE = dict(hidden=22, layers=3, heads=3, kv_heads=1, head_dim=6, inter=30, n_feat=3, vocab=41, block=5)


def make_draft(out: Path, *, seed: int, layer_types: list[str] | None = None, sliding_window: int | None = None,
               placement: str = "dflash_config", target_layer_ids: list[int] | None = (1, 4, 7),
               extra_tensors: dict[str, torch.Tensor] | None = None, drop: str | None = None,
               bad_shape: str | None = None) -> dict[str, torch.Tensor]:
    """A random draft in the published z-lab layout (BF16 safetensors + config.json); returns its fp32 weights."""
    s = SHAPE
    g = torch.Generator().manual_seed(seed)
    H, hd, nh, nkv, inter = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["inter"]

    def rnd(*shape, scale=None):
        scale = scale if scale is not None else shape[-1] ** -0.5
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

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
           "rope_theta": 1000.0, "num_target_layers": 10, "torch_dtype": "bfloat16"}
    dflash = {"mask_token_id": s["vocab"] - 1}
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


def reference_block(w, feats, embed, *, layer_types=None, window=None, theta=1000.0):
    """The draft's block forward from scratch in float64: context = every committed position's features
    (rows at positions 0..C-1), block at C..C+bs-1. Returns the final-normed rows 1.. [bs-1, H]."""
    s = SHAPE
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


@pytest.mark.parametrize("variant", ["full", "sliding"])
def test_draft_forward_matches_torch(tmp_path, dflash_tests_exe, variant):
    """Several rounds through the draft cache (prompt, then each round's accepted rows) against a from-scratch
    reference: hidden rows and logits per block position, relative error and argmax."""
    s = SHAPE
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"] if variant == "sliding" else None
    window = 4 if variant == "sliding" else None  # shorter than the context: the window matters
    w = make_draft(tmp_path / "draft", seed=3, layer_types=layer_types, sliding_window=window,
                   placement="dflash_config" if variant == "full" else "top_level",
                   target_layer_ids=[1, 4, 7] if variant == "full" else None)  # None: z-lab's default ids
    g = torch.Generator().manual_seed(4)
    rows_per_round = [7, 3, 1, 5]  # the prompt, then accepted + 1 rows per round
    io = {"lm_head": torch.randn(s["vocab"], s["hidden"], generator=g)}
    for r, n in enumerate(rows_per_round):
        io[f"features.{r}"] = torch.randn(n, s["n_feat"] * s["hidden"], generator=g)
        io[f"embed.{r}"] = torch.randn(s["block"], s["hidden"], generator=g) * 0.5
    (tmp_path / "io").mkdir()
    save_file(io, str(tmp_path / "io" / "model.safetensors"))
    (tmp_path / "io" / "config.json").write_text(json.dumps({"rounds": len(rows_per_round)}))
    out = tmp_path / "out.bin"
    proc = subprocess.run([str(dflash_tests_exe), "draft-forward", str(tmp_path / "draft"), str(tmp_path / "io"), str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "3 features of 22, context 16" in proc.stderr
    got = np.fromfile(out, dtype=np.float32)
    n, H, V = s["block"] - 1, s["hidden"], s["vocab"]
    assert got.size == len(rows_per_round) * n * (H + V)
    got = torch.from_numpy(got.astype(np.float64)).view(len(rows_per_round), n * (H + V))
    feats = torch.zeros(0, s["n_feat"] * s["hidden"], dtype=torch.float64)
    for r in range(len(rows_per_round)):
        feats = torch.cat([feats, io[f"features.{r}"].double()])
        ref_h = reference_block(w, feats, io[f"embed.{r}"].double(), layer_types=layer_types, window=window)
        ref_l = ref_h @ io["lm_head"].double().T
        h, logits = got[r, : n * H].view(n, H), got[r, n * H:].view(n, V)
        for pos in range(n):  # block position pos + 1
            rel_h = float((h[pos] - ref_h[pos]).norm() / ref_h[pos].norm())
            rel_l = float((logits[pos] - ref_l[pos]).norm() / ref_l[pos].norm())
            assert rel_h < 1e-5 and rel_l < 1e-5, (variant, r, pos + 1, rel_h, rel_l)
            top2 = ref_l[pos].topk(2).values
            if float(top2[0] - top2[1]) > 1e-4:  # argmax agreement away from near-ties
                assert int(logits[pos].argmax()) == int(ref_l[pos].argmax()), (variant, r, pos + 1)
    # The sliding window and causal block change the result: the mask is exercised, not vacuous.
    if variant == "sliding":
        full = reference_block(w, feats, io[f"embed.{len(rows_per_round) - 1}"].double())
        assert float((full - ref_h).norm() / ref_h.norm()) > 1e-2


@pytest.mark.parametrize("case,message", [
    ("drop", "missing tensor 'layers.1.self_attn.k_norm.weight'"),
    ("shape", "tensor 'layers.2.mlp.up_proj.weight' has shape [29, 22], expected [30, 22]"),
    ("dflash2", "belongs to a DFlash2 draft"),
    ("no_mask", "missing 'mask_token_id'"),
])
def test_draft_load_errors(tmp_path, dflash_tests_exe, case, message):
    """A malformed draft is one clear message naming the tensor or key, never a crash."""
    kw = {"drop": {"drop": "layers.1.self_attn.k_norm.weight"}, "shape": {"bad_shape": "layers.2.mlp.up_proj.weight"},
          "dflash2": {"extra_tensors": {"candidate_selector.hidden_projection.weight": torch.zeros(2, 2)}},
          "no_mask": {}}[case]
    make_draft(tmp_path / "draft", seed=1, **kw)
    if case == "no_mask":
        cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
        del cfg["dflash_config"]["mask_token_id"]
        (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    io = tmp_path / "io"
    io.mkdir()
    save_file({"lm_head": torch.zeros(2, 2)}, str(io / "model.safetensors"))
    (io / "config.json").write_text(json.dumps({"rounds": 0}))
    proc = subprocess.run([str(dflash_tests_exe), "draft-forward", str(tmp_path / "draft"), str(io), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
