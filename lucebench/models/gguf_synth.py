"""Synthetic Qwen3.5 checkpoints written directly as llama.cpp ``qwen35`` GGUF files, quantised as
``llama-quantize`` would type them, streamed tensor by tensor (a 27B Q4_K_M file needs no 54 GB bf16
checkpoint first).

The file is what llama.cpp's converter followed by ``llama-quantize`` writes for a Qwen3.5 text model: the
same metadata keys, tensor names, shapes and conventions (norm gains stored as the multiplier, ssm_a =
-exp(A_log), ssm_dt.bias, conv1d as [channels, kernel], value heads in the tiled order: for random weights
the order changes nothing but is kept), tensors in the order the quantiser writes them, and each matrix in
the type the quantisation recipe gives it (see :func:`tensor_type`). The MTP head is not written (the
text model only). The weights are random:

* block-quantised matrices are random bytes with fp16 scale fields set so that the values have a standard
  deviation of 1/sqrt(in_features) (1 for the embedding table), centred (dmin = 7.5 d for q4_K, 15.5 d for
  q5_K). The bytes come from a pool of random blocks per (type, scale), a prime number of blocks long
  (> the vocabulary), read from a random offset per tensor: every row of a matrix differs, and writing is
  bound by the disk, not by the random generator;
* 1-D tensors (norms, ssm_a, ssm_dt.bias) and the f32 conv taps follow the safetensors synth's scale rule.

The file's metadata carries ``lucebench.synthetic = true`` and the generator's parameters, and
``lucebench_synth.json`` next to it says the same: results on these files are speed figures only.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebench import __version__
from lucebench.errors import UserError
from lucebench.models.shapes import Shape
from lucebench.models.tokenizer import build_tokenizer_json, tokenizer_config

QUANTS = ("q4_k_m", "q8_0")
PROVENANCE_FILE = "lucebench_synth.json"
# llama_ftype of the recipes (llama.h): the file's general.file_type
FILE_TYPE = {"q4_k_m": 15, "q8_0": 7}
# A prime number of blocks per pool: larger than any row count, so no two rows of a matrix repeat.
POOL_BLOCKS = 262147
# dmin / d that centres a k-quant block's values (mean q x mean scale = dmin x mean min)
_CENTRE = {"Q4_K": 7.5, "Q5_K": 15.5}


def _more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, layer: int, n_layers: int, *, tied: bool, quant: str) -> str:
    """The type llama.cpp's recipe (src/llama-quant.cpp at the pinned commit) gives a qwen35 tensor, as a
    GGMLQuantizationType name. Q4_K_M: 1-D tensors, norms and ssm_conv1d stay F32; output.weight Q6_K (and
    token_embd.weight when the embeddings are tied, since it is the output then), else token_embd Q4_K; the
    attn_v-like tensors (attn_v, and the DeltaNet attn_qkv, which the recipe counts with them: its own
    ATTENTION_QKV rule comes after the attn_v one and is never reached) and ffn_down Q6_K in the "more bits"
    layers (the counter is the layer index: the quantiser sorts tensors by layer), Q4_K elsewhere;
    everything else (attn_q/k/output, attn_gate, ssm_alpha/beta, ssm_out, ffn_gate/up) Q4_K. Q8_0: every
    matrix Q8_0."""
    if name.endswith("_norm.weight") or "ssm_conv1d" in name or name.endswith(("ssm_a", "ssm_dt.bias")):
        return "F32"
    if quant == "q8_0":
        return "Q8_0"
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    if name.endswith(("attn_v.weight", "attn_qkv.weight", "ffn_down.weight")) and _more_bits(layer, n_layers):
        return "Q6_K"
    return "Q4_K"


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]  # row-major, outermost first
    layer: int
    init: str               # "matrix", "embed", "norm", "norm_final", "ssm_norm", "ssm_a", "dt", "conv"


def gguf_tensors(cfg: dict[str, Any]) -> list[GgufTensor]:
    """The tensors of a qwen35 GGUF for the HF text config `cfg`, in llama-quantize's order (non-layer
    tensors by name, then each layer's by name)."""
    H, FF, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg.get("linear_conv_kernel_dim", 4)
    cd, vd = 2 * nk * dk + nv * dv, nv * dv
    top = [GgufTensor("output_norm.weight", (H,), -1, "norm_final"), GgufTensor("token_embd.weight", (V, H), -1, "embed")]
    if not cfg.get("tie_word_embeddings", False):
        top.append(GgufTensor("output.weight", (V, H), -1, "matrix"))
    out = sorted(top, key=lambda t: t.name)
    for i, kind in enumerate(cfg["layer_types"]):
        b = f"blk.{i}."
        ts = [(b + "attn_norm.weight", (H,), "norm"), (b + "post_attention_norm.weight", (H,), "norm"),
              (b + "ffn_gate.weight", (FF, H), "matrix"), (b + "ffn_up.weight", (FF, H), "matrix"),
              (b + "ffn_down.weight", (H, FF), "matrix")]
        if kind == "full_attention":
            ts += [(b + "attn_q.weight", (2 * nh * hd, H), "matrix"), (b + "attn_k.weight", (nkv * hd, H), "matrix"),
                   (b + "attn_v.weight", (nkv * hd, H), "matrix"), (b + "attn_output.weight", (H, nh * hd), "matrix"),
                   (b + "attn_q_norm.weight", (hd,), "norm"), (b + "attn_k_norm.weight", (hd,), "norm")]
        else:
            ts += [(b + "attn_qkv.weight", (cd, H), "matrix"), (b + "attn_gate.weight", (vd, H), "matrix"),
                   (b + "ssm_beta.weight", (nv, H), "matrix"), (b + "ssm_alpha.weight", (nv, H), "matrix"),
                   (b + "ssm_conv1d.weight", (cd, K), "conv"), (b + "ssm_a", (nv,), "ssm_a"),
                   (b + "ssm_dt.bias", (nv,), "dt"), (b + "ssm_norm.weight", (dv,), "ssm_norm"),
                   (b + "ssm_out.weight", (H, vd), "matrix")]
        out += [GgufTensor(n, s, i, init) for n, s, init in sorted(ts)]
    return out


class _BlockPools:
    """Random blocks of one type and scale, POOL_BLOCKS long, made on first use."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.pools: dict[tuple[str, float], np.ndarray] = {}

    def get(self, qtype: str, std: float) -> np.ndarray:
        import gguf

        key = (qtype, round(std, 9))
        if key not in self.pools:
            q = gguf.GGMLQuantizationType[qtype]
            _, size = gguf.GGML_QUANT_SIZES[q]
            raw = self.rng.integers(0, 256, size=(POOL_BLOCKS, size), dtype=np.uint8)
            fields = {"Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[qtype]

            def set_d(d: float) -> None:
                raw[:, fields[0]:fields[0] + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
                if len(fields) > 1:
                    raw[:, fields[1]:fields[1] + 2] = np.frombuffer(np.float16(d * _CENTRE[qtype]).tobytes(), np.uint8)

            set_d(1.0)
            s = float(gguf.quants.dequantize(raw[:4096], q).std())
            set_d(std / s)
            self.pools[key] = raw.reshape(-1)
        return self.pools[key]


@dataclass(frozen=True)
class GgufSynthResult:
    path: Path
    n_params: int
    weight_bytes: int
    types: dict[str, int]  # type -> tensors of it
    seconds: float


def synthesize_gguf(shape: Shape, out_dir: Path, *, quant: str = "q4_k_m", seed: int = 0,
                    progress: Callable[[str, int, int], None] | None = None) -> GgufSynthResult:
    """Write ``model-<quant>.gguf`` and lucebench_synth.json for a Qwen3.5 ``shape`` into ``out_dir``."""
    import gguf

    if shape.arch != "qwen3_5":
        raise UserError(f"the GGUF synth writes qwen35 files only, not {shape.name} ({shape.arch})", where="--shape")
    if quant not in QUANTS:
        raise UserError(f"unknown quantisation {quant!r}", where="--quant", hint=f"one of: {', '.join(QUANTS)}")
    cfg = shape.config
    n_layers, tied = cfg["num_hidden_layers"], bool(cfg.get("tie_word_embeddings", False))
    tensors = gguf_tensors(cfg)
    types = {t.name: tensor_type(t.name, t.layer, n_layers, tied=tied, quant=quant) for t in tensors}
    for t in tensors:
        if types[t.name] != "F32":
            elems = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[types[t.name]]][0]
            if t.shape[-1] % elems:
                raise UserError(f"{t.name} has rows of {t.shape[-1]} elements, not a multiple of {elems}: llama.cpp "
                                "would fall back to a type this writer does not produce", where=f"--shape {shape.name}")
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    path = out_dir / f"model-{quant}.gguf"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write {out_dir}: {exc.strerror}", where=str(out_dir)) from None

    w = gguf.GGUFWriter(str(path), "qwen35")
    _add_metadata(w, shape, quant, seed)
    nbytes: dict[str, int] = {}
    for t in tensors:
        q = gguf.GGMLQuantizationType[types[t.name]]
        elems, size = gguf.GGML_QUANT_SIZES[q]
        nb = math.prod(t.shape) // elems * size
        nbytes[t.name] = nb
        if q == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), nb)
        else:
            w.add_tensor_info(t.name, (*t.shape[:-1], t.shape[-1] // elems * size), np.dtype(np.uint8), nb, raw_dtype=q)
    total = sum(nbytes.values())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    align = w.data_alignment
    w.close()

    # The tensor data, appended as GGUF lays it out (each tensor at a multiple of the alignment, in the order
    # of the tensor infos), the block bytes written straight from the pools without a copy.
    rng = np.random.default_rng(seed)
    pools = _BlockPools(rng)
    done = 0
    with open(path, "ab", buffering=1 << 24) as f:
        f.write(bytes(-f.tell() % align))
        for t in tensors:
            qt = types[t.name]
            if qt == "F32":
                f.write(_float_values(t, rng).tobytes())
            else:
                std = 1.0 if t.init == "embed" else 1.0 / math.sqrt(t.shape[-1])
                pool = memoryview(pools.get(qt, std))
                pos, left = int(rng.integers(0, POOL_BLOCKS)) * (len(pool) // POOL_BLOCKS), nbytes[t.name]
                while left > 0:
                    n = min(left, len(pool) - pos)
                    f.write(pool[pos:pos + n])
                    left -= n
                    pos = 0
            f.write(bytes(-nbytes[t.name] % align))
            done += nbytes[t.name]
            if progress is not None:
                progress(t.name, done, total)

    # The tokenizer beside the file (the GGUF's own table, as tokenizer.json), so that the folder gives
    # prompts their ids as a safetensors synth's does (a config's `synth: {format: gguf}` model is this folder).
    tok_json = build_tokenizer_json(shape.bpe_vocab, shape.special_ids)
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(
        shape.special_ids, model_max_length=int(cfg.get("max_position_embeddings", 32768))), indent=2) + "\n",
        encoding="utf-8")
    counts: dict[str, int] = {}
    for qt in types.values():
        counts[qt] = counts.get(qt, 0) + 1
    n_params = sum(math.prod(t.shape) for t in tensors)
    (out_dir / PROVENANCE_FILE).write_text(json.dumps({
        "generator": "lucebench models synth --format gguf",
        "synthetic": True,
        "lucebench_version": __version__,
        "shape": shape.name,
        "shape_source": shape.source,
        "seed": seed,
        "format": "gguf",
        "quant": quant,
        "file": path.name,
        "tensor_types": counts,
        "type_rule": "llama.cpp llama-quant.cpp recipe (lucebench/models/gguf_synth.py tensor_type)",
        "n_params": n_params,
        "weight_bytes": total,
        "mtp": "not written (text model only)",
    }, indent=2) + "\n", encoding="utf-8")
    return GgufSynthResult(path=path, n_params=n_params, weight_bytes=total, types=counts,
                           seconds=time.perf_counter() - t0)


def _float_values(t: GgufTensor, rng: np.random.Generator) -> np.ndarray:
    """The f32 tensors, as the safetensors synth draws them (weights.py's scale rule), stored as GGUF stores
    them (gains as multipliers, ssm_a = -exp(A_log))."""
    n = math.prod(t.shape)
    if t.init == "norm":
        x = 1.0 + 0.1 * rng.standard_normal(n)
    elif t.init == "norm_final":
        x = rng.standard_normal(n)  # mixed sign (docs/models.md: synth rule v2)
    elif t.init == "ssm_norm":
        x = 1.0 + 0.1 * rng.standard_normal(n)
    elif t.init == "ssm_a":
        x = -np.exp(rng.uniform(-2.0, 1.5, n))
    elif t.init == "dt":
        x = 0.5 * rng.standard_normal(n)
    else:  # conv taps
        x = 0.5 * rng.standard_normal(n)
    return x.astype(np.float32).reshape(t.shape)


def _add_metadata(w: Any, shape: Shape, quant: str, seed: int) -> None:
    import gguf

    cfg = shape.config
    rope = cfg.get("rope_parameters", {})
    hd = cfg["head_dim"]
    w.add_type("model")
    w.add_name(f"SYNTHETIC {shape.name} (random weights, lucebench)")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(int(cfg.get("max_position_embeddings", 262144)))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    w.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    w.add_rope_freq_base(float(rope.get("rope_theta", 10000000)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_file_type(FILE_TYPE[quant])
    w.add_uint32("qwen35.ssm.conv_kernel", cfg.get("linear_conv_kernel_dim", 4))
    w.add_uint32("qwen35.ssm.state_size", cfg["linear_key_head_dim"])
    w.add_uint32("qwen35.ssm.group_count", cfg["linear_num_key_heads"])
    w.add_uint32("qwen35.ssm.time_step_rank", cfg["linear_num_value_heads"])
    w.add_uint32("qwen35.ssm.inner_size", cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"])
    w.add_array("qwen35.attention.recurrent_layers", [k == "linear_attention" for k in cfg["layer_types"]])
    w.add_uint32("qwen35.full_attention_interval", int(cfg.get("full_attention_interval", 4)))
    w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # Tokenizer: the synth's byte-level BPE (as the safetensors synth's tokenizer.json), its specials at the
    # shape's ids, the other ids unused placeholders (the real table has 248320 rows).
    tok = build_tokenizer_json(shape.bpe_vocab, shape.special_ids)
    V = cfg["vocab_size"]
    tokens = [f"<|lucebench_unused_{i}|>" for i in range(V)]
    ttypes = [gguf.TokenType.UNUSED] * V
    for s, i in tok["model"]["vocab"].items():
        if i < V:
            tokens[i], ttypes[i] = s, gguf.TokenType.NORMAL
    for s, i in shape.special_ids.items():
        tokens[i], ttypes[i] = s, gguf.TokenType.CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    w.add_eos_token_id(shape.special_ids["<|endoftext|>"])
    w.add_pad_token_id(shape.special_ids["<|endoftext|>"])
    w.add_bool("lucebench.synthetic", True)
    w.add_string("lucebench.synth.shape", shape.name)
    w.add_uint32("lucebench.synth.seed", seed)
    w.add_string("lucebench.synth.quant", quant)
