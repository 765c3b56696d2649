"""Locate (or obtain) the pinned llama.cpp source tree and record what it is.

Order of preference:

1. a path given by the caller, or ``$LUCEBENCH_LLAMACPP_SRC``: a llama.cpp checkout, or an archive
   (the llama-cpp-python sdist, or a stripped tree written by :func:`pack_source`);
2. a cached unpack of the pinned llama-cpp-python sdist under the cache dir
   (``$LUCEBENCH_CACHE``, default ``~/.cache/lucebench``), fetched with ``pip download`` when absent;
3. where the network allows, ``git fetch`` of the pinned commit.

Every tree we unpack carries a stamp file (``.lucebench-source.json``) with the commit and a content hash,
so a build can name its exact source even where no ``.git`` exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lucebench.baselines.llamacpp import pins
from lucebench.errors import UserError

STAMP_NAME = ".lucebench-source.json"
ENV_SRC = "LUCEBENCH_LLAMACPP_SRC"
ENV_CACHE = "LUCEBENCH_CACHE"

# Top-level folders of the llama.cpp tree that no build or conversion of ours reads. models/ alone is
# 75 MB of tokenizer vocabularies; tests/examples/pocs are only configured when LLAMA_BUILD_TESTS /
# LLAMA_BUILD_EXAMPLES are ON, and our builds always turn them OFF.
UNNEEDED_TOP = frozenset({"models", "docs", "media", ".github", ".devops", "tests", "examples", "pocs",
                          "benches", "ci", ".gemini", ".pi", "skills"})
# Never part of the hashed source: VCS data, caches and build trees a user may keep in a checkout.
_HASH_SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".cache"})
_REQUIRED = ("CMakeLists.txt", "ggml/CMakeLists.txt", "tools/llama-bench", "tools/server", "convert_hf_to_gguf.py")


@dataclass(frozen=True)
class LlamaCppSource:
    """A llama.cpp source tree and its identity."""

    root: Path
    commit: str
    source_hash: str
    origin: str  # "path" | "archive" | "sdist" | "git"

    @property
    def commit_short(self) -> str:
        return self.commit[:7] if self.commit != "unknown" else "unknown"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["root"] = str(self.root)
        return d


def cache_dir() -> Path:
    """The lucebench cache root: ``$LUCEBENCH_CACHE`` or ``~/.cache/lucebench``."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lucebench"


def llamacpp_cache_dir() -> Path:
    """Where everything llama.cpp-related is cached (sources, builds, GGUF files)."""
    return cache_dir() / "llamacpp"


def _log(console: Any, msg: str) -> None:
    # The adapter's stdout belongs to the protocol, so progress goes to stderr when no console is given.
    if console is not None:
        console.print(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


def _hash_tree(root: Path) -> str:
    """sha256 over (relative path, file sha256) of every file that can influence a build or conversion."""
    h = hashlib.sha256()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if d not in _HASH_SKIP_DIRS
                             and not (rel_dir == Path(".") and (d in UNNEEDED_TOP or d.startswith("build"))))
        for name in filenames:
            if name == STAMP_NAME or name.endswith(".pyc"):
                continue
            files.append(Path(dirpath) / name)
    for f in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        if f.is_symlink():
            digest = "link:" + os.readlink(f)
        else:
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
        h.update(f"{f.relative_to(root).as_posix()}\0{digest}\n".encode())
    return h.hexdigest()


def source_hash(root: Path) -> str:
    """Content hash of a llama.cpp tree (stamp value if the tree carries one, else computed)."""
    stamp = _read_stamp(root)
    if stamp and stamp.get("source_hash"):
        return str(stamp["source_hash"])
    return _hash_tree(root)


def _read_stamp(root: Path) -> dict[str, Any] | None:
    p = root / STAMP_NAME
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _write_stamp(root: Path, commit: str, origin: str) -> dict[str, Any]:
    stamp = {"commit": commit, "source_hash": _hash_tree(root), "origin": origin,
             "sdist": f"{pins.SDIST_NAME}=={pins.SDIST_VERSION}" if origin == "sdist" else None}
    (root / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def detect_commit(root: Path) -> str:
    """The llama.cpp commit of a tree: stamp, own git checkout, sdist submodule layout, env, else 'unknown'."""
    stamp = _read_stamp(root)
    if stamp and stamp.get("commit"):
        return str(stamp["commit"])
    # Only ask git when the tree itself is a checkout: otherwise git walks up and names an enclosing repo.
    if (root / ".git").exists() and shutil.which("git"):
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, check=False, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    # llama-cpp-python sdist: vendor/llama.cpp is a submodule whose HEAD lives in the parent's .git/modules.
    head = root.parent.parent / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    if head.is_file():
        text = head.read_text().strip()
        if len(text) == 40:
            return text
    return os.environ.get("LUCEBENCH_LLAMACPP_COMMIT", "unknown")


def _check_tree(root: Path, where: str) -> None:
    missing = [r for r in _REQUIRED if not (root / r).exists()]
    if missing:
        raise UserError(f"not a llama.cpp source tree (missing {', '.join(missing)})", where=where,
                        hint=f"point {ENV_SRC} (or --llamacpp-src) at a llama.cpp checkout or the "
                             f"{pins.SDIST_NAME}=={pins.SDIST_VERSION} sdist, or unset it to fetch the pinned sdist")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _extract_tree(archive: Path, dest: Path) -> str | None:
    """Unpack the llama.cpp tree of an sdist or packed archive into ``dest``; return the sdist commit if found.

    Folders in UNNEEDED_TOP are left out (they are never built). The commit comes from the sdist's
    ``.git/modules/vendor/llama.cpp/HEAD`` or, for a packed tree, its stamp.
    """
    commit: str | None = None
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        names = [PurePosixPath(m.name) for m in members]
        # An sdist nests the tree at <pkg>/vendor/llama.cpp; a packed tree has it at the top (maybe under one dir).
        prefix: PurePosixPath | None = None
        for n in names:
            if n.name == "convert_hf_to_gguf.py" and (len(n.parts) <= 2 or n.parts[-3:-1] == ("vendor", "llama.cpp")):
                prefix = n.parent
                break
        if prefix is None:
            raise UserError("archive holds no llama.cpp tree (no convert_hf_to_gguf.py)", where=str(archive))
        dest.mkdir(parents=True, exist_ok=True)
        for m, n in zip(members, names):
            if n.parts[-4:] == (".git", "modules", "vendor", "llama.cpp") or (
                    len(n.parts) >= 5 and n.parts[-5:] == (".git", "modules", "vendor", "llama.cpp", "HEAD")):
                f = tf.extractfile(m) if m.isfile() else None
                if f is not None:
                    commit = f.read().decode().strip()
                continue
            try:
                rel = n.relative_to(prefix)
            except ValueError:
                continue
            if not rel.parts or rel.parts[0] in UNNEEDED_TOP or rel.parts[0] == ".git":
                continue
            if not (m.isfile() or m.isdir() or m.issym()):
                continue
            m.name = rel.as_posix()
            tf.extract(m, dest, filter="data")
    return commit


def _pip_download(dest: Path, console: Any) -> Path:
    _log(console, f"llama.cpp: downloading {pins.SDIST_NAME}=={pins.SDIST_VERSION} sdist (pinned llama.cpp "
                  f"{pins.LLAMACPP_COMMIT_SHORT}) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--disable-pip-version-check",
           f"{pins.SDIST_NAME}=={pins.SDIST_VERSION}", "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, check=False, text=True)
    path = dest / pins.SDIST_FILENAME
    if r.returncode != 0 or not path.is_file():
        raise UserError(f"pip download of {pins.SDIST_NAME}=={pins.SDIST_VERSION} failed: "
                        f"{(r.stderr or r.stdout).strip()[-800:]}", where="llama.cpp source",
                        hint=f"set {ENV_SRC} to a llama.cpp checkout or a downloaded {pins.SDIST_FILENAME}")
    return path


def _git_fetch(dest: Path, console: Any) -> None:
    _log(console, f"llama.cpp: fetching {pins.LLAMACPP_GIT_URL} at {pins.LLAMACPP_COMMIT_SHORT} with git")
    dest.mkdir(parents=True, exist_ok=True)
    for cmd in (["git", "init", "-q"], ["git", "fetch", "-q", "--depth", "1", pins.LLAMACPP_GIT_URL, pins.LLAMACPP_COMMIT],
                ["git", "checkout", "-q", "FETCH_HEAD"]):
        r = subprocess.run(cmd, cwd=dest, capture_output=True, check=False, text=True)
        if r.returncode != 0:
            raise UserError(f"git {' '.join(cmd[1:3])} failed: {r.stderr.strip()[-500:]}", where="llama.cpp source")


def _install_atomically(target: Path, fill: Any) -> None:
    """Build a tree in a temporary sibling folder and rename it into place, so a crash leaves no half tree."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        fill(tmp)
        if target.exists():  # another process won the race; theirs is as good as ours
            return
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _from_archive(archive: Path, console: Any) -> LlamaCppSource:
    digest = _sha256_file(archive)
    target = llamacpp_cache_dir() / "src" / f"archive-{digest[:16]}"
    if not (target / STAMP_NAME).is_file():
        _log(console, f"llama.cpp: unpacking {archive}")

        def fill(tmp: Path) -> None:
            commit = _extract_tree(archive, tmp)
            stamp = _read_stamp(tmp)
            if stamp is None:
                _write_stamp(tmp, commit or detect_commit(tmp), "archive")

        _install_atomically(target, fill)
    _check_tree(target, str(archive))
    stamp = _read_stamp(target) or {}
    return LlamaCppSource(target, str(stamp.get("commit", "unknown")), str(stamp["source_hash"]), "archive")


def _pinned_sdist(console: Any, allow_download: bool) -> LlamaCppSource:
    target = llamacpp_cache_dir() / "src" / f"sdist-{pins.SDIST_VERSION}-{pins.LLAMACPP_COMMIT_SHORT}"
    if not (target / STAMP_NAME).is_file():
        if not allow_download:
            raise UserError("the pinned llama.cpp source is not in the cache and downloads are off",
                            where=str(target), hint=f"set {ENV_SRC} or allow the pip download")

        def fill(tmp: Path) -> None:
            dl = Path(tempfile.mkdtemp(prefix="sdist-", dir=tmp.parent))
            try:
                try:
                    sdist = _pip_download(dl, console)
                except UserError:
                    if shutil.which("git") is None:
                        raise
                    _git_fetch(tmp, console)
                    _write_stamp(tmp, pins.LLAMACPP_COMMIT, "git")
                    return
                digest = _sha256_file(sdist)
                if digest != pins.SDIST_SHA256:
                    raise UserError(f"{sdist.name} has sha256 {digest}, expected {pins.SDIST_SHA256}",
                                    where="llama.cpp source", hint="the index served different bytes than the pin")
                commit = _extract_tree(sdist, tmp)
                if commit != pins.LLAMACPP_COMMIT:
                    raise UserError(f"sdist carries llama.cpp {commit}, expected {pins.LLAMACPP_COMMIT}",
                                    where=str(sdist))
                _write_stamp(tmp, commit, "sdist")
            finally:
                shutil.rmtree(dl, ignore_errors=True)

        _install_atomically(target, fill)
    stamp = _read_stamp(target) or {}
    _check_tree(target, str(target))
    return LlamaCppSource(target, str(stamp.get("commit", pins.LLAMACPP_COMMIT)), str(stamp["source_hash"]),
                          str(stamp.get("origin", "sdist")))


def locate_source(path: Path | str | None = None, *, console: Any = None, allow_download: bool = True) -> LlamaCppSource:
    """Find the llama.cpp source to build: ``path``, else ``$LUCEBENCH_LLAMACPP_SRC``, else the pinned sdist.

    ``path`` may be a source folder or an archive (``.tar.gz``/``.tar.xz``: the sdist or a packed tree).
    Raises UserError when the given path is missing or is not a llama.cpp tree, or nothing can be fetched.
    """
    where = "argument"
    if path is None and os.environ.get(ENV_SRC):
        path, where = os.environ[ENV_SRC], f"${ENV_SRC}"
    if path is not None:
        p = Path(path).expanduser()
        if not p.exists():
            raise UserError(f"llama.cpp source not found: {p}", where=where,
                            hint=f"give an existing llama.cpp checkout or archive, or unset {ENV_SRC} "
                                 "to fetch the pinned sdist")
        if p.is_file():
            return _from_archive(p.resolve(), console)
        p = p.resolve()
        _check_tree(p, str(p))
        return LlamaCppSource(p, detect_commit(p), source_hash(p), "path")
    return _pinned_sdist(console, allow_download)


def pack_source(src: LlamaCppSource, out: Path) -> Path:
    """Write ``src`` as a stripped ``.tar.xz`` (no models/, docs/, tests/...) with its stamp, for carrying.

    The archive is what the device check carries in the working tree; :func:`locate_source` accepts it.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"commit": src.commit, "source_hash": src.source_hash, "origin": src.origin,
             "sdist": f"{pins.SDIST_NAME}=={pins.SDIST_VERSION}"}
    with tempfile.TemporaryDirectory() as td:
        stamp_file = Path(td) / STAMP_NAME
        stamp_file.write_text(json.dumps(stamp, indent=1) + "\n")

        def keep(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
            parts = PurePosixPath(ti.name).parts
            if len(parts) > 1 and (parts[1] in UNNEEDED_TOP or parts[1] == ".git"):
                return None
            # a user's build folders (build/, build-cuda/...) at the top, as _hash_tree skips them
            if len(parts) > 1 and parts[1].startswith("build") and (len(parts) > 2 or ti.isdir()):
                return None
            if any(p in _HASH_SKIP_DIRS for p in parts) or ti.name.endswith(".pyc") or parts[-1] == STAMP_NAME:
                return None
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mtime = 0  # byte-stable archives for the same tree
            return ti

        with tarfile.open(out, "w:xz", preset=6) as tf:
            tf.add(src.root, arcname="llama.cpp", filter=keep)
            stamp_info = tf.gettarinfo(str(stamp_file), arcname=f"llama.cpp/{STAMP_NAME}")
            stamp_info.uid = stamp_info.gid = 0
            stamp_info.uname = stamp_info.gname = ""
            stamp_info.mtime = 0
            with stamp_file.open("rb") as f:
                tf.addfile(stamp_info, f)
    return out

