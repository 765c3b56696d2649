"""Write a Hugging Face Qwen3.5 state dict as a llama.cpp `qwen35` GGUF, applying the converter's
transformations (llama.cpp conversion/qwen.py, Qwen3_5TextModel): RMSNorm gains stored as (1 + w) except
the DeltaNet norm, A_log stored as ssm_a = -exp(A_log), dt_bias as ssm_dt.bias, conv1d squeezed to
[channels, kernel], and DeltaNet value heads reordered from grouped to tiled when there are more value
heads than key heads. Used by the tests to check the engine's GGUF loader against transformers."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch


def _tile_rows(t: np.ndarray, row0: int, nk: int, nv: int, per_head: int) -> np.ndarray:
    r = nv // nk
    if r <= 1:
        return t
    t = t.copy()
    block = t[row0:row0 + nv * per_head].reshape(nk, r, per_head, *t.shape[1:])
    t[row0:row0 + nv * per_head] = block.swapaxes(0, 1).reshape(nv * per_head, *t.shape[1:])
    return t


def _tile_cols(t: np.ndarray, nk: int, nv: int, per_head: int) -> np.ndarray:
    r = nv // nk
    if r <= 1:
        return t
    rows = t.shape[0]
    return t.reshape(rows, nk, r, per_head).swapaxes(1, 2).reshape(rows, nv * per_head).copy()


def write_qwen35_gguf(model: torch.nn.Module, path: Path, qtype: str = "f32",
                      raw: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None) -> Path:
    """`qtype`: f32, f16, bf16 or q8_0 for the 2-D weight matrices (norms and 1-D tensors stay f32).
    `raw`: GGUF tensor name -> (block bytes [rows, row bytes], type) written as given instead (the model
    must hold their dequantised values; only for tensors the converter does not reorder)."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    nk, nv, dv, dk = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_key_head_dim
    w = _writer(path, "qwen35", cfg)
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.25)))
    w.add_uint32("qwen35.ssm.conv_kernel", cfg.linear_conv_kernel_dim)
    w.add_uint32("qwen35.ssm.state_size", dk)
    w.add_uint32("qwen35.ssm.group_count", nk)
    w.add_uint32("qwen35.ssm.time_step_rank", nv)
    w.add_uint32("qwen35.ssm.inner_size", nv * dv)

    add = _tensor_adder(w, qtype, raw)

    add("token_embd.weight", sd["model.embed_tokens.weight"], True)
    add("output_norm.weight", sd["model.norm.weight"] + 1, False)
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"], True)
    kd = nk * dk
    for i, kind in enumerate(cfg.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"] + 1, False)
        add(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + 1, False)
        if kind == "full_attention":
            a = p + "self_attn."
            add(b + "attn_q.weight", sd[a + "q_proj.weight"], True)
            add(b + "attn_k.weight", sd[a + "k_proj.weight"], True)
            add(b + "attn_v.weight", sd[a + "v_proj.weight"], True)
            add(b + "attn_output.weight", sd[a + "o_proj.weight"], True)
            add(b + "attn_q_norm.weight", sd[a + "q_norm.weight"] + 1, False)
            add(b + "attn_k_norm.weight", sd[a + "k_norm.weight"] + 1, False)
        else:
            a = p + "linear_attn."
            add(b + "attn_qkv.weight", _tile_rows(sd[a + "in_proj_qkv.weight"], 2 * kd, nk, nv, dv), True)
            add(b + "attn_gate.weight", _tile_rows(sd[a + "in_proj_z.weight"], 0, nk, nv, dv), True)
            add(b + "ssm_beta.weight", _tile_rows(sd[a + "in_proj_b.weight"], 0, nk, nv, 1), True)
            add(b + "ssm_alpha.weight", _tile_rows(sd[a + "in_proj_a.weight"], 0, nk, nv, 1), True)
            conv = sd[a + "conv1d.weight"][:, 0, :]
            add(b + "ssm_conv1d.weight", _tile_rows(conv, 2 * kd, nk, nv, dv), False)
            add(b + "ssm_a", _tile_rows(-np.exp(sd[a + "A_log"]), 0, nk, nv, 1), False)
            add(b + "ssm_dt.bias", _tile_rows(sd[a + "dt_bias"], 0, nk, nv, 1), False)
            add(b + "ssm_norm.weight", sd[a + "norm.weight"], False)
            add(b + "ssm_out.weight", _tile_cols(sd[a + "out_proj.weight"], nk, nv, dv), True)
        add(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], True)
        add(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"], True)
        add(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"], True)
    return _finish(w, path)


def write_qwen3_gguf(model: torch.nn.Module, path: Path, qtype: str = "f32") -> Path:
    """A Hugging Face Qwen3 state dict as llama.cpp's `qwen3` GGUF (norm gains as stored, no reordering:
    llama.cpp's NEOX rotary needs no q/k permutation). `qtype` as in write_qwen35_gguf."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = _writer(path, "qwen3", cfg)

    add = _tensor_adder(w, qtype)

    add("token_embd.weight", sd["model.embed_tokens.weight"], True)
    add("output_norm.weight", sd["model.norm.weight"], False)
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"], True)
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"], False)
        add(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False)
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            add(b + gg + ".weight", sd[p + "self_attn." + hf + ".weight"], True)
        add(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"], False)
        add(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"], False)
        for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
            add(b + gg + ".weight", sd[p + "mlp." + hf + ".weight"], True)
    return _finish(w, path)


def _writer(path: Path, arch: str, cfg) -> gguf.GGUFWriter:
    """A GGUF writer for `arch` with the header keys every transformer of these families has."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    return w


def _tensor_adder(w: gguf.GGUFWriter, qtype: str, raw: dict | None = None):
    """add(name, array, matrix): matrices in `qtype` (f32, f16, bf16, q8_0), other tensors f32; a tensor named
    in `raw` is written from its given blocks and type instead."""

    def add(name: str, arr: np.ndarray, matrix: bool) -> None:
        arr = np.ascontiguousarray(arr.astype(np.float32))
        if raw and name in raw:
            w.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])
        elif matrix and qtype == "f16":
            w.add_tensor(name, arr.astype(np.float16))
        elif matrix and qtype in ("bf16", "q8_0"):
            q = gguf.GGMLQuantizationType.BF16 if qtype == "bf16" else gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(name, arr)

    return add


def _finish(w: gguf.GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
