"""Rows from the hub cache (through datasets.load_dataset, offline) or local copies; errors a user can cause."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites.datasource import load_rows, sha256_file
from lucebench.suites.identity import workload_identity
from lucebench.suites.loader import prepare_workload
from lucebench.suites.registry import resolve_suite

REV = "0123456789abcdef0123456789abcdef01234567"


def test_local_copy_gives_rows_and_sha256_revision(data_dir: Path, small_suites: Path) -> None:
    src = resolve_suite("gsm8k").spec.dataset
    loaded = load_rows(src, suite="gsm8k")
    assert loaded.source == "local" and len(loaded.rows) == 30
    assert loaded.revision == "sha256:" + sha256_file(data_dir / "gsm8k" / "test.jsonl")


def test_hub_cache_offline_gives_the_same_rows_and_workload(data_dir: Path, small_suites: Path, model_dir: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            helpers) -> None:
    local = prepare_workload("gsm8k", tokenizer_dir=model_dir)
    cache = tmp_path / "hf-cache"
    helpers.populate_hf_cache(cache, "openai/gsm8k", "main", "test", helpers.gsm8k_rows(30), REV)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    hub = prepare_workload("gsm8k", tokenizer_dir=model_dir)
    assert hub.dataset_source == "hub" and hub.dataset_revision == REV
    assert local.dataset_source == "local"
    assert hub.row_ids == local.row_ids and workload_identity(hub) == workload_identity(local)


def test_forced_sources(data_dir: Path, small_suites: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = resolve_suite("gsm8k").spec.dataset
    monkeypatch.setenv("LUCEBENCH_DATASET_SOURCE", "hub")
    with pytest.raises(UserError, match="cannot load openai/gsm8k from the hub"):
        load_rows(src, suite="gsm8k")
    monkeypatch.setenv("LUCEBENCH_DATASET_SOURCE", "local")
    assert load_rows(src, suite="gsm8k").source == "local"
    monkeypatch.setenv("LUCEBENCH_DATASET_SOURCE", "sometimes")
    with pytest.raises(UserError, match="not a dataset source"):
        load_rows(src, suite="gsm8k")


def test_unreachable_hub_without_local_copy_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              helpers) -> None:
    path = helpers.write_suite(tmp_path / "s", "gsm8k", name="gsm8k-elsewhere", dataset__local="nowhere/test.jsonl")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("LUCEBENCH_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(UserError) as exc:
        load_rows(resolve_suite(str(path)).spec.dataset, suite="gsm8k-elsewhere")
    assert "not reachable" in exc.value.message and "nowhere/test.jsonl" in exc.value.message
    assert "LUCEBENCH_DATA_DIR" in (exc.value.hint or "") and "HF_DATASETS_CACHE" in (exc.value.hint or "")


def test_row_count_mismatch_is_refused(data_dir: Path) -> None:
    # The repository's gsm8k suite expects 1319 rows; the fixture copy has 30.
    with pytest.raises(UserError, match="has 30 rows, the suite expects 1319") as exc:
        load_rows(resolve_suite("gsm8k").spec.dataset, suite="gsm8k")
    assert exc.value.where == str(data_dir / "gsm8k" / "test.jsonl")


def test_missing_field_names_file_and_row(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    rows = [json.loads(line) for line in (data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()]
    del rows[5]["question"]  # row 5 is not in the first-10 sample of 30 rows by seed 42 unless selected: select all
    (data_dir / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError) as exc:
        prepare_workload("gsm8k", tokenizer_dir=model_dir, sample_size=30)
    assert "gsm8k/test/5 has no field 'question'" in exc.value.message
    assert exc.value.where == f"{data_dir / 'gsm8k' / 'test.jsonl'}:6"


def test_malformed_line_names_file_and_line(data_dir: Path, small_suites: Path) -> None:
    path = data_dir / "humaneval" / "HumanEval.jsonl.gz"
    with gzip.open(path, "at") as f:
        f.write("{not json\n")
    with pytest.raises(UserError, match="malformed JSON line") as exc:
        load_rows(resolve_suite("humaneval").spec.dataset, suite="humaneval")
    assert exc.value.where == f"{path}:13"


def test_cli_show_reads_the_hub_cache_with_hf_hub_offline(tmp_path: Path, model_dir: Path, helpers) -> None:
    """End to end in a fresh process: HF_HUB_OFFLINE=1 and a populated HF_DATASETS_CACHE, no local copy."""
    cache = tmp_path / "hf-cache"
    helpers.populate_hf_cache(cache, "HuggingFaceH4/MATH-500", None, "test", helpers.math500_rows(20), REV)
    suite = helpers.write_suite(tmp_path / "s", "math500", dataset__rows=20, dataset__local="none/test.jsonl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache),
           "LUCEBENCH_DATA_DIR": str(tmp_path / "nothing")}
    out = subprocess.run([sys.executable, "-m", "lucebench", "datasets", "show", str(suite), "--model", str(model_dir),
                          "--json"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["source"] == "hub" and shown["revision"] == REV and len(shown["prompts"]) == 10
    assert all(p["tokens"] > 5 for p in shown["prompts"])


def test_a_data_dir_that_does_not_exist_is_an_error_not_ignored(tmp_path, monkeypatch):
    import pytest as _pytest

    from lucebench.errors import UserError as _UserError
    from lucebench.suites.datasource import data_dirs

    monkeypatch.setenv("LUCEBENCH_DATA_DIR", str(tmp_path / "nope"))
    with _pytest.raises(_UserError) as exc:
        data_dirs()
    assert "LUCEBENCH_DATA_DIR" in str(exc.value) and "no such folder" in str(exc.value)
    monkeypatch.setenv("LUCEBENCH_DATA_DIR", str(tmp_path))
    assert data_dirs()[0] == tmp_path
