"""DFlash drafts as GGUF files, in the layout of Lucebox's converter (the drafts it publishes as F16, Q8_0
and Q4_K_M GGUFs): ``lucebench models convert-draft`` writes one from a z-lab safetensors draft.

The layout (what lucebench-dflash reads, engines/dflash/draft_model.cpp):

* architecture ``qwen35-dflash-draft``; the config in ``qwen35-dflash-draft.*`` keys: ``embedding_length``
  (hidden), ``block_count`` (draft layers), ``feed_forward_length``, ``attention.head_count`` /
  ``head_count_kv`` / ``key_length`` / ``value_length`` (head_dim), ``attention.layer_norm_rms_epsilon``,
  ``rope.freq_base``, ``context_length``, ``vocab_size``, and ``dflash.n_target_layers`` (the number of
  target layers whose features ``fc`` takes, not the target's depth), ``dflash.block_size``,
  ``dflash.mask_token_id``, ``dflash.target_layer_ids``; sliding-window drafts add
  ``attention.sliding_window`` and ``attention.sliding_window_pattern`` (one bool per layer);
* tensors ``dflash.fc.weight``, ``dflash.hidden_norm.weight``, ``output_norm.weight`` and per layer
  ``blk.N.{attn_norm, ffn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_gate,
  ffn_up, ffn_down}.weight`` (:data:`LAYER_NAMES`), shapes as in the safetensors (GGUF's ne[] reversed);
* norms in F32 holding the same gain the safetensors hold (the draft's RMSNorm multiplies by it: no
  ``1 + w`` shift as llama.cpp's Qwen3.5 target converter applies); matrices in the chosen type.

Types (``--type``): ``bf16`` (default; exact for z-lab's BF16 drafts), ``f16`` (what Lucebox's first
converter wrote: BF16 rounded to F16), ``f32``, ``q8_0`` (ggml's reference quantiser, via ``gguf.quants``).
Q4_K_M files come from llama.cpp's ``llama-quantize`` on a BF16/F16 file; the engine reads them too.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebench import __version__
from lucebench.errors import UserError
from lucebench.models.dflash_draft import DraftConfig, safetensors_header
from lucebench.models.safetensors_stream import to_dtype_bytes

GGUF_ARCH = "qwen35-dflash-draft"
TYPES = ("bf16", "f16", "f32", "q8_0")
SINGLETONS = {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
              "norm.weight": "output_norm.weight"}
# z-lab's per-layer names -> the GGUF's (llama.cpp's names for a Qwen3 layer)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# config.json keys that change what the draft computes and that the GGUF layout cannot say
_NO_GGUF_KEY = {"input_embedding_scale": 1, "output_multiplier": 1, "final_logit_softcapping": 0}
# llama_ftype of the file (llama.h)
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}


def gguf_name(name: str) -> str:
    """The GGUF name of a z-lab draft tensor name."""
    if name in SINGLETONS:
        return SINGLETONS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise ValueError(f"not a DFlash draft tensor: {name}")


def is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def read_safetensors_draft(folder: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of a safetensors draft folder as float32 (BF16, F16 and F32 widen exactly)."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        header = safetensors_header(path)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name, info in header.items():
            begin, end = info["data_offsets"]
            raw = np.asarray(data[begin:end])
            dt = info["dtype"]
            if dt == "BF16":
                x = (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
            elif dt == "F16":
                x = raw.view(np.float16).astype(np.float32)
            elif dt == "F32":
                x = raw.view(np.float32).copy()
            else:
                raise UserError(f"tensor {name} has dtype {dt} (a draft is BF16, F16 or F32)", where=str(path))
            yield name, x.reshape(info["shape"])


def _ggml_type(name: str, wtype: str):
    import gguf

    if is_norm(name) or wtype == "f32":
        return gguf.GGMLQuantizationType.F32
    return gguf.GGMLQuantizationType[wtype.upper()]


def encode(x: np.ndarray, qtype) -> np.ndarray:
    """float32 values in a GGUF type, as the array GGUFWriter.add_tensor takes (ggml's own rounding)."""
    import gguf

    T = gguf.GGMLQuantizationType
    if qtype == T.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if qtype == T.F16:
        return x.astype(np.float16)
    if qtype == T.BF16:
        return to_dtype_bytes(x, "bf16").reshape(x.shape)
    return gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), qtype)


def gguf_metadata(cfg: DraftConfig, context_length: int) -> dict[str, tuple[str, Any]]:
    """The `<arch>.*` keys of a draft with this config: key -> (GGUFWriter method suffix, value)."""
    a = GGUF_ARCH
    keys: dict[str, tuple[str, Any]] = {
        f"{a}.context_length": ("uint32", context_length),
        f"{a}.embedding_length": ("uint32", cfg.hidden_size),
        f"{a}.block_count": ("uint32", cfg.num_hidden_layers),
        f"{a}.feed_forward_length": ("uint32", cfg.intermediate_size),
        f"{a}.attention.head_count": ("uint32", cfg.num_attention_heads),
        f"{a}.attention.head_count_kv": ("uint32", cfg.num_key_value_heads),
        f"{a}.attention.key_length": ("uint32", cfg.head_dim),
        f"{a}.attention.value_length": ("uint32", cfg.head_dim),
        f"{a}.vocab_size": ("uint32", cfg.vocab_size),
        f"{a}.attention.layer_norm_rms_epsilon": ("float32", cfg.rms_norm_eps),
        f"{a}.rope.freq_base": ("float32", cfg.rope_theta),
        f"{a}.dflash.n_target_layers": ("uint32", len(cfg.target_layer_ids)),
        f"{a}.dflash.block_size": ("uint32", cfg.block_size),
        f"{a}.dflash.mask_token_id": ("uint32", cfg.mask_token_id),
        f"{a}.dflash.target_layer_ids": ("array", [int(i) for i in cfg.target_layer_ids]),
    }
    if "sliding_attention" in cfg.layer_types:
        keys[f"{a}.attention.sliding_window"] = ("uint32", int(cfg.sliding_window or 0))
        keys[f"{a}.attention.sliding_window_pattern"] = ("array", [t == "sliding_attention" for t in cfg.layer_types])
    return keys


def write_draft_gguf(path: Path, cfg: DraftConfig, tensors: dict[str, tuple[np.ndarray, Any]], *,
                     name: str, file_type: int | None, context_length: int = 32768,
                     keys: dict[str, tuple[str, Any]] | None = None, extra: dict[str, str] | None = None) -> None:
    """Write a GGUF draft: `tensors` maps z-lab names to (array as GGUFWriter takes it, GGMLQuantizationType),
    written in the converter's order (the DFlash singletons, the final norm, then layer by layer). `keys`:
    the `<arch>.*` keys (default: gguf_metadata's); `extra`: more string keys."""
    import gguf

    want = set(cfg.tensor_shapes())
    if set(tensors) != want:
        missing, extra_t = sorted(want - set(tensors)), sorted(set(tensors) - want)
        raise ValueError(f"draft tensors: missing {missing}, unexpected {extra_t}")
    w = gguf.GGUFWriter(str(path), GGUF_ARCH)
    w.add_name(name)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, (kind, value) in (gguf_metadata(cfg, context_length) if keys is None else keys).items():
        getattr(w, f"add_{kind}")(key, value)
    for key, value in (extra or {}).items():
        w.add_string(key, value)

    def order(n: str) -> tuple:
        if n in SINGLETONS:
            return (0, list(SINGLETONS).index(n))
        layer = int(n.split(".")[1])
        return (1, layer, list(LAYER_NAMES).index(n.split(".", 2)[2]))

    for n in sorted(tensors, key=order):
        arr, qtype = tensors[n]
        w.add_tensor(gguf_name(n), arr, raw_dtype=None if qtype in (gguf.GGMLQuantizationType.F32,
                                                                      gguf.GGMLQuantizationType.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@dataclass(frozen=True)
class ConvertResult:
    path: Path
    types: dict[str, int]  # GGUF type name -> tensor count
    n_params: int
    file_bytes: int
    seconds: float


def convert_draft(src: Path, out: Path, *, wtype: str = "bf16") -> ConvertResult:
    """Convert the z-lab safetensors draft in folder `src` into the GGUF file `out` (replaced if there)."""
    import gguf

    from lucebench.models.dflash_draft import _read_json, check_draft

    if wtype not in TYPES:
        raise UserError(f"unknown type {wtype!r}", where="--type", hint=f"one of: {', '.join(TYPES)}")
    src = Path(src)
    if not src.is_dir():
        raise UserError("not a folder: give the safetensors draft's folder (config.json + *.safetensors)",
                        where=str(src))
    cfg = check_draft(src)
    raw = _read_json(src / "config.json")
    nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}

    def key(k: str) -> Any:
        return nested.get(k, raw.get(k))

    for k, default in _NO_GGUF_KEY.items():
        if key(k) is not None and key(k) != default:
            raise UserError(f"`{k}` is {key(k)!r}, which the GGUF draft layout cannot say (it assumes {default})",
                            where=str(src / "config.json"))
    causal = key("is_causal")
    if causal is not None and [bool(causal)] * cfg.num_hidden_layers != [
            t == "sliding_attention" for t in cfg.layer_types]:
        raise UserError("`is_causal` differs from the default (causal on the sliding layers only), which the GGUF "
                        "layout cannot say", where=str(src / "config.json"))
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise UserError(f"rope type {rope.get('rope_type', rope.get('type'))!r} (the GGUF layout has plain RoPE)",
                        where=str(src / "config.json"))
    if "rope_theta" not in rope and "rope_theta" not in raw:
        raise UserError("config.json gives no rope_theta", where=str(src / "config.json"),
                        hint="the engine would assume 10000 (transformers' default); add the draft's value")
    # parse_draft_config's rule, read here as the engine reads it: rope_parameters' theta over the top level.
    theta = float(rope.get("rope_theta", raw.get("rope_theta")))
    cfg = dataclasses.replace(cfg, rope_theta=theta)

    t0 = time.perf_counter()
    tensors: dict[str, tuple[np.ndarray, Any]] = {}
    types: dict[str, int] = {}
    n_params = 0
    for name, x in read_safetensors_draft(src):
        qtype = _ggml_type(name, wtype)
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if x.shape[-1] % block:
            raise UserError(f"{name} has rows of {x.shape[-1]} values, not a multiple of {qtype.name}'s block of "
                            f"{block}", where="--type", hint="use bf16, f16 or f32")
        enc = encode(x, qtype)
        if qtype == gguf.GGMLQuantizationType.F16 and not np.isfinite(enc).all():
            raise UserError(f"{name} has values beyond f16's range", where="--type", hint="use bf16")
        tensors[name] = (enc, qtype)
        types[qtype.name] = types.get(qtype.name, 0) + 1
        n_params += x.size
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        write_draft_gguf(out, cfg, tensors, name=f"DFlash draft {src.name} ({wtype})", file_type=_FILE_TYPE[wtype],
                         context_length=int(raw.get("max_position_embeddings") or 32768),
                         extra={"lucebench.converted_by": f"lucebench {__version__} models convert-draft",
                                "lucebench.source_config": json.dumps(raw, sort_keys=True)})
    except OSError as exc:
        raise UserError(f"cannot write: {exc.strerror}", where=str(out)) from None
    return ConvertResult(path=out, types=types, n_params=n_params, file_bytes=out.stat().st_size,
                         seconds=time.perf_counter() - t0)


def decoded_draft(path: Path, cfg: DraftConfig) -> dict[str, tuple[np.ndarray, Any]]:
    """A GGUF draft's tensors decoded to float32 by gguf-py (ggml's dequantisation), under z-lab names, as
    write_draft_gguf takes them: the F32 file of these is the reference a quantised draft is checked against."""
    import gguf

    by_name = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    out = {}
    for name, shape in cfg.tensor_shapes().items():
        t = by_name[gguf_name(name)]
        x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        out[name] = (x.reshape(shape), gguf.GGMLQuantizationType.F32)
    return out


def read_gguf_draft(path: Path) -> dict[str, Any]:
    """The `<arch>.*` metadata of a GGUF draft (keys without the prefix), or a UserError when the file is no
    DFlash draft."""
    import gguf

    try:
        r = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"not a readable GGUF file: {exc}", where=str(path)) from None
    field = r.fields.get("general.architecture")
    arch = field.contents() if field is not None else None
    prefix = f"{arch}."
    meta = {k[len(prefix):]: f.contents() for k, f in r.fields.items() if k.startswith(prefix)}
    if "dflash.mask_token_id" not in meta:
        raise UserError(f"not a DFlash draft: architecture {arch!r} has no {prefix}dflash.* keys", where=str(path))
    return meta


def check_gguf_draft(path: Path, target_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A GGUF draft's metadata, checked against the target's text config where given (hidden size, target
    layers inside its depth, mask id inside its vocabulary): one UserError naming the mismatch. The engine
    checks the rest (keys, tensors, shapes) when it loads the file."""
    from lucebench.models.dflash_draft import text_config

    meta = read_gguf_draft(path)
    if target_config is None:
        return meta
    t = text_config(target_config)
    if meta.get("embedding_length") != t.get("hidden_size"):
        raise UserError(f"the draft's hidden size is {meta.get('embedding_length')}, the target's "
                        f"{t.get('hidden_size')}", where=str(path))
    ids = meta.get("dflash.target_layer_ids") or []
    bad = [i for i in ids if not 0 <= int(i) < int(t.get("num_hidden_layers", 0))]
    if bad:
        raise UserError(f"target_layer_ids {bad} are outside the target's {t.get('num_hidden_layers')} layers",
                        where=str(path))
    if not 0 <= int(meta["dflash.mask_token_id"]) < int(t.get("vocab_size", 0)):
        raise UserError(f"mask_token_id {meta['dflash.mask_token_id']} is outside the target's vocabulary of "
                        f"{t.get('vocab_size')}", where=str(path))
    return meta
