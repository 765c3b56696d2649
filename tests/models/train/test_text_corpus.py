"""The training corpus: decontamination, determinism and the held-out split."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from lucebench.models.train.text_corpus import build_corpus, ngrams

HUMANEVAL_PROMPT = ('from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n'
                    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
                    '    given threshold.\n    """\n')
GSM8K_QUESTION = "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins."


def _datasets(tmp: Path) -> Path:
    d = tmp / "datasets"
    (d / "humaneval").mkdir(parents=True)
    (d / "gsm8k").mkdir()
    (d / "math500").mkdir()
    with gzip.open(d / "humaneval" / "HumanEval.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"prompt": HUMANEVAL_PROMPT}) + "\n")
    (d / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": GSM8K_QUESTION}) + "\n")
    (d / "math500" / "test.jsonl").write_text(json.dumps({"problem": "What is $1+1$?"}) + "\n")
    return d


def _root(tmp: Path) -> Path:
    root = tmp / "root"
    (root / "pkg").mkdir(parents=True)
    for i in range(60):
        (root / "pkg" / f"mod{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i}  # module {i}\n" * (i + 1))
    (root / "pkg" / "copy.py").write_text((root / "pkg" / "mod03.py").read_text())  # duplicate content
    (root / "pkg" / "leak.py").write_text("# vendored benchmark\nPROMPT = '''" + HUMANEVAL_PROMPT + "'''\n")
    (root / "pkg" / "leak2.md").write_text("Example: " + GSM8K_QUESTION.upper() + "\n")
    (root / "pkg" / "data.txt").write_text("x" * 5000 + "\n")  # a line too long: skipped
    (root / "pkg" / "blob.bin").write_bytes(b"\x00\x01")  # not a text suffix
    return root


def test_eval_prompts_are_excluded_and_the_corpus_is_deterministic(tmp_path):
    ds, root = _datasets(tmp_path), _root(tmp_path)
    a = build_corpus(ds, roots=[("site", root)], max_bytes=10**9, heldout_permille=200, workers=1)
    b = build_corpus(ds, roots=[("site", root)], max_bytes=10**9, heldout_permille=200, workers=1)
    paths = {d.path for d in a.train + a.heldout}
    assert "pkg/leak.py" not in paths and "pkg/leak2.md" not in paths
    assert sorted(a.manifest["decontamination"]["files_excluded"]) == ["site/pkg/leak.py", "site/pkg/leak2.md"]
    assert "pkg/data.txt" not in paths and "pkg/blob.bin" not in paths
    assert len([p for p in paths if p in ("pkg/copy.py", "pkg/mod03.py")]) == 1
    assert a.manifest["train_sha256"] == b.manifest["train_sha256"]
    assert a.manifest["heldout_sha256"] == b.manifest["heldout_sha256"]
    assert a.heldout and a.train and not ({d.path for d in a.train} & {d.path for d in a.heldout})
    assert [d.path for d in a.train] == sorted(d.path for d in a.train)


def test_max_bytes_caps_the_corpus_by_content_hash(tmp_path):
    ds, root = _datasets(tmp_path), _root(tmp_path)
    small = build_corpus(ds, roots=[("site", root)], max_bytes=2000, heldout_permille=0, workers=1)
    assert 2000 <= small.manifest["bytes_train"] < 2000 + 256_000
    full = build_corpus(ds, roots=[("site", root)], max_bytes=10**9, heldout_permille=0, workers=1)
    assert {d.path for d in small.train} < {d.path for d in full.train}


def test_ngrams_are_lowercased_word_sequences():
    assert ngrams("A b c", 2) == {"a b", "b c"}
    assert ngrams("x = f(Y)", 3) == {"x f y"}
