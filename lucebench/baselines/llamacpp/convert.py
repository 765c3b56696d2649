"""Hugging Face checkpoint -> GGUF, with llama.cpp's own tools at the pinned commit, cached by content.

F32/F16/BF16 come from the source tree's ``convert_hf_to_gguf.py`` (through ``_convert_runner.py``, which
adds only the pre-tokenizer fallback for locally trained tokenizers); quantized types (Q8_0, Q4_K_M,
Q4_0...) from ``llama-quantize`` of the same build, starting from the 16-bit file that matches the
checkpoint (BF16 for a bfloat16 checkpoint, else F16). The cache key is the sha256 of the checkpoint's
files + the llama.cpp commit + the type; a sidecar JSON next to each GGUF records how it was made.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lucebench.baselines.llamacpp.build import LlamaCppBuild
from lucebench.baselines.llamacpp.source import llamacpp_cache_dir, locate_source
from lucebench.errors import UserError

#: Types the converter writes itself.
CONVERTER_TYPES = {"f32": "f32", "f16": "f16", "bf16": "bf16"}
#: Types made by llama-quantize (our name -> llama-quantize's name).
QUANT_TYPES = {"q8_0": "Q8_0", "q4_k_m": "Q4_K_M", "q4_0": "Q4_0", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K"}
#: Pre-tokenizer name given to the converter when a locally trained tokenizer's hash is unknown.
DEFAULT_PRE_TOKENIZER = "qwen35"
_CKPT_SUFFIXES = (".json", ".safetensors", ".jinja", ".model", ".txt")
_CONVERTER_TIMEOUT_S = 3 * 3600


def _log(console: Any, msg: str) -> None:
    if console is not None:
        console.print(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


def normalize_dtype(dtype: str) -> str:
    """'BF16', 'q4_k_m', 'Q4_K_M' -> our lower-case name; UserError for types we cannot make."""
    d = dtype.strip().lower().replace("-", "_")
    if d not in CONVERTER_TYPES and d not in QUANT_TYPES:
        raise UserError(f"unsupported GGUF type {dtype!r}", where="dtype",
                        hint=f"one of {', '.join([*CONVERTER_TYPES, *QUANT_TYPES])}")
    return d


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_files(model_dir: Path) -> dict[str, str]:
    """sha256 of every file of a checkpoint folder that the converter may read (config, weights, tokenizer).

    Hashes are memoised by (path, size, mtime) in the cache so a 50 GB checkpoint is read once.
    """
    memo_path = llamacpp_cache_dir() / "checkpoint-hashes.json"
    try:
        memo: dict[str, Any] = json.loads(memo_path.read_text())
    except (OSError, json.JSONDecodeError):
        memo = {}
    out: dict[str, str] = {}
    changed = False
    for f in sorted(model_dir.iterdir()):
        if not f.is_file() or f.name.startswith(".") or not f.name.endswith(_CKPT_SUFFIXES):
            continue
        st = f.stat()
        key = str(f.resolve())
        stamp = [st.st_size, st.st_mtime_ns]
        hit = memo.get(key)
        if hit and hit.get("stamp") == stamp:
            out[f.name] = hit["sha256"]
            continue
        out[f.name] = _file_sha256(f)
        memo[key] = {"stamp": stamp, "sha256": out[f.name]}
        changed = True
    if changed:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        tmp.replace(memo_path)
    return out


def checkpoint_hash(files: dict[str, str]) -> str:
    """One hash over (file name, file sha256) pairs."""
    return hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def _checkpoint_config(model_dir: Path) -> dict[str, Any]:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise UserError("no config.json: not a Hugging Face checkpoint folder", where=str(model_dir),
                        hint="give the folder holding config.json and *.safetensors (or make one with "
                             "`lucebench models synth`)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"config.json is not valid JSON: {e}", where=str(cfg_path)) from None
    if not any(model_dir.glob("*.safetensors")):
        raise UserError("no *.safetensors weights", where=str(model_dir))
    return cfg


def base_type_for(cfg: dict[str, Any]) -> str:
    """The 16-bit GGUF type that loses nothing for this checkpoint: bf16 for bfloat16 weights, else f16."""
    dt = cfg.get("torch_dtype") or cfg.get("dtype") or (cfg.get("text_config") or {}).get("torch_dtype") \
        or (cfg.get("text_config") or {}).get("dtype")
    return "bf16" if str(dt).lower() in ("bfloat16", "bf16") else "f16"


def _source_root(build: LlamaCppBuild, console: Any) -> Path:
    # Convert with the same tree the binaries were built from: the GGUF layout must match the loader.
    if build.source_root and (Path(build.source_root) / "convert_hf_to_gguf.py").is_file():
        return Path(build.source_root)
    src = locate_source(None, console=console)
    if src.commit != build.commit:
        raise UserError(f"llama.cpp source is at {src.commit_short} but the build is {build.commit[:7]}",
                        where=str(src.root), hint="convert with the source the binaries were built from")
    return src.root


def convert_checkpoint(model_dir: Path, out: Path, *, outtype: str, source_root: Path, log: Path,
                       pre_tokenizer: str | None = DEFAULT_PRE_TOKENIZER, python: str | None = None) -> dict[str, Any]:
    """Run convert_hf_to_gguf.py of ``source_root`` on ``model_dir`` writing ``out``; return the runner report.

    Raises UserError (with the converter's log path and tail) when the converter fails.
    """
    report_path = out.with_suffix(".convert.json")
    runner = Path(__file__).with_name("_convert_runner.py")
    argv = [python or sys.executable, str(runner), "--src", str(source_root), "--report", str(report_path)]
    if pre_tokenizer:
        argv += ["--pre-tokenizer", pre_tokenizer]
    # --no-mtp: the converter otherwise expects Qwen3.5's multi-token-prediction block (mtp.* tensors, which
    # transformers' Qwen3_5ForCausalLM never saves) and appends it as an extra layer. Our engines do not use
    # MTP, so the baseline runs exactly the weights they run.
    argv += ["--", str(model_dir), "--outfile", str(out), "--outtype", outtype, "--no-mtp"]
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # the tree's gguf-py must win over any installed gguf
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        try:
            r = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=_CONVERTER_TIMEOUT_S,
                               check=False)
        except subprocess.TimeoutExpired:
            raise UserError(f"convert_hf_to_gguf.py timed out; log: {log}", where=str(model_dir)) from None
    if r.returncode != 0 or not out.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise UserError(f"convert_hf_to_gguf.py failed (exit {r.returncode}); log: {log}\n{tail}", where=str(model_dir),
                        hint="is this a Qwen3.5 / supported Hugging Face checkpoint with a tokenizer?")
    try:
        report = json.loads(report_path.read_text())
    except (OSError, json.JSONDecodeError):
        report = {}
    report["argv"] = argv
    return report


def quantize_gguf(src: Path, out: Path, *, qtype: str, build: LlamaCppBuild, log: Path,
                  threads: int | None = None) -> list[str]:
    """Quantize a 16-bit GGUF to ``qtype`` (our name, e.g. 'q4_k_m') with llama-quantize; return its argv."""
    argv = [str(build.binary("llama-quantize")), str(src), str(out), QUANT_TYPES[qtype], str(threads or os.cpu_count() or 1)]
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        r = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if r.returncode != 0 or not out.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise UserError(f"llama-quantize to {QUANT_TYPES[qtype]} failed (exit {r.returncode}); log: {log}\n{tail}",
                        where=str(src))
    return argv


def gguf_dir_for(model_dir: Path, build: LlamaCppBuild) -> tuple[Path, dict[str, str]]:
    """The cache folder for this checkpoint (by content) and llama.cpp commit, and the checkpoint file hashes."""
    files = checkpoint_files(model_dir)
    return llamacpp_cache_dir() / "gguf" / f"{checkpoint_hash(files)[:16]}-{build.commit[:7]}", files


def prepare_gguf(model_dir: Path, *, dtype: str, build: LlamaCppBuild, console: Any = None,
                 pre_tokenizer: str | None = DEFAULT_PRE_TOKENIZER) -> Path:
    """The GGUF of ``model_dir`` at ``dtype`` ('f16', 'bf16', 'q8_0', 'q4_k_m', ...), converted on first use.

    Conversion uses the converter of the tree ``build`` came from and, for quantized types,
    ``build``'s llama-quantize. The file is cached by checkpoint content + commit + type; its sidecar
    ``<file>.json`` records the checkpoint hashes, commit, tool argv and the pre-tokenizer used.
    """
    model_dir = Path(model_dir).expanduser()
    if not model_dir.is_dir():
        raise UserError(f"model folder not found: {model_dir}", where="model",
                        hint="give a Hugging Face checkpoint folder (config.json + *.safetensors)")
    d = normalize_dtype(dtype)
    cfg = _checkpoint_config(model_dir)
    out_dir, files = gguf_dir_for(model_dir, build)
    out = out_dir / f"model-{d}.gguf"
    meta_path = out.with_suffix(".gguf.json")
    if out.is_file() and meta_path.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / f"model-{d}.log"
    log.write_text("")
    record: dict[str, Any] = {"checkpoint": str(model_dir), "checkpoint_files": files, "commit": build.commit,
                              "dtype": d, "architectures": cfg.get("architectures")}
    t0 = time.monotonic()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    if d in CONVERTER_TYPES:
        _log(console, f"llama.cpp: converting {model_dir} to GGUF {d.upper()}")
        report = convert_checkpoint(model_dir, tmp, outtype=CONVERTER_TYPES[d], source_root=_source_root(build, console),
                                    log=log, pre_tokenizer=pre_tokenizer)
        record["converter"] = report
    else:
        base = base_type_for(cfg)
        base_path = prepare_gguf(model_dir, dtype=base, build=build, console=console, pre_tokenizer=pre_tokenizer)
        _log(console, f"llama.cpp: quantizing {base_path.name} to {QUANT_TYPES[d]}")
        record["quantized_from"] = {"file": base_path.name, "dtype": base}
        record["quantize_argv"] = quantize_gguf(base_path, tmp, qtype=d, build=build, log=log)
    tmp.replace(out)
    for side in (tmp.with_suffix(".convert.json"),):
        if side.exists():
            side.unlink()
    record["seconds"] = round(time.monotonic() - t0, 2)
    record["gguf_sha256"] = _file_sha256(out)
    record["gguf_bytes"] = out.stat().st_size
    meta_path.write_text(json.dumps(record, indent=1) + "\n")
    return out


def gguf_metadata(path: Path, *, source_root: Path | None = None) -> dict[str, Any]:
    """Architecture, sizes and type of a GGUF file for the ready line (via the gguf reader, memory-mapped).

    Uses the installed ``gguf`` package, else the ``gguf-py`` of ``source_root`` (GPU images may lack the
    package); falls back to the file size alone when neither is importable.
    """
    info: dict[str, Any] = {"weight_bytes": path.stat().st_size}
    try:
        from gguf import GGUFReader  # type: ignore[import-untyped]
    except ImportError:
        if source_root is None or not (source_root / "gguf-py").is_dir():
            return info
        sys.path.append(str(source_root / "gguf-py"))
        try:
            from gguf import GGUFReader  # type: ignore[import-untyped]
        except ImportError:
            return info
    r = GGUFReader(str(path))

    def field(name: str) -> Any:
        f = r.fields.get(name)
        if f is None:
            return None
        try:
            return f.contents()
        except (AttributeError, ValueError, IndexError):
            return None

    arch = field("general.architecture")
    info["arch"] = arch
    if arch:
        info["n_layers"] = field(f"{arch}.block_count")
        info["hidden_size"] = field(f"{arch}.embedding_length")
        info["max_ctx"] = field(f"{arch}.context_length")
    toks = r.fields.get("tokenizer.ggml.tokens")
    info["vocab_size"] = len(toks.data) if toks is not None else None
    info["n_params"] = int(sum(int(t.n_elements) for t in r.tensors))
    info["file_type"] = field("general.file_type")
    return info
