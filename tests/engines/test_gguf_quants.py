"""GGUF k-quants and the qwen3 architecture: the engine's block decoders against the gguf package's
dequantisation (random blocks, every type a published Qwen3.5-27B Q4_K_M file holds: F32, Q4_K, Q5_K,
Q6_K; plus Q8_0 and Q4_0), a qwen35 GGUF typed as llama.cpp's Q4_K_M recipe types it against transformers
holding the same dequantised weights, and qwen3 GGUF files against transformers."""

from __future__ import annotations

import random
import subprocess

import gguf
import numpy as np
import pytest
import qwen3_synth
import qwen35_synth as synth
import torch
from gguf_writer import write_qwen3_gguf, write_qwen35_gguf
from test_qwen3_vs_transformers import check

Q = gguf.GGMLQuantizationType
# type -> (byte offsets of the fp16 scale fields: d [, dmin]) in a block
SCALE_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
# dmin / d that centres a block's values (mean q x mean scale = dmin x mean min)
CENTRE = {Q.Q4_K: 7.5, Q.Q5_K: 15.5}


def _set_scales(raw: np.ndarray, qtype, d: float) -> None:
    fields = SCALE_FIELDS[qtype]
    raw[..., fields[0]:fields[0] + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    if len(fields) > 1:
        raw[..., fields[1]:fields[1] + 2] = np.frombuffer(np.float16(d * CENTRE[qtype]).tobytes(), np.uint8)


def random_blocks(rng: np.random.Generator, qtype, rows: int, cols: int, std: float) -> tuple[np.ndarray, np.ndarray]:
    """Random valid blocks of `qtype` for a [rows, cols] matrix whose values have standard deviation ~`std`:
    (block bytes [rows, row bytes], their dequantised values)."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // elems, size), dtype=np.uint8)
    _set_scales(raw, qtype, 1.0)
    s = gguf.quants.dequantize(raw.reshape(rows, -1), qtype).std()
    _set_scales(raw, qtype, std / s)
    raw = raw.reshape(rows, -1)
    return raw, gguf.quants.dequantize(raw, qtype).astype(np.float32)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_block_decoders_match_gguf(qtype, ar_exe, tmp_path):
    build = ar_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-core-tests", "-j", "2"], check=True,
                   capture_output=True)
    rng = np.random.default_rng(int(qtype))
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(37, size), dtype=np.uint8)
    # any fp16 scales that are finite, of both signs and several magnitudes
    for i in range(raw.shape[0]):
        for f in SCALE_FIELDS[qtype]:
            raw[i, f:f + 2] = np.frombuffer(np.float16(rng.normal() * 10.0 ** rng.integers(-4, 2)).tobytes(), np.uint8)
    (tmp_path / "in.bin").write_bytes(raw.tobytes())
    subprocess.run([str(build / "lucebench-core-tests"), "dequantize", qtype.name.lower(), str(tmp_path / "in.bin"),
                    str(tmp_path / "out.bin")], check=True)
    got = np.fromfile(tmp_path / "out.bin", np.float32)
    want = gguf.quants.dequantize(raw, qtype).reshape(-1).astype(np.float32)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


def q4_k_m_type(name: str, layer: int, n_layers: int) -> Q | None:
    """Close to the type llama.cpp's Q4_K_M recipe (llama-quant.cpp) gives a qwen35 tensor: 1-D tensors, norms
    and ssm_conv1d stay F32; output Q6_K; attn_v and ffn_down Q6_K in the "more bits" layers (first and last
    eighth, every third between); everything else Q4_K. One change, so that all three k-quants occur: the
    DeltaNet attn_qkv is Q5_K here (the recipe gives it attn_v's rule; lucebench.models.gguf_synth has the
    exact recipe)."""
    if name.endswith("_norm.weight") or "ssm_conv1d" in name or name.endswith(("ssm_a", "ssm_dt.bias")):
        return None
    more_bits = layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2
    if name == "output.weight":
        return Q.Q6_K
    if name.endswith("attn_qkv.weight"):
        return Q.Q5_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits:
        return Q.Q6_K
    return Q.Q4_K


GGUF_OF_HF = {"embed_tokens": "token_embd", "lm_head": "output", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
              "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
              "linear_attn.out_proj": "ssm_out", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


@pytest.mark.slow
def test_qwen35_q4_k_m_gguf(engine, tmp_path):
    """Every matrix of a qwen35 GGUF in the Q4_K_M recipe's type, from random blocks; transformers holds
    the same dequantised values, so the engine must match it like an fp32 checkpoint."""
    model = synth.make_model(seed=41, vocab_size=320, hidden_size=256, intermediate_size=256, num_hidden_layers=4,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=2,
                             linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
                             layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"])
    rng = np.random.default_rng(3)
    raw: dict[str, tuple[np.ndarray, Q]] = {}
    types: dict[Q, int] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim != 2:
                continue
            stem = name.removesuffix(".weight")
            layer = -1
            if stem.startswith("model.layers."):
                layer = int(stem.split(".")[2])
                gg = f"blk.{layer}." + GGUF_OF_HF[".".join(stem.split(".")[3:])] + ".weight"
            else:
                gg = GGUF_OF_HF[stem.split(".")[-1]] + ".weight"
            qt = q4_k_m_type(gg, layer, 4)
            std = 1.0 if "embed" in name else 1.0 / p.shape[1] ** 0.5
            blocks, values = random_blocks(rng, qt, p.shape[0], p.shape[1], std)
            p.copy_(torch.from_numpy(values))
            raw[gg] = (blocks, qt)
            types[qt] = types.get(qt, 0) + 1
    assert set(types) == {Q.Q4_K, Q.Q5_K, Q.Q6_K}
    path = write_qwen35_gguf(model, tmp_path / "q4km.gguf", "f32", raw=raw)
    e = engine(path, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "96")
    assert e.ready["model"]["dtype"] == "q4_k"
    rng2 = random.Random(9)
    for n in (3, 20):
        prompt = [rng2.randrange(320) for _ in range(n)]
        res = e.generate(prompt, 16, return_logits=True)
        err = check(res, model, prompt)
        print(f"Q4_K_M-typed qwen35 GGUF, prompt {n}: prefill logits relative error {err:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
def test_qwen3_gguf(engine, tmp_path, qtype):
    model = qwen3_synth.make_model(seed=17, vocab_size=300, hidden_size=64, num_hidden_layers=3, head_dim=32)
    path = write_qwen3_gguf(model, tmp_path / f"q3-{qtype}.gguf", qtype)
    e = engine(path, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "96")
    assert e.ready["model"]["arch"] == "qwen3" and e.ready["model"]["dtype"] == qtype
    prompt = [5, 77, 123, 9, 250, 31]
    res = e.generate(prompt, 16, return_logits=True)
    if qtype == "f32":
        check(res, model, prompt)
        return
    want, want_logits = synth.reference(model, prompt, 1)
    err = float((torch.tensor(res["last_logits"]) - want_logits).norm() / want_logits.norm())
    assert err < 0.05 and res["output_ids"][0] == want[0], err
