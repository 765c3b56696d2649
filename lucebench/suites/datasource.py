"""Dataset rows for a suite: from the Hugging Face hub through `datasets` (with its cache), else a local copy.

Order (LUCEBENCH_DATASET_SOURCE=auto, the default):
1. `datasets.load_dataset(hub_id, config, split)`; online when the hub answers, otherwise in offline mode so
   a populated cache (HF_DATASETS_CACHE) still serves without waiting for retries.
2. the local copy `<data dir>/<local>`, data dir = LUCEBENCH_DATA_DIR, then `../shared/datasets` beside the
   repository. The local copies hold the same rows in the same order as the hub split.
`hub` or `local` forces one source. The revision recorded is the hub commit sha, or "sha256:<hex>" of the file.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import hashlib
import io
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from lucebench.errors import UserError
from lucebench.suites.registry import repo_root
from lucebench.suites.spec import DatasetSource

ENV_DATA_DIR = "LUCEBENCH_DATA_DIR"
ENV_SOURCE = "LUCEBENCH_DATASET_SOURCE"


@dataclass(frozen=True)
class LoadedRows:
    """All rows of a split, and where they came from."""

    rows: list[dict[str, Any]]
    source: Literal["hub", "local"]
    revision: str  # hub commit sha, or "sha256:<hex>" of the local file
    location: str  # the file (local) or the datasets cache folder (hub)


def data_dirs() -> list[Path]:
    """Folders searched for local copies, in order: LUCEBENCH_DATA_DIR, then ../shared/datasets."""
    dirs = []
    if os.environ.get(ENV_DATA_DIR):
        given = Path(os.environ[ENV_DATA_DIR])
        if not given.is_dir():  # read another copy instead, and the user never learns their setting did nothing
            raise UserError("no such folder", where=f"{ENV_DATA_DIR}={given}",
                            hint="point it at a folder holding the offline dataset copies, or unset it")
        dirs.append(given)
    dirs.append(repo_root().parent / "shared" / "datasets")
    return dirs


def local_file(src: DatasetSource) -> Path | None:
    """The first existing local copy of the source, or None."""
    for d in data_dirs():
        if (d / src.local).is_file():
            return d / src.local
    return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (of the compressed file for .gz, as published)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .jsonl.gz file; a malformed line is a UserError naming file and line."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[dict[str, Any]] = []
    with opener(path, "rb") as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"malformed JSON line: {exc.msg}", where=f"{path}:{lineno}") from None
            if not isinstance(row, dict):
                raise UserError("each line must be a JSON object", where=f"{path}:{lineno}")
            rows.append(row)
    return rows


def _source_mode() -> str:
    mode = os.environ.get(ENV_SOURCE, "auto").strip().lower() or "auto"
    if mode not in ("auto", "hub", "local"):
        raise UserError(f"{ENV_SOURCE}={mode!r} is not a dataset source", hint="use auto, hub or local")
    return mode


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint accepts a TCP connection; a quick test so offline machines do not wait for retries."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _offline(enabled: bool) -> Iterator[None]:
    """Put `datasets` and huggingface_hub in offline mode for one call (they read the env only at import)."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    if enabled:
        datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def load_from_hub(src: DatasetSource) -> LoadedRows:
    """Rows through `datasets.load_dataset` (network or cache). Raises the library's exception on failure."""
    import datasets

    offline = _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE") or not hub_reachable()
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    with _offline(offline):
        ds = datasets.load_dataset(src.hub_id, src.config, split=src.split, revision=src.revision,
                                   cache_dir=os.environ.get("HF_DATASETS_CACHE") or None)
    files = [f["filename"] for f in ds.cache_files]
    # The datasets cache folder is <name>/<config>/<version>/<hash>; for hub datasets the hash is the commit sha.
    folder = Path(files[0]).parent if files else None
    revision = folder.name if folder is not None else (src.revision or "unknown")
    if src.revision and revision != src.revision:
        raise FileNotFoundError(f"the cached revision {revision} is not the pinned revision {src.revision}")
    return LoadedRows(rows=ds.to_list(), source="hub", revision=revision, location=str(folder or src.hub_id))


def load_from_local(src: DatasetSource) -> LoadedRows | None:
    """Rows of the local copy, or None when no data dir has it."""
    path = local_file(src)
    if path is None:
        return None
    return LoadedRows(rows=read_jsonl(path), source="local", revision=f"sha256:{sha256_file(path)}",
                      location=str(path))


def load_rows(src: DatasetSource, *, suite: str) -> LoadedRows:
    """All rows of the suite's split, from the hub/cache or the local copy; the row count is checked."""
    mode = _source_mode()
    hub_problem = None
    loaded: LoadedRows | None = None
    if mode in ("auto", "hub"):
        try:
            loaded = load_from_hub(src)
        except Exception as exc:  # noqa: BLE001 - any hub/cache failure means: try the local copy
            hub_problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if mode == "hub":
                raise UserError(f"cannot load {src.hub_id} from the hub or its cache ({hub_problem})",
                                where=f"suite {suite}",
                                hint=f"connect to the hub, set HF_DATASETS_CACHE to a populated cache, "
                                     f"or unset {ENV_SOURCE} to use a local copy") from None
    if loaded is None:
        loaded = load_from_local(src)
    if loaded is None:
        searched = ", ".join(str(d / src.local) for d in data_dirs())
        raise UserError(
            f"dataset {src.hub_id} is not reachable: " + (f"hub: {hub_problem}; " if hub_problem else "")
            + f"no local copy at {searched}", where=f"suite {suite}",
            hint=f"set {ENV_DATA_DIR} to a folder with {src.local} (e.g. ../shared/datasets), "
                 "or populate the Hugging Face cache (HF_DATASETS_CACHE) on a machine with internet")
    if len(loaded.rows) != src.rows:
        raise UserError(f"{src.hub_id} ({src.split}) has {len(loaded.rows)} rows, the suite expects {src.rows}",
                        where=loaded.location,
                        hint="a different row count means different data: restore the original copy, "
                             "or write a new suite version for the new data")
    return loaded


def hub_cache_folders(src: DatasetSource) -> list[str]:
    """Cached copies of the hub dataset in the datasets cache (no network), newest last."""
    import datasets.config
    from datasets.naming import camelcase_to_snakecase

    cache = os.environ.get("HF_DATASETS_CACHE") or str(datasets.config.HF_DATASETS_CACHE)
    parts = src.hub_id.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    root = os.path.join(os.path.expanduser(cache), "___".join(parts))
    return sorted(glob.glob(os.path.join(root, src.config or "*", "*", "*")), key=os.path.getmtime)
