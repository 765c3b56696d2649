"""Synthetic checkpoints: random weights in Hugging Face layout, deterministic by seed, streamed to disk.

``synthesize(shape, out_dir, seed=..., dtype=..., layout=...)`` writes config.json, the safetensors
shard(s) (with model.safetensors.index.json when sharded), generation_config.json, tokenizer.json,
tokenizer_config.json and the provenance file lucebench_synth.json. Every tensor is drawn from its own
generator seeded by (seed, tensor name), so a tensor's values do not depend on sharding or order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebench import __version__
from lucebench.errors import UserError
from lucebench.models.safetensors_stream import DTYPES, to_dtype_bytes, write_safetensors
from lucebench.models.shapes import Shape
from lucebench.models.tokenizer import build_tokenizer_json, tokenizer_config
from lucebench.models.weights import SCALE_RULE, TensorSpec, multimodal_name, tensor_specs

PROVENANCE_FILE = "lucebench_synth.json"
DEFAULT_SHARD_BYTES = 4 * 1024**3
LAYOUTS = ("text", "multimodal")
_CHUNK = 1 << 22  # elements drawn per numpy call: 16 MiB of float32


@dataclass(frozen=True)
class SynthResult:
    """What :func:`synthesize` wrote."""

    out_dir: Path
    files: list[str]
    n_params: int
    weight_bytes: int
    seconds: float


def _tensor_rng(seed: int, name: str) -> np.random.Generator:
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, digest])))


def tensor_values(spec: TensorSpec, seed: int) -> Iterator[np.ndarray]:
    """The float32 values of one synthetic tensor, in row-major chunks (see the scale rule in weights.py)."""
    rng = _tensor_rng(seed, spec.name)
    remaining = spec.numel
    while remaining > 0:
        n = min(remaining, _CHUNK)
        remaining -= n
        if spec.init == "normal":
            x = rng.standard_normal(n, dtype=np.float32)
            x *= np.float32(spec.std)
            if spec.mean:
                x += np.float32(spec.mean)
        elif spec.init == "norm_zero":
            x = rng.standard_normal(n, dtype=np.float32) * np.float32(spec.std)
        elif spec.init == "norm_one":
            x = np.float32(1.0) + rng.standard_normal(n, dtype=np.float32) * np.float32(spec.std)
        elif spec.init == "a_log":
            x = np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
        elif spec.init == "dt_bias":
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
            x = (dt + np.log(-np.expm1(-dt))).astype(np.float32)  # inverse softplus
        else:
            raise ValueError(f"unknown init {spec.init}")
        yield x


def _plan_shards(specs: list[TensorSpec], esize: int, shard_bytes: int) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec.numel * esize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def _multimodal_config(text_cfg: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    text = dict(text_cfg)
    text.pop("architectures", None)
    text["dtype"] = dtype_name
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        # A placeholder vision tower: its weights are not written (lucebench measures the text model).
        "vision_config": {
            "model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": text["hidden_size"], "num_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
        },
        "image_token_id": 248056, "video_token_id": 248057,
        "vision_start_token_id": 248053, "vision_end_token_id": 248054,
        "tie_word_embeddings": text.get("tie_word_embeddings", False),
        "dtype": dtype_name,
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def synthesize(
    shape: Shape,
    out_dir: Path,
    *,
    seed: int = 0,
    dtype: str = "bf16",
    layout: str = "text",
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Callable[[str, int, int], None] | None = None,
) -> SynthResult:
    """Write a synthetic checkpoint of ``shape`` into ``out_dir`` (created; existing files are replaced).

    ``progress(tensor_name, bytes_done, bytes_total)`` is called after each tensor. Raises UserError for a
    bad dtype/layout or an unwritable folder.
    """
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}", where="--dtype", hint=f"one of: {', '.join(DTYPES)}")
    if layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}", where="--layout", hint="text or multimodal")
    if layout == "multimodal" and shape.arch != "qwen3_5":
        raise UserError(f"the multimodal layout exists only for Qwen3.5 shapes, not {shape.name}", where="--layout",
                        hint="use --layout text")
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in list(out_dir.glob("*.safetensors")) + [out_dir / "model.safetensors.index.json"]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write {out_dir}: {exc.strerror}", where=str(out_dir)) from None

    _, esize, dtype_name = DTYPES[dtype]
    specs = tensor_specs(shape.config)
    by_name = {s.name: s for s in specs}
    rename = multimodal_name if layout == "multimodal" else (lambda n: n)
    file_name_of = {rename(s.name): s.name for s in specs}
    total = sum(s.numel for s in specs) * esize

    shards = _plan_shards(specs, esize, shard_bytes)
    files: list[str] = []
    weight_map: dict[str, str] = {}
    done = 0

    def produce(stored_name: str) -> Iterator[np.ndarray]:
        nonlocal done
        spec = by_name[file_name_of[stored_name]]
        for chunk in tensor_values(spec, seed):
            yield to_dtype_bytes(chunk, dtype)
        done += spec.numel * esize
        if progress is not None:
            progress(stored_name, done, total)

    for k, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        entries = [(rename(s.name), s.shape) for s in shard]
        write_safetensors(out_dir / fname, entries, dtype, produce, metadata={"format": "pt"})
        files.append(fname)
        weight_map.update({name: fname for name, _ in entries})
    if len(shards) > 1:
        _write_json(out_dir / "model.safetensors.index.json",
                    {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
        files.append("model.safetensors.index.json")

    text_cfg = dict(shape.config, dtype=dtype_name)
    config = _multimodal_config(shape.config, dtype_name) if layout == "multimodal" else text_cfg
    _write_json(out_dir / "config.json", config)
    sp = shape.special_ids
    _write_json(out_dir / "generation_config.json", {
        "bos_token_id": shape.config.get("bos_token_id"),
        "eos_token_id": shape.eos_ids,
        "pad_token_id": sp["<|endoftext|>"],
        # Greedy by default: a benchmark comparison must never sample silently.
        "do_sample": False,
    })
    tok_json = build_tokenizer_json(shape.bpe_vocab, sp)
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    _write_json(out_dir / "tokenizer_config.json",
                tokenizer_config(sp, model_max_length=int(shape.config.get("max_position_embeddings", 32768))))
    n_params = total // esize
    _write_json(out_dir / PROVENANCE_FILE, {
        "generator": "lucebench models synth",
        "lucebench_version": __version__,
        "shape": shape.name,
        "shape_source": shape.source,
        "seed": seed,
        "dtype": dtype,
        "layout": layout,
        "scale_rule": SCALE_RULE,
        "n_params": n_params,
        "weight_bytes": total,
        "tokenizer": {"bpe_vocab": shape.bpe_vocab, "special_ids": sp,
                      "unknown_ids": "ids the tokenizer lacks decode to the empty string"},
    })
    files += ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", PROVENANCE_FILE]
    return SynthResult(out_dir=out_dir, files=files, n_params=n_params, weight_bytes=total,
                       seconds=time.perf_counter() - t0)


def synthesize_atomic(shape: Shape, out_dir: Path, **kwargs: Any) -> SynthResult:
    """:func:`synthesize` into a temporary sibling folder, renamed into place when complete, so that an
    interrupted run never leaves a half-written checkpoint where a cache expects a whole one."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        result = synthesize(shape, tmp, **kwargs)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return SynthResult(out_dir=out_dir, files=result.files, n_params=result.n_params,
                       weight_bytes=result.weight_bytes, seconds=result.seconds)
