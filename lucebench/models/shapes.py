"""Named model shapes: Hugging Face text configs (``Qwen3_5TextConfig`` / ``Qwen3Config`` fields).

The real shapes copy the published config.json of each model (sources in docs/models.md); the tiny
shapes exist for tests and CPU smoke runs. A shape carries the special-token ids the tokenizer must
use: the real model's ids where the vocabulary is large enough, else ids just past the trained
tokenizer's vocabulary.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from lucebench.errors import UserError

# Special tokens every synthetic tokenizer carries, in this order (Qwen's ChatML set plus thinking).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

# Real ids (Qwen3.5 tokenizer.json / Qwen3 tokenizer.json).
QWEN3_5_SPECIAL_IDS: dict[str, int] = {
    "<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<think>": 248068, "</think>": 248069,
}
QWEN3_SPECIAL_IDS: dict[str, int] = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667, "</think>": 151668,
}

# Size of the locally trained byte-level BPE (256 byte tokens + merges); special ids come after it
# when the model's vocabulary cannot hold the real ones.
DEFAULT_BPE_VOCAB = 2048


@dataclass(frozen=True)
class Shape:
    """A named model shape: its HF text config and the special-token ids its tokenizer uses."""

    name: str
    config: dict[str, Any]
    special_ids: dict[str, int]
    bpe_vocab: int = DEFAULT_BPE_VOCAB
    source: str = ""
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        """``qwen3_5`` or ``qwen3``."""
        return "qwen3" if self.config["model_type"] == "qwen3" else "qwen3_5"

    @property
    def eos_ids(self) -> list[int]:
        """Generation stop ids, as the real generation_config.json lists them: <|im_end|>, <|endoftext|>."""
        return [self.special_ids["<|im_end|>"], self.special_ids["<|endoftext|>"]]


def default_layer_types(n_layers: int, interval: int = 4) -> list[str]:
    """Qwen3.5's layer pattern where a config does not list it: every `interval`-th layer full attention."""
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def _qwen3_5(*, n_layers: int, hidden: int, intermediate: int, vocab: int, heads: int, kv_heads: int,
             head_dim: int, lin_k_heads: int, lin_v_heads: int, lin_k_dim: int, lin_v_dim: int, tied: bool,
             max_pos: int = 262144, layer_types: list[str] | None = None, eos: int = 248044,
             mrope: list[int] | None = None) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}
    if mrope:
        # Text-only positions share one value across the three M-RoPE sections, so this is inert for text;
        # the sections must sum to at most half the rotary width.
        rope.update({"mrope_interleaved": True, "mrope_section": mrope})
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": lin_k_dim,
        "linear_value_head_dim": lin_v_dim,
        "linear_num_key_heads": lin_k_heads,
        "linear_num_value_heads": lin_v_heads,
        "full_attention_interval": 4,
        "layer_types": layer_types if layer_types is not None else default_layer_types(n_layers),
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6,
        "partial_rotary_factor": 0.25,
        "rope_parameters": rope,
        "mamba_ssm_dtype": "float32",
        "tie_word_embeddings": tied,
        "use_cache": True,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": None,
    }


def _qwen3(*, n_layers: int, hidden: int, intermediate: int, vocab: int, heads: int, kv_heads: int, head_dim: int,
           tied: bool, max_pos: int = 40960, bos: int = 151643, eos: int = 151645) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": max_pos,
        "max_window_layers": n_layers,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "initializer_range": 0.02,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }


def _small_special_ids(bpe_vocab: int) -> dict[str, int]:
    """Special ids right after the trained BPE vocabulary (the real ids do not fit a tiny vocab)."""
    return {tok: bpe_vocab + i for i, tok in enumerate(SPECIAL_TOKENS)}


def _build() -> dict[str, Shape]:
    shapes: list[Shape] = []
    shapes.append(Shape(
        name="qwen3.5-0.8b",
        config=_qwen3_5(n_layers=24, hidden=1024, intermediate=3584, vocab=248320, heads=8, kv_heads=2, head_dim=256,
                        lin_k_heads=16, lin_v_heads=16, lin_k_dim=128, lin_v_dim=128, tied=True, mrope=[11, 11, 10]),
        special_ids=dict(QWEN3_5_SPECIAL_IDS),
        source="Qwen/Qwen3.5-0.8B config.json (text_config)",
        description="Qwen3.5-0.8B text model (megakernel target), tied embeddings",
    ))
    shapes.append(Shape(
        name="qwen3.5-27b",
        config=_qwen3_5(n_layers=64, hidden=5120, intermediate=17408, vocab=248320, heads=24, kv_heads=4, head_dim=256,
                        lin_k_heads=16, lin_v_heads=48, lin_k_dim=128, lin_v_dim=128, tied=False, mrope=[11, 11, 10]),
        special_ids=dict(QWEN3_5_SPECIAL_IDS),
        source="Qwen/Qwen3.5-27B config.json (text_config)",
        description="Qwen3.5-27B / Qwen3.6-27B text model (DFlash/PFlash target), ~54 GB in bf16",
    ))
    shapes.append(Shape(
        name="qwen3-0.6b",
        config=_qwen3(n_layers=28, hidden=1024, intermediate=3072, vocab=151936, heads=16, kv_heads=8, head_dim=128,
                      tied=True),
        special_ids=dict(QWEN3_SPECIAL_IDS),
        source="Qwen/Qwen3-0.6B config.json",
        description="Qwen3-0.6B (PFlash drafter), dense attention",
    ))
    # Tiny shapes: the vocab holds the trained BPE, the five specials and a few unused ids, so that the
    # model can emit ids the tokenizer does not know (as the real 248320-row table does).
    tiny_bpe = 1024
    tiny_vocab = 1088
    tiny_eos = tiny_bpe + SPECIAL_TOKENS.index("<|endoftext|>")
    shapes.append(Shape(
        name="tiny",
        config=_qwen3_5(n_layers=4, hidden=64, intermediate=192, vocab=tiny_vocab, heads=4, kv_heads=2, head_dim=32,
                        lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16, tied=True, max_pos=4096,
                        eos=tiny_eos, mrope=[2, 1, 1]),
        special_ids=_small_special_ids(tiny_bpe), bpe_vocab=tiny_bpe,
        source="lucebench test shape", description="4 layers (3 linear + 1 full), hidden 64, tied",
    ))
    odd_bpe = 777
    odd_vocab = 803
    shapes.append(Shape(
        name="tiny-odd",
        config=_qwen3_5(n_layers=5, hidden=72, intermediate=200, vocab=odd_vocab, heads=3, kv_heads=1, head_dim=24,
                        lin_k_heads=3, lin_v_heads=6, lin_k_dim=8, lin_v_dim=12, tied=False, max_pos=2048,
                        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                                     "full_attention"],
                        eos=odd_bpe + SPECIAL_TOKENS.index("<|endoftext|>")),
        special_ids=_small_special_ids(odd_bpe), bpe_vocab=odd_bpe,
        source="lucebench test shape",
        description="odd sizes: 5 layers (L,F,L,L,F), hidden 72, 3 q / 1 kv heads, untied, 6 value heads per 3 key heads",
    ))
    shapes.append(Shape(
        name="tiny-qwen3",
        config=_qwen3(n_layers=3, hidden=64, intermediate=160, vocab=tiny_vocab, heads=4, kv_heads=2, head_dim=16,
                      tied=True, max_pos=4096, bos=tiny_eos, eos=tiny_bpe + SPECIAL_TOKENS.index("<|im_end|>")),
        special_ids=_small_special_ids(tiny_bpe), bpe_vocab=tiny_bpe,
        source="lucebench test shape", description="3-layer Qwen3 (dense attention), hidden 64",
    ))
    shapes.append(Shape(
        name="tiny-qwen3-odd",
        config=_qwen3(n_layers=5, hidden=72, intermediate=200, vocab=odd_vocab, heads=3, kv_heads=1, head_dim=24,
                      tied=False, max_pos=2048, bos=odd_bpe + SPECIAL_TOKENS.index("<|endoftext|>"),
                      eos=odd_bpe + SPECIAL_TOKENS.index("<|im_end|>")),
        special_ids=_small_special_ids(odd_bpe), bpe_vocab=odd_bpe,
        source="lucebench test shape",
        description="odd-sized Qwen3 (dense attention): 5 layers, hidden 72, 3 q / 1 kv heads of 24, untied",
    ))
    shapes.append(Shape(
        name="small",
        config=_qwen3_5(n_layers=8, hidden=256, intermediate=768, vocab=4160, heads=4, kv_heads=2, head_dim=64,
                        lin_k_heads=4, lin_v_heads=4, lin_k_dim=32, lin_v_dim=32, tied=True, max_pos=32768,
                        eos=4096, mrope=[3, 3, 2]),
        special_ids=_small_special_ids(4096), bpe_vocab=4096,
        source="lucebench smoke shape", description="8 layers, hidden 256: a CPU smoke run with measurable timings",
    ))
    return {s.name: s for s in shapes}


SHAPES: dict[str, Shape] = _build()


def shape_names() -> list[str]:
    """All named shapes, in definition order."""
    return list(SHAPES)


def get_shape(name: str) -> Shape:
    """The named shape (a deep copy, so callers may edit its config). Unknown names raise UserError."""
    try:
        shape = SHAPES[name]
    except KeyError:
        raise UserError(f"unknown model shape {name!r}", where="--shape",
                        hint=f"one of: {', '.join(SHAPES)}") from None
    return copy.deepcopy(shape)


def shape_from_config(config: dict[str, Any], *, name: str = "custom", where: str | None = None) -> Shape:
    """A shape from a user's config dict (a text config, or a multimodal one with ``text_config``).

    Missing special-token ids are placed after the trained BPE vocabulary, or at the real Qwen ids when the
    vocabulary is large enough to hold them.
    """
    cfg = dict(config.get("text_config") or config)
    model_type = cfg.get("model_type")
    if model_type in (None, "qwen3_5", "qwen3_5_text"):
        cfg["model_type"] = "qwen3_5_text"
        cfg.setdefault("architectures", ["Qwen3_5ForCausalLM"])
        real = QWEN3_5_SPECIAL_IDS
    elif model_type == "qwen3":
        cfg.setdefault("architectures", ["Qwen3ForCausalLM"])
        real = QWEN3_SPECIAL_IDS
    else:
        raise UserError(f"model_type {model_type!r} is not supported by the synthesiser", where=where,
                        hint="use qwen3_5_text (Qwen3.5) or qwen3")
    required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads"]
    missing = [k for k in required if k not in cfg]
    if missing:
        raise UserError(f"config lacks {', '.join(missing)}", where=where, hint="give a full Hugging Face text config")
    vocab = int(cfg["vocab_size"])
    if vocab > max(real.values()):
        special = dict(real)
        bpe = DEFAULT_BPE_VOCAB
    else:
        bpe = min(DEFAULT_BPE_VOCAB, vocab - len(SPECIAL_TOKENS))
        if bpe < 256 + 16:
            raise UserError(f"vocab_size {vocab} is too small for a byte-level tokenizer", where=where,
                            hint=f"use at least {256 + 16 + len(SPECIAL_TOKENS)}")
        special = _small_special_ids(bpe)
    if cfg["model_type"] == "qwen3_5_text":
        cfg.setdefault("head_dim", 256)
        if "layer_types" not in cfg:
            cfg["layer_types"] = default_layer_types(int(cfg["num_hidden_layers"]), int(cfg.get("full_attention_interval", 4)))
    cfg.setdefault("tie_word_embeddings", False)
    cfg.setdefault("eos_token_id", special["<|endoftext|>"])
    return Shape(name=name, config=cfg, special_ids=special, bpe_vocab=bpe, source="user config")
