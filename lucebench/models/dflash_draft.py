"""DFlash drafts in the published (z-lab) layout: the config read and validated, random drafts written.

A DFlash draft (../shared/reference/speculative.md §1) owns Qwen3 decoder layers, ``fc`` (the n target
layers' features, concatenated, projected to the hidden size) and ``hidden_norm``; it borrows the target's
embedding and LM head. Its config.json says ``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``,
carries the Qwen3 sizes at the top level, and places ``block_size``, ``mask_token_id`` and
``target_layer_ids`` either at the top level or inside ``dflash_config`` depending on who produced it:
:func:`read_draft_config` accepts both.

``synthesize_draft(target_dir, out_dir)`` writes a random-weight draft for a target checkpoint: the sizes
of the published draft for that target where one exists (matched on architecture, hidden size, layer count
and vocabulary), else the target's own attention and MLP sizes; ``target_layer_ids`` by the reference rule
``round(1 + i * (L - 4) / (n - 1))`` unless the published draft lists them. Weights follow the synthesiser's
scale rule (fan-in normal matrices, near-neutral norms) and are drawn per tensor from (seed, name).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebench import __version__
from lucebench.errors import UserError
from lucebench.models.safetensors_stream import DTYPES, to_dtype_bytes, write_safetensors
from lucebench.models.synth import PROVENANCE_FILE, tensor_values
from lucebench.models.weights import SCALE_RULE, TensorSpec, qwen3_layer_specs

DRAFT_ARCHITECTURE = "DFlashDraftModel"
BLOCK_SIZE = 16
N_DRAFT_LAYERS = 5


@dataclass(frozen=True)
class PublishedDraft:
    """A published draft's sizes and conditioning, keyed by the target it was trained for."""

    name: str
    target_arch: str  # qwen3_5 or qwen3
    target_hidden: int
    target_layers: int
    target_vocab: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    # Sizes of the draft's own layers; None where the publisher's card does not give them (the target's
    # attention and MLP sizes are used instead).
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None
    rope_theta: float | None = None


# speculative.md §1's table. The Qwen3.6-27B draft shares its target's shape with the Qwen3.5-27B one;
# its sliding-window layers are not reproduced here (every synthetic draft layer is full attention).
PUBLISHED_DRAFTS: tuple[PublishedDraft, ...] = (
    PublishedDraft("z-lab/Qwen3.5-27B-DFlash", "qwen3_5", 5120, 64, 248320, (1, 16, 31, 46, 61), 248070,
                   32, 8, 128, 17408, 1e7),
    PublishedDraft("z-lab/Qwen3.5-4B-DFlash", "qwen3_5", 2560, 32, 248320, (1, 8, 15, 22, 29), 248070,
                   32, 8, 128, 9728, 1e7),
    PublishedDraft("z-lab/Qwen3-8B-DFlash-b16", "qwen3", 4096, 36, 151936, (1, 9, 17, 25, 33), 151669,
                   32, 8, 128, 12288, 1e6),
    PublishedDraft("community Qwen3.5-0.8B draft", "qwen3_5", 1024, 24, 248320, (3, 7, 11, 15, 19), 248077),
)


def default_target_layer_ids(n_target_layers: int, n_features: int = N_DRAFT_LAYERS) -> list[int]:
    """The reference's rule where a config lists no ids: ``round(1 + i * (L - 4) / (n - 1))`` (Python's round)."""
    if n_features == 1:
        return [n_target_layers // 2]
    return [round(1 + i * (n_target_layers - 4) / (n_features - 1)) for i in range(n_features)]


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class DraftConfig:
    """A DFlash draft's config.json, normalised (both placements of the DFlash keys accepted)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    layer_types: tuple[str, ...]
    sliding_window: int | None
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor name of the published layout with its shape."""
        cfg = {"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
               "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
               "head_dim": self.head_dim}
        return {s.name: s.shape for s in _draft_specs(cfg, self.num_hidden_layers, len(self.target_layer_ids))}


def _int(cfg: dict[str, Any], key: str, where: str, *, minimum: int = 1) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UserError(f"`{key}` must be an integer >= {minimum}, got {v!r}", where=where)
    return v


def _dflash_key(cfg: dict[str, Any], key: str) -> Any:
    """A DFlash key from ``dflash_config`` or the top level (producers differ); the nested one wins."""
    nested = cfg.get("dflash_config")
    if isinstance(nested, dict) and key in nested:
        return nested[key]
    return cfg.get(key)


def parse_draft_config(cfg: dict[str, Any], *, where: str = "config.json") -> DraftConfig:
    """Validate a draft's config dict; every problem is a UserError naming the key."""
    arch = cfg.get("architectures") or []
    if DRAFT_ARCHITECTURE not in arch:
        raise UserError(f"not a DFlash draft: architectures is {arch!r}", where=where,
                        hint=f"a published draft's config.json lists {DRAFT_ARCHITECTURE!r}")
    if cfg.get("model_type") != "qwen3":
        raise UserError(f"`model_type` must be 'qwen3' (the draft's layers are Qwen3 layers), got "
                        f"{cfg.get('model_type')!r}", where=where)
    if "dflash_config" in cfg and not isinstance(cfg["dflash_config"], dict):
        raise UserError("`dflash_config` must be an object", where=where)
    hidden = _int(cfg, "hidden_size", where)
    layers = _int(cfg, "num_hidden_layers", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where)
    if heads % kv_heads:
        raise UserError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}", where=where)
    head_dim = _int(cfg, "head_dim", where) if cfg.get("head_dim") is not None else hidden // heads
    inter = _int(cfg, "intermediate_size", where)
    vocab = _int(cfg, "vocab_size", where)
    n_target = _int(cfg, "num_target_layers", where)
    block = _dflash_key(cfg, "block_size")
    if block is None:
        block = BLOCK_SIZE  # the reference's default where a config omits it
    if isinstance(block, bool) or not isinstance(block, int) or block < 2:
        raise UserError(f"`block_size` must be an integer >= 2, got {block!r}", where=where)
    ids = _dflash_key(cfg, "target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(n_target, layers)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise UserError(f"`target_layer_ids` must be a non-empty list of integers, got {ids!r}", where=where)
    bad = [i for i in ids if not 0 <= i < n_target]
    if bad:
        raise UserError(f"target_layer_ids {bad} are outside the target's layers [0, {n_target})", where=where)
    mask = _dflash_key(cfg, "mask_token_id")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < vocab:
        raise UserError(f"`mask_token_id` must be a token id in [0, {vocab}), got {mask!r}", where=where)
    layer_types = cfg.get("layer_types") or ["full_attention"] * layers
    if len(layer_types) != layers or any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        raise UserError(f"`layer_types` must list {layers} of full_attention / sliding_attention", where=where)
    window = cfg.get("sliding_window")
    if "sliding_attention" in layer_types and (not isinstance(window, int) or window < 1):
        raise UserError("sliding_attention layers need an integer `sliding_window` >= 1", where=where)
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 1e6))
    return DraftConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=inter, vocab_size=vocab,
                       rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                       layer_types=tuple(layer_types), sliding_window=window if isinstance(window, int) else None,
                       block_size=block, num_target_layers=n_target, target_layer_ids=tuple(ids),
                       mask_token_id=mask)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", where=str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"not JSON: {exc}", where=str(path)) from None
    if not isinstance(data, dict):
        raise UserError("expected a JSON object", where=str(path))
    return data


def read_draft_config(folder: Path) -> DraftConfig:
    """The config.json of a draft folder, validated."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UserError("no config.json: not a Hugging Face draft folder", where=str(folder))
    return parse_draft_config(_read_json(path), where=str(path))


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (name -> dtype, shape, offsets), read without the data."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise UserError("truncated safetensors file", where=str(path))
            (n,) = struct.unpack("<Q", raw)
            header = json.loads(f.read(n))
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", where=str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError("the safetensors header is not JSON", where=str(path)) from None
    header.pop("__metadata__", None)
    return header


def check_draft(folder: Path, target_config: dict[str, Any] | None = None) -> DraftConfig:
    """Validate a draft folder: its config, every tensor's name and shape, and (when given) its fit to the
    target's text config: hidden size, layer count, vocabulary. Returns the config."""
    folder = Path(folder)
    cfg = read_draft_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError("no *.safetensors file", where=str(folder))
    found: dict[str, tuple[int, ...]] = {}
    for f in files:
        for name, info in safetensors_header(f).items():
            found[name] = tuple(info.get("shape", ()))
    want = cfg.tensor_shapes()
    missing = sorted(set(want) - set(found))
    if missing:
        raise UserError(f"missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                        where=str(folder))
    extra = sorted(set(found) - set(want))
    if extra:
        raise UserError(f"unexpected tensor {extra[0]} for a {cfg.num_hidden_layers}-layer draft", where=str(folder))
    for name, shape in want.items():
        if found[name] != shape:
            raise UserError(f"{name} has shape {list(found[name])}, expected {list(shape)}", where=str(folder))
    if target_config is not None:
        t = text_config(target_config)
        for key, mine in (("hidden_size", cfg.hidden_size), ("num_hidden_layers", cfg.num_target_layers),
                          ("vocab_size", cfg.vocab_size)):
            if t.get(key) != mine:
                raise UserError(f"the draft is for a target with {key} {mine}, the target has {t.get(key)}",
                                where=str(folder / "config.json"))
    return cfg


# ---------------------------------------------------------------------------------------------- writing
def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text model's config of a (possibly multimodal) Hugging Face config."""
    return dict(cfg.get("text_config") or cfg)


def _target_arch(t: dict[str, Any], where: str) -> str:
    mt = t.get("model_type")
    if mt in ("qwen3_5", "qwen3_5_text"):
        return "qwen3_5"
    if mt == "qwen3":
        return "qwen3"
    raise UserError(f"target model_type {mt!r} has no DFlash draft layout here", where=where,
                    hint="targets: Qwen3.5 (qwen3_5 / qwen3_5_text) or Qwen3 (qwen3)")


def match_published(target: dict[str, Any]) -> PublishedDraft | None:
    """The published draft trained for a target of this shape, if any."""
    t = text_config(target)
    arch = _target_arch(t, "target config.json")
    for p in PUBLISHED_DRAFTS:
        if (p.target_arch, p.target_hidden, p.target_layers, p.target_vocab) == (
                arch, t.get("hidden_size"), t.get("num_hidden_layers"), t.get("vocab_size")):
            return p
    return None


def _free_token_id(target_dir: Path, vocab: int) -> int:
    """The first id past every id the target's tokenizer knows: a mask id no text can produce."""
    path = target_dir / "tokenizer.json"
    if not path.is_file():
        raise UserError("the target has no tokenizer.json to choose a free mask token id from", where=str(target_dir))
    tok = _read_json(path)
    ids = list((tok.get("model") or {}).get("vocab", {}).values()) + [a["id"] for a in tok.get("added_tokens", [])]
    mask = max(ids, default=-1) + 1
    if mask >= vocab:
        raise UserError(f"the target's vocabulary ({vocab}) has no id its tokenizer leaves free for the mask token",
                        where=str(path))
    return mask


def draft_config_for(target: dict[str, Any], *, target_dir: Path | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """The config.json of a draft for this target config, in the published layout."""
    t = text_config(target)
    _target_arch(t, "target config.json")
    published = match_published(target)
    n_target = int(t["num_hidden_layers"])
    hidden = int(t["hidden_size"])
    vocab = int(t["vocab_size"])
    heads = (published and published.heads) or int(t["num_attention_heads"])
    kv_heads = (published and published.kv_heads) or int(t["num_key_value_heads"])
    head_dim = (published and published.head_dim) or int(t.get("head_dim") or hidden // int(t["num_attention_heads"]))
    inter = (published and published.intermediate) or int(t["intermediate_size"])
    rope = t.get("rope_parameters") or {}
    theta = (published and published.rope_theta) or rope.get("rope_theta", t.get("rope_theta", 1e6))
    if published is not None:
        ids = list(published.target_layer_ids)
        mask = published.mask_token_id
    else:
        ids = default_target_layer_ids(n_target)
        if target_dir is None:
            raise UserError("a draft for an unpublished target needs the target folder (for a free mask id)")
        mask = _free_token_id(target_dir, vocab)
    bad = [i for i in ids if not 0 <= i < n_target]
    if bad:
        raise UserError(f"a {n_target}-layer target is too shallow for {N_DRAFT_LAYERS} feature layers "
                        f"(target_layer_ids {ids})", where="--draft-for", hint="use a target with at least 2 layers")
    return {
        "architectures": [DRAFT_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": N_DRAFT_LAYERS,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": float(t.get("rms_norm_eps", 1e-6)),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "max_position_embeddings": int(t.get("max_position_embeddings", 32768)),
        "layer_types": ["full_attention"] * N_DRAFT_LAYERS,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "block_size": BLOCK_SIZE,
        "num_target_layers": n_target,
        "dflash_config": {"target_layer_ids": ids, "mask_token_id": mask},
        "dtype": DTYPES[dtype][2],
    }


def _draft_specs(cfg: dict[str, Any], n_layers: int, n_features: int) -> list[TensorSpec]:
    """The draft's tensors in the published names (no prefix)."""
    h = cfg["hidden_size"]
    specs = [TensorSpec("fc.weight", (h, n_features * h), "normal", 1.0 / math.sqrt(n_features * h)),
             TensorSpec("hidden_norm.weight", (h,), "norm_one", 0.1)]
    for i in range(n_layers):
        specs += qwen3_layer_specs(cfg, i, prefix="layers.")
    # The draft's output goes through the target's LM head: a final norm gain of mixed sign, as the
    # synthesiser gives a Qwen3 model, keeps the random draft's proposals from echoing its input.
    specs.append(TensorSpec("norm.weight", (h,), "normal", 1.0))
    return specs


@dataclass(frozen=True)
class DraftSynthResult:
    out_dir: Path
    files: list[str]
    n_params: int
    weight_bytes: int
    seconds: float
    published: str | None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def synthesize_draft(target_dir: Path, out_dir: Path, *, seed: int = 0, dtype: str = "bf16",
                     target_config: dict[str, Any] | None = None) -> DraftSynthResult:
    """Write a random-weight DFlash draft for the checkpoint in ``target_dir`` into ``out_dir`` (created; a draft
    already there is replaced: the command line refuses a non-empty folder without --force).

    ``target_config`` stands in for ``target_dir/config.json`` where the target has none (a synthetic GGUF,
    whose folder holds the file and its tokenizer.json: the config is its shape's)."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}", where="--dtype", hint=f"one of: {', '.join(DTYPES)}")
    target_dir = Path(target_dir)
    if target_config is not None:
        target = dict(target_config)
        config_sha256 = hashlib.sha256(json.dumps(target, sort_keys=True).encode()).hexdigest()
    elif (target_dir / "config.json").is_file():
        target = _read_json(target_dir / "config.json")
        config_sha256 = _sha256(target_dir / "config.json")
    else:
        raise UserError("no config.json: give a Hugging Face checkpoint folder", where=str(target_dir),
                        hint="for a synthetic GGUF target, name it in a config: `synth: {draft_for: TARGET}` sizes "
                             "the draft from its shape")
    config = draft_config_for(target, target_dir=target_dir, dtype=dtype)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.safetensors"):
            old.unlink()
    except OSError as exc:
        raise UserError(f"cannot write {out_dir}: {exc.strerror}", where=str(out_dir)) from None
    n_features = len(config["dflash_config"]["target_layer_ids"])
    specs = _draft_specs(config, N_DRAFT_LAYERS, n_features)
    by_name = {s.name: s for s in specs}
    esize = DTYPES[dtype][1]

    def produce(name: str) -> Iterator[np.ndarray]:
        for chunk in tensor_values(by_name[name], seed):
            yield to_dtype_bytes(chunk, dtype)

    write_safetensors(out_dir / "model.safetensors", [(s.name, s.shape) for s in specs], dtype, produce,
                      metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    published = match_published(target)
    n_params = sum(s.numel for s in specs)
    (out_dir / PROVENANCE_FILE).write_text(json.dumps({
        "generator": "lucebench models synth --draft-for",
        "lucebench_version": __version__,
        "kind": "dflash-draft",
        "target": {"path": str(target_dir.resolve()), "config_sha256": config_sha256,
                   # config.json's bytes, or the given config as sorted JSON (a synthetic GGUF's shape)
                   "config_from": "config.json" if target_config is None else "shape"},
        "layout_of": published.name if published else None,
        "seed": seed,
        "dtype": dtype,
        "scale_rule": SCALE_RULE,
        "n_params": n_params,
        "weight_bytes": n_params * esize,
    }, indent=2) + "\n", encoding="utf-8")
    return DraftSynthResult(out_dir=out_dir, files=["model.safetensors", "config.json", PROVENANCE_FILE],
                            n_params=n_params, weight_bytes=n_params * esize, seconds=time.perf_counter() - t0,
                            published=published.name if published else None)
