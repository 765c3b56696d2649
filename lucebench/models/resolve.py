"""Resolve a config's model spec to a local folder (or file), and hash model files with a memo.

A model is given as ``{path: DIR_OR_FILE}``, ``{hub: REPO_ID, revision?: R}`` (looked up in the standard
Hugging Face cache, never downloaded here: ``lucebench models fetch`` does that), or
``{synth: {shape|config, seed, dtype, layout?}}`` (written on first use under the lucebench cache and
reused after).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lucebench.errors import UserError

ENV_CACHE = "LUCEBENCH_CACHE"
HASH_MEMO_FILE = "file-hashes.json"
_HASH_BLOCK = 1 << 24  # 16 MiB reads


def cache_root() -> Path:
    """The lucebench cache root: ``$LUCEBENCH_CACHE`` or ``~/.cache/lucebench``."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lucebench"


def models_cache_dir() -> Path:
    """Where synthetic checkpoints are kept: ``<cache root>/models``."""
    return cache_root() / "models"


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: its local path and where it came from."""

    path: Path
    kind: str  # path | hub | synth
    name: str
    synthetic: bool = False
    repo_id: str | None = None
    revision: str | None = None
    synth: dict[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The model's config.json ({} for a single-file model such as a GGUF)."""
        cfg = self.path / "config.json"
        if not cfg.is_file():
            return {}
        return json.loads(cfg.read_text(encoding="utf-8"))


def _as_dict(spec: Any) -> dict[str, Any]:
    if hasattr(spec, "model_dump"):  # a pydantic ModelSource
        return spec.model_dump(exclude_none=True)
    if isinstance(spec, (str, os.PathLike)):
        return {"path": str(spec)}
    if not isinstance(spec, dict):
        raise UserError(f"a model must be a mapping with path, hub or synth, not {type(spec).__name__}")
    return {k: v for k, v in spec.items() if v is not None}


def resolve_model(spec: Any, *, console: Any = None) -> ResolvedModel:
    """Resolve ``spec`` (dict or pydantic ModelSource with exactly one of path / hub / synth) to a local model.

    Synthetic models are written on first use (progress on ``console``, a rich Console, if given).
    Raises UserError naming what is missing and how to get it.
    """
    d = _as_dict(spec)
    given = [k for k in ("path", "hub", "synth") if k in d]
    if len(given) != 1:
        raise UserError(f"a model needs exactly one of path, hub or synth (got {given or 'none'})")
    if "path" in d:
        return _resolve_path(str(d["path"]))
    if "hub" in d:
        if d.get("file"):
            return _resolve_hub_file(str(d["hub"]), str(d["file"]), d.get("revision"))
        return _resolve_hub(str(d["hub"]), d.get("revision"))
    return _resolve_synth(dict(d["synth"]), console=console)


def fetch_command(repo_id: str, revision: str | None = None, include: list[str] | None = None) -> str:
    """The `lucebench models fetch` command line that puts a repository (or some of its files) in the cache."""
    return (f"lucebench models fetch {repo_id}" + (f" --revision {revision}" if revision else "")
            + "".join(f" --include {shlex.quote(pattern)}" for pattern in include or []))


def _resolve_hub_file(repo_id: str, filename: str, revision: str | None) -> ResolvedModel:
    """One file of a hub repository (a GGUF checkpoint), from the cache only."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        local = hf_hub_download(repo_id, filename, revision=revision, local_files_only=True)
    except HFValidationError as exc:
        raise UserError(f"{repo_id!r} is not a valid hub repository id: {exc}", where="model.hub") from None
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        raise UserError(f"{filename} of {repo_id} is not in the Hugging Face cache", where="model.file",
                        hint=f"download it with `{fetch_command(repo_id, revision, [filename])}`") from None
    path = Path(local)  # the snapshot's link, which keeps the file's name (a blob is named by its hash)
    return ResolvedModel(path=path, kind="hub", name=f"{repo_id}/{filename}", repo_id=repo_id,
                         revision=revision or path.parent.name)


def resolve_tokenizer(source: str) -> Path:
    """The folder holding tokenizer.json named by a model's `tokenizer:` (a local folder or a cached hub repo)."""
    local = Path(source).expanduser()
    if local.is_dir():
        folder = local
    else:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

        try:
            folder = Path(snapshot_download(source, local_files_only=True))
        except HFValidationError:
            raise UserError(f"tokenizer {source!r} is neither a folder nor a hub repository id",
                            where="model.tokenizer") from None
        except (LocalEntryNotFoundError, FileNotFoundError, OSError):
            raise UserError(f"tokenizer {source} is not in the Hugging Face cache", where="model.tokenizer",
                            hint=f"download it with `{fetch_command(source, None, TOKENIZER_FILES)}`") from None
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"tokenizer {source}: {folder} has no tokenizer.json", where="model.tokenizer",
                        hint=f"download it with `{fetch_command(source, None, TOKENIZER_FILES)}`")
    return folder


# What a tokenizer-only download of a hub repository fetches (the tokenizer, its config, the chat template).
TOKENIZER_FILES = ["tokenizer*", "*.jinja", "config.json", "generation_config.json"]


def _resolve_path(raw: str) -> ResolvedModel:
    path = Path(raw).expanduser()
    if not path.exists():
        raise UserError(f"model path {raw} does not exist", where="model.path",
                        hint="give a Hugging Face checkpoint folder or a .gguf file; "
                             "`lucebench models synth --shape tiny --out DIR` makes a test model")
    if path.is_dir() and not (path / "config.json").is_file():
        raise UserError(f"{raw} has no config.json: not a Hugging Face checkpoint folder", where="model.path")
    path = path.resolve()
    return ResolvedModel(path=path, kind="path", name=path.name,
                         synthetic=path.is_dir() and (path / "lucebench_synth.json").is_file())


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _resolve_hub(repo_id: str, revision: str | None) -> ResolvedModel:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    fetch_cmd = f"lucebench models fetch {repo_id}" + (f" --revision {revision}" if revision else "")
    try:
        # Never downloads: a run must not start a multi-GB transfer by surprise; `models fetch` does that.
        local = snapshot_download(repo_id, revision=revision, local_files_only=True)
    except HFValidationError as exc:
        raise UserError(f"{repo_id!r} is not a valid hub repository id: {exc}", where="model.hub") from None
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        rev = f" at revision {revision}" if revision else ""
        raise UserError(f"{repo_id}{rev} is not in the Hugging Face cache", where="model.hub",
                        hint=f"download it with `{fetch_cmd}`") from None
    path = Path(local)
    if not (path / "config.json").is_file():
        raise UserError(f"the cached snapshot of {repo_id} has no config.json", where="model.hub",
                        hint=f"re-download it with `{fetch_cmd}`")
    return ResolvedModel(path=path, kind="hub", name=repo_id, repo_id=repo_id,
                         revision=revision or path.name)


def synth_cache_key(shape: Any, seed: int, dtype: str, layout: str) -> str:
    """A folder name that changes whenever the shape, tokenizer ids, scale rule or inputs change."""
    from lucebench.models.weights import SCALE_RULE

    blob = json.dumps({"config": shape.config, "special": shape.special_ids, "bpe": shape.bpe_vocab,
                       "rule": SCALE_RULE, "seed": seed, "dtype": dtype, "layout": layout}, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in shape.name)
    return f"synth-{safe}-s{seed}-{dtype}-{layout}-{digest}"


def _synth_is_current(provenance: Path) -> bool:
    """Whether a cached synthetic checkpoint exists and was written under the current scale rule (the cache
    key already hashes the rule; this also catches a folder copied or renamed into place by hand)."""
    from lucebench.models.weights import SCALE_RULE

    try:
        return json.loads(provenance.read_text(encoding="utf-8")).get("scale_rule") == SCALE_RULE
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def synth_shape(s: dict[str, Any]) -> Any:
    """The Shape a ``synth:`` mapping names (``shape`` or ``config``): what its checkpoint is written from."""
    from lucebench.models.shapes import get_shape, shape_from_config

    if ("shape" in s) == ("config" in s):
        raise UserError("a synth model needs exactly one of shape or config", where="model.synth")
    if "shape" in s:
        return get_shape(str(s["shape"]))
    cfg_path = Path(str(s["config"])).expanduser()
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read {cfg_path}: {exc.strerror}", where="model.synth.config") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg_path} is not JSON: {exc}", where="model.synth.config") from None
    return shape_from_config(cfg, name=cfg_path.stem, where=str(cfg_path))


def _resolve_synth(s: dict[str, Any], *, console: Any = None) -> ResolvedModel:
    from lucebench.models.synth import PROVENANCE_FILE, synthesize_atomic

    shape = synth_shape(s)
    seed = int(s.get("seed", 0))
    if s.get("format", "hf") == "gguf":
        return _resolve_synth_gguf(shape, seed, str(s.get("quant", "q4_k_m")), console=console)
    dtype = str(s.get("dtype", "bf16"))
    layout = str(s.get("layout", "text"))
    out = models_cache_dir() / synth_cache_key(shape, seed, dtype, layout)
    if not _synth_is_current(out / PROVENANCE_FILE):
        if console is not None:
            console.print(f"writing synthetic model {shape.name} (seed {seed}, {dtype}) to {out}")
        synthesize_atomic(shape, out, seed=seed, dtype=dtype, layout=layout)
    return ResolvedModel(path=out, kind="synth", name=f"synth:{shape.name}", synthetic=True,
                         synth={"shape": shape.name, "seed": seed, "dtype": dtype, "layout": layout})


def _resolve_synth_gguf(shape: Any, seed: int, quant: str, *, console: Any = None) -> ResolvedModel:
    """A synthetic llama.cpp GGUF (`models synth --format gguf`), written on first use into the models cache
    (a folder with the file, its tokenizer.json and provenance); the model is the file."""
    from lucebench.models.gguf_synth import synthesize_gguf
    from lucebench.models.synth import PROVENANCE_FILE

    out = models_cache_dir() / synth_cache_key(shape, seed, quant, "gguf")
    path = out / f"model-{quant}.gguf"
    try:
        current = json.loads((out / PROVENANCE_FILE).read_text(encoding="utf-8")).get("quant") == quant
    except (OSError, json.JSONDecodeError, AttributeError):
        current = False
    if not (current and path.is_file() and (out / "tokenizer.json").is_file()):
        if console is not None:
            console.print(f"writing synthetic model {shape.name} (seed {seed}, {quant} GGUF) to {out}")
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:  # into a sibling first, so an interrupted write never looks whole
            synthesize_gguf(shape, tmp, quant=quant, seed=seed)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ResolvedModel(path=path, kind="synth", name=f"synth:{shape.name}", synthetic=True,
                         synth={"shape": shape.name, "seed": seed, "format": "gguf", "quant": quant})


def resolve_draft_synth(target: Path, *, target_config: dict[str, Any] | None = None, seed: int = 0,
                        dtype: str = "bf16", console: Any = None) -> ResolvedModel:
    """A random DFlash draft for the checkpoint at ``target`` (`lucebench models synth --draft-for`), written on
    first use into the models cache under a key of the target's config and tokenizer, the seed, dtype and
    scale rule.

    ``target`` is a folder in Hugging Face layout, whose config.json gives the draft its sizes, or a single
    GGUF file with ``target_config`` (a synthetic GGUF: its shape's config; its tokenizer.json lies beside it).
    The key hashes that config as canonical JSON, so the same shape always finds the same draft."""
    from lucebench.models.dflash_draft import synthesize_draft
    from lucebench.models.synth import PROVENANCE_FILE
    from lucebench.models.weights import SCALE_RULE

    target = Path(target)
    h = hashlib.sha256()
    if target_config is None:
        if not (target / "config.json").is_file():
            raise UserError("a synthetic draft needs a target in Hugging Face layout (config.json) or a "
                            "synthetic GGUF (`synth: {format: gguf}`)", where=str(target))
        folder = target
        h.update((target / "config.json").read_bytes())
    else:
        folder = target.parent if target.is_file() else target
        h.update(json.dumps(target_config, sort_keys=True).encode())
    if (folder / "tokenizer.json").is_file():
        h.update((folder / "tokenizer.json").read_bytes())
    h.update(json.dumps({"rule": SCALE_RULE, "seed": seed, "dtype": dtype}, sort_keys=True).encode())
    out = models_cache_dir() / f"draft-{folder.name[:40]}-s{seed}-{dtype}-{h.hexdigest()[:12]}"
    if not _synth_is_current(out / PROVENANCE_FILE):
        if console is not None:
            console.print(f"writing a synthetic DFlash draft for {folder.name} (seed {seed}, {dtype}) to {out}")
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            synthesize_draft(folder, tmp, seed=seed, dtype=dtype, target_config=target_config)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ResolvedModel(path=out, kind="synth", name=f"synth:draft-for-{folder.name}", synthetic=True,
                         synth={"draft_for": str(target), "seed": seed, "dtype": dtype})


# ------------------------------------------------------------------------------------------ file hashes
def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _model_files(root: Path) -> list[tuple[str, Path]]:
    if root.is_file():
        return [(root.name, root)]
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        # Skip hidden entries (.cache/huggingface download metadata, editor droppings).
        if any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_file():  # follows the HF cache's symlinks into blobs/
            out.append((rel.as_posix(), p))
    return out


def _load_memo(memo_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(memo_path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def hash_model_files(path: Path | str, *, memo_path: Path | None = None) -> dict[str, str]:
    """sha256 of every file of a model folder (or of a single model file), keyed by relative path.

    Hashes are memoised in ``<cache root>/file-hashes.json`` keyed by (real path, size, mtime), so a 54 GB
    checkpoint is hashed once, not every run; a changed file (size or mtime) is hashed again.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"model path {root} does not exist")
    memo_path = memo_path or cache_root() / HASH_MEMO_FILE
    memo = _load_memo(memo_path)
    changed = False
    result: dict[str, str] = {}
    for rel, p in _model_files(root):
        real = p.resolve()
        st = real.stat()
        key = str(real)
        entry = memo.get(key)
        if isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
            result[rel] = entry["sha256"]
            continue
        digest = _sha256_file(real)
        memo[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        result[rel] = digest
        changed = True
    if changed:
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_path.with_name(f".{memo_path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(memo, indent=0, sort_keys=True), encoding="utf-8")
            os.replace(tmp, memo_path)
        except OSError:
            pass  # the memo is an optimisation; hashing still succeeded
    return result


# ------------------------------------------------------------------------------------------------ fetch
def fetch_model(repo_id: str, revision: str | None = None, include: list[str] | None = None) -> Path:
    """Download ``repo_id`` (only the files matching ``include``'s glob patterns, when given) into the
    standard Hugging Face cache (huggingface_hub.snapshot_download).

    Raises UserError with one line when offline, the repository does not exist, or access is denied.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=include or None))
    except HFValidationError as exc:
        raise UserError(f"{repo_id!r} is not a valid hub repository id: {exc}", where="REPO_ID") from None
    except GatedRepoError:
        raise UserError(f"{repo_id} is gated: accept its licence on huggingface.co and log in "
                        "(`hf auth login`)", where="REPO_ID") from None
    except RevisionNotFoundError:
        raise UserError(f"{repo_id} has no revision {revision!r}", where="--revision") from None
    except RepositoryNotFoundError:
        raise UserError(f"no repository {repo_id} on the Hugging Face hub (or it is private)",
                        where="REPO_ID") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if _offline() else "the hub cannot be reached"
        raise UserError(f"cannot download {repo_id}: {why} and it is not in the cache",
                        hint="connect to the network (and unset HF_HUB_OFFLINE), then run the command again",
                        exit_code=1) from None
    except OSError as exc:
        raise UserError(f"cannot download {repo_id}: {exc}", exit_code=1) from None
