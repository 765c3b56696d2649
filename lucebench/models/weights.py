"""Parameter lists of the supported architectures and the scale rule of synthetic weights.

The names are exactly those of transformers' ``Qwen3_5ForCausalLM`` and ``Qwen3ForCausalLM`` (a test
compares them with a model built on the meta device). No torch needed here: the synthesiser streams
numpy arrays.

Scale rule (``SCALE_RULE``, ``lucebench/v2``). Two aims: a random model's greedy output varies instead of
repeating one token (transformers' 0.02 init collapses to a constant token, which hides bugs in
comparisons), and its logits are as peaked as random weights allow against bf16 rounding, so that
transformers' own bf16 run keeps as close as it can to its fp32 greedy tokens:

- every projection matrix ``[out, in]``: N(0, 1/in) (fan-in scaling: activations keep unit RMS);
- depthwise conv1d ``[channels, 1, kernel]``: N(0, 1/kernel);
- embeddings and an untied lm_head: N(0, 1). The input embedding is then as large as the layers' output in
  the residual stream, and it is the one part of the final hidden state that bf16 does not round. On the
  Qwen3.5-0.8B shape bf16 changes the teacher-forced greedy token at 8% of steps, against 18% under v1's
  N(0, 1/hidden) (docs/models.md; the logits stay near-Gaussian over the vocabulary, so free-running bf16
  and fp32 greedy runs of that shape still part within a few tokens);
- final norm (``model.norm``): gain N(0, 1), i.e. ``w`` = -1 + N(0, 1) in Qwen3.5's zero-centred ``(1 + w)``
  form and ``w`` = N(0, 1) in Qwen3's plain form. A gain of mixed sign makes the readout
  ``lm_head . diag(gain) . h`` blind to the input token's own embedding: with a tied lm_head and a near-one
  gain, a large input embedding scores ``|e_t|^2`` for its own token and the model repeats its input token
  for ever (measured on tiny, small and the Qwen3.5-0.8B shape with N(0, 1) embeddings, near-neutral norms);
- other zero-centred RMSNorm weights (Qwen3.5's ``(1 + w)`` form): N(0, 0.1); other plain RMSNorm weights
  (Qwen3, the gated norm of the DeltaNet): 1 + N(0, 0.1). Near neutral, but far enough from it that an
  engine using the wrong form produces visibly different tokens;
- ``A_log`` = log U(1, 16) and ``dt_bias`` = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (Mamba-2's
  initialisation): per-head decays spread from a few tokens to about a thousand.

A checkpoint records the rule in lucebench_synth.json and the synth cache key hashes it, so a checkpoint
written under another rule is never reused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SCALE_RULE = ("lucebench/v2: fan-in normal for matrices, N(0,1) embeddings and lm_head, final norm gain N(0,1), "
              "other norms neutral+N(0,0.1), mamba2 A/dt")


@dataclass(frozen=True)
class TensorSpec:
    """One parameter: its checkpoint name, shape and how to draw it."""

    name: str
    shape: tuple[int, ...]
    init: str  # normal | norm_zero | norm_one | a_log | dt_bias
    std: float = 0.0
    mean: float = 0.0  # for "normal": N(mean, std)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _linear(name: str, out_f: int, in_f: int) -> TensorSpec:
    return TensorSpec(name, (out_f, in_f), "normal", 1.0 / math.sqrt(in_f))


def _qwen3_5_layer(cfg: dict[str, Any], i: int) -> list[TensorSpec]:
    h = cfg["hidden_size"]
    p = f"model.layers.{i}."
    out: list[TensorSpec] = []
    if cfg["layer_types"][i] == "linear_attention":
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        key_dim, value_dim = nk * dk, nv * dv
        conv_dim = 2 * key_dim + value_dim
        kernel = cfg.get("linear_conv_kernel_dim", 4)
        a = p + "linear_attn."
        out += [
            TensorSpec(a + "A_log", (nv,), "a_log"),
            TensorSpec(a + "conv1d.weight", (conv_dim, 1, kernel), "normal", 1.0 / math.sqrt(kernel)),
            TensorSpec(a + "dt_bias", (nv,), "dt_bias"),
            _linear(a + "in_proj_a.weight", nv, h),
            _linear(a + "in_proj_b.weight", nv, h),
            _linear(a + "in_proj_qkv.weight", conv_dim, h),
            _linear(a + "in_proj_z.weight", value_dim, h),
            TensorSpec(a + "norm.weight", (dv,), "norm_one", 0.1),
            _linear(a + "out_proj.weight", h, value_dim),
        ]
    else:
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim", 256)
        s = p + "self_attn."
        out += [
            TensorSpec(s + "k_norm.weight", (hd,), "norm_zero", 0.1),
            _linear(s + "k_proj.weight", nkv * hd, h),
            _linear(s + "o_proj.weight", h, nh * hd),
            TensorSpec(s + "q_norm.weight", (hd,), "norm_zero", 0.1),
            # q_proj emits the query and an equally sized output gate.
            _linear(s + "q_proj.weight", nh * hd * 2, h),
            _linear(s + "v_proj.weight", nkv * hd, h),
        ]
    inter = cfg["intermediate_size"]
    out += [
        TensorSpec(p + "input_layernorm.weight", (h,), "norm_zero", 0.1),
        _linear(p + "mlp.down_proj.weight", h, inter),
        _linear(p + "mlp.gate_proj.weight", inter, h),
        _linear(p + "mlp.up_proj.weight", inter, h),
        TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm_zero", 0.1),
    ]
    return out


def qwen3_layer_specs(cfg: dict[str, Any], i: int, prefix: str = "model.layers.") -> list[TensorSpec]:
    """The parameters of Qwen3 decoder layer ``i`` (also the DFlash draft's layers, under ``layers.``)."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    p = f"{prefix}{i}."
    return [
        TensorSpec(p + "input_layernorm.weight", (h,), "norm_one", 0.1),
        _linear(p + "mlp.down_proj.weight", h, inter),
        _linear(p + "mlp.gate_proj.weight", inter, h),
        _linear(p + "mlp.up_proj.weight", inter, h),
        TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm_one", 0.1),
        TensorSpec(p + "self_attn.k_norm.weight", (hd,), "norm_one", 0.1),
        _linear(p + "self_attn.k_proj.weight", nkv * hd, h),
        _linear(p + "self_attn.o_proj.weight", h, nh * hd),
        TensorSpec(p + "self_attn.q_norm.weight", (hd,), "norm_one", 0.1),
        _linear(p + "self_attn.q_proj.weight", nh * hd, h),
        _linear(p + "self_attn.v_proj.weight", nkv * hd, h),
    ]


def tensor_specs(cfg: dict[str, Any]) -> list[TensorSpec]:
    """Every parameter of the text model described by ``cfg`` (HF config dict), in checkpoint order.

    Order: embeddings, layers 0..n-1, final norm, lm_head (absent when embeddings are tied, as in the
    published tied checkpoints).
    """
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    qwen3 = cfg["model_type"] == "qwen3"
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, h), "normal", 1.0)]
    for i in range(cfg["num_hidden_layers"]):
        specs += qwen3_layer_specs(cfg, i) if qwen3 else _qwen3_5_layer(cfg, i)
    # Final norm gain N(0, 1): w itself in Qwen3's plain form, 1 + w in Qwen3.5's zero-centred one.
    specs.append(TensorSpec("model.norm.weight", (h,), "normal", 1.0, mean=0.0 if qwen3 else -1.0))
    if not cfg.get("tie_word_embeddings", False):
        specs.append(TensorSpec("lm_head.weight", (vocab, h), "normal", 1.0))
    return specs


def multimodal_name(name: str) -> str:
    """The name of a text parameter inside ``Qwen3_5ForConditionalGeneration`` (``model.language_model.*``)."""
    if name.startswith("model."):
        return "model.language_model." + name[len("model."):]
    return name


def n_params(cfg: dict[str, Any]) -> int:
    """Parameter count of the text model (tied embeddings counted once)."""
    return sum(s.numel for s in tensor_specs(cfg))
