"""The training corpus: text every machine has offline (Python's standard library and installed packages).

Files: `.py` source (code, and English prose in its docstrings and comments) and `.rst`/`.md`/`.txt`
documentation found under the running interpreter's stdlib and site-packages folders. The selection is a
function of the files' contents only, so two machines with the same Python and packages build the same
corpus:

* files over `max_file_bytes`, not UTF-8, or with lines over `max_line_chars` (generated tables, minified
  data) are skipped; identical contents are kept once;
* decontamination: a file sharing any 13-word sequence with an evaluation prompt (HumanEval `prompt`,
  GSM8K `question`, MATH-500 `problem`) is dropped, and the dropped files are listed in the manifest;
* the files are ranked by the sha256 of their contents and taken in that order up to `max_bytes`, then put
  back in path order (stable, readable manifests);
* held-out split: a file whose content hash ends in the lowest `heldout_permille` of the hash space (the
  last 32 bits; the first ones rank the files).

`Corpus.sha256` hashes the training documents in order (each as its label, path and text); the manifest
records it with the held-out hash, the file counts and the excluded files.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

TEXT_SUFFIXES = (".py", ".rst", ".md", ".txt")
NGRAM = 13  # words per decontamination n-gram (the GPT-3 paper's choice)
_WORD = re.compile(r"[A-Za-z0-9_]+")


@dataclass
class Document:
    """One corpus file: where it came from and its text."""

    label: str  # which root: "stdlib" or "site"
    path: str  # relative to the root, '/'-separated
    text: str
    sha256: str


@dataclass
class Corpus:
    train: list[Document]
    heldout: list[Document]
    manifest: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return self.manifest["train_sha256"]


def default_roots() -> list[tuple[str, Path]]:
    """The running interpreter's standard library and site-packages folders."""
    paths = sysconfig.get_paths()
    roots: list[tuple[str, Path]] = [("stdlib", Path(paths["stdlib"]))]
    seen = {roots[0][1].resolve()}
    for key in ("purelib", "platlib"):
        p = Path(paths[key])
        if p.is_dir() and p.resolve() not in seen:
            roots.append(("site", p))
            seen.add(p.resolve())
    return roots


# ---------------------------------------------------------------------------------------------------------
# Evaluation prompts (never training data)

def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def eval_prompt_texts(datasets_dir: Path) -> dict[str, list[str]]:
    """The prompts of the evaluation sets, per set (HumanEval prompt, GSM8K question, MATH-500 problem)."""
    d = Path(datasets_dir)
    files = {"humaneval": (d / "humaneval" / "HumanEval.jsonl.gz", "prompt"),
             "gsm8k": (d / "gsm8k" / "test.jsonl", "question"),
             "math500": (d / "math500" / "test.jsonl", "problem")}
    out: dict[str, list[str]] = {}
    for name, (path, key) in files.items():
        if not path.is_file():
            raise FileNotFoundError(f"{path}: evaluation set missing (needed to decontaminate the corpus)")
        out[name] = [row[key] for row in read_jsonl(path)]
    return out


def ngrams(text: str, n: int = NGRAM) -> set[str]:
    """The text's n-word sequences (lower-cased alphanumeric words joined by spaces)."""
    words = _WORD.findall(text.lower())
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def eval_ngrams(datasets_dir: Path, n: int = NGRAM) -> set[str]:
    grams: set[str] = set()
    for texts in eval_prompt_texts(datasets_dir).values():
        for t in texts:
            g = ngrams(t, n)
            # A prompt shorter than n words is matched whole.
            grams |= g if g else {" ".join(_WORD.findall(t.lower()))}
    return grams


_EVAL_GRAMS: set[str] = set()


def _init_worker(grams: set[str]) -> None:
    global _EVAL_GRAMS
    _EVAL_GRAMS = grams


def _contaminated(text: str) -> bool:
    words = _WORD.findall(text.lower())
    grams = _EVAL_GRAMS
    for i in range(len(words) - NGRAM + 1):
        if " ".join(words[i:i + NGRAM]) in grams:
            return True
    return False


def _contaminated_batch(texts: list[str]) -> list[bool]:
    return [_contaminated(t) for t in texts]


# ---------------------------------------------------------------------------------------------------------

def _read_candidate(path: Path, max_file_bytes: int, max_line_chars: int) -> str | None:
    try:
        if path.stat().st_size > max_file_bytes or path.stat().st_size == 0:
            return None
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text or max(map(len, text.splitlines()), default=0) > max_line_chars:
        return None
    return text


def collect_documents(roots: list[tuple[str, Path]], *, max_file_bytes: int, max_line_chars: int) -> list[Document]:
    """Every usable text file under the roots, deduplicated by content, in (label, path) order."""
    docs: list[Document] = []
    seen: set[str] = set()
    nested = [r.resolve() for _, r in roots]
    for label, root in roots:
        rroot = root.resolve()
        for dirpath, dirnames, filenames in os.walk(rroot):
            here = Path(dirpath)
            # Do not walk into another root nested inside this one (a venv inside the stdlib tree), nor caches.
            dirnames[:] = sorted(d for d in dirnames
                                 if d != "__pycache__" and (here / d).resolve() not in nested)
            for name in sorted(filenames):
                if not name.endswith(TEXT_SUFFIXES):
                    continue
                p = here / name
                text = _read_candidate(p, max_file_bytes, max_line_chars)
                if text is None:
                    continue
                h = hashlib.sha256(text.encode("utf-8")).hexdigest()
                if h in seen:
                    continue
                seen.add(h)
                docs.append(Document(label, p.relative_to(rroot).as_posix(), text, h))
    docs.sort(key=lambda d: (d.label, d.path))
    return docs


def _hash_documents(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.label}/{d.path}\n".encode())
        h.update(d.text.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def build_corpus(datasets_dir: Path, *, roots: list[tuple[str, Path]] | None = None, max_bytes: int,
                 heldout_permille: int = 10, max_file_bytes: int = 256_000, max_line_chars: int = 1000,
                 workers: int | None = None) -> Corpus:
    """Collect, decontaminate, cap and split the corpus (see the module docstring)."""
    roots = roots if roots is not None else default_roots()
    docs = collect_documents(roots, max_file_bytes=max_file_bytes, max_line_chars=max_line_chars)
    n_found = len(docs)
    # Rank by content hash, take up to max_bytes (plus what decontamination removes, checked on the way).
    ranked = sorted(docs, key=lambda d: d.sha256)
    grams = eval_ngrams(datasets_dir)
    workers = workers or max(1, min(16, os.cpu_count() or 1))
    kept: list[Document] = []
    excluded: list[str] = []
    total = 0
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(grams,)) as pool:
        i = 0
        while i < len(ranked) and total < max_bytes:
            batch = ranked[i:i + 256 * workers]
            i += len(batch)
            parts = [[d.text for d in batch[j:j + 64]] for j in range(0, len(batch), 64)]
            flags = [f for part in pool.map(_contaminated_batch, parts) for f in part]
            for d, bad in zip(batch, flags):
                if bad:
                    excluded.append(f"{d.label}/{d.path}")
                elif total < max_bytes:
                    kept.append(d)
                    total += len(d.text.encode("utf-8"))
    kept.sort(key=lambda d: (d.label, d.path))
    threshold = heldout_permille * (16 ** 8) // 1000
    train = [d for d in kept if int(d.sha256[-8:], 16) >= threshold]
    heldout = [d for d in kept if int(d.sha256[-8:], 16) < threshold]
    manifest = {
        "roots": {label: str(p) for label, p in roots},
        "suffixes": list(TEXT_SUFFIXES),
        "max_bytes": max_bytes,
        "max_file_bytes": max_file_bytes,
        "max_line_chars": max_line_chars,
        "heldout_permille": heldout_permille,
        "files_found": n_found,
        "files_train": len(train),
        "files_heldout": len(heldout),
        "bytes_train": sum(len(d.text.encode()) for d in train),
        "bytes_heldout": sum(len(d.text.encode()) for d in heldout),
        "decontamination": {
            "method": f"a file sharing any {NGRAM}-word sequence (lower-cased [A-Za-z0-9_]+ words) with a "
                      "HumanEval prompt, GSM8K question or MATH-500 problem is dropped",
            "eval_ngrams": len(grams),
            "files_excluded": excluded,
        },
        "train_sha256": _hash_documents(train),
        "heldout_sha256": _hash_documents(heldout),
    }
    return Corpus(train, heldout, manifest)
