"""`lucebench datasets list` / `show` through the real entry point (lucebench.cli.main)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebench.cli import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())  # the error console wraps long lines


def test_list_shows_every_suite_with_rows_and_copies(data_dir: Path, small_suites: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "datasets", "list", "--json")
    assert code == 0
    rows = {r["suite"]: r for r in json.loads(out)}
    assert rows["gsm8k"]["rows"] == "30" and rows["gsm8k"]["available"] == "local"
    assert rows["gsm8k"]["local_file"] == str(data_dir / "gsm8k" / "test.jsonl")
    assert rows["pp520"]["kind"] == "synthetic" and rows["needle"]["stop"] == "natural"
    code, out, _ = _run(capsys, "datasets", "list")
    assert code == 0 and "humaneval" in out and "tg128" in out


def test_show_with_model_lists_tokens_and_skips(data_dir: Path, small_suites: Path, model_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "datasets", "show", "humaneval", "--model", str(model_dir), "--max-prompt-tokens", "40",
                        "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["source"] == "local" and shown["identity"].startswith("sha256:")
    assert len(shown["prompts"]) + len(shown["skipped"]) == 10
    assert all("over the limit of 40" in s["reason"] for s in shown["skipped"])
    code, out, _ = _run(capsys, "datasets", "show", "gsm8k", "--model", str(model_dir), "--n", "2")
    assert code == 0 and "prompts (2 of 10)" in out and "Question:" in out


def test_show_without_model_and_synthetic(data_dir: Path, small_suites: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "datasets", "show", "math500", "--json")
    assert code == 0
    shown = json.loads(out)
    assert len(shown["prompts"]) == 10 and shown["prompts"][0]["tokens"] is None
    assert shown["prompts"][0]["text"].startswith("Problem: ")
    code, out, _ = _run(capsys, "datasets", "show", "needle", "--context", "8192", "--json")
    assert code == 0 and [p["tokens"] for p in json.loads(out)["prompts"]] == [8192] * 5


def test_user_errors_end_in_one_message(data_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "datasets", "show", "gsm9k")
    assert code == 2 and "unknown suite 'gsm9k'" in err and "gsm8k" in err and "Traceback" not in err
    code, _, err = _run(capsys, "datasets", "show", "gsm8k")  # fixture copy has 30 rows, the suite expects 1319
    assert code == 2 and "expects 1319" in err and "Traceback" not in err
    code, _, err = _run(capsys, "datasets", "show", "pp520", "--model", str(tmp_path))
    assert code == 2 and "no tokenizer.json" in err


def test_tg_suites_explain_their_n_gen(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = cli(["datasets", "show", "tg128"])
    assert code == 0 and "129 (1 token from the prefill + 128 timed decode steps)" in " ".join(out.split())
    code, out, _ = cli(["datasets", "list"])
    assert code == 0 and "n_gen is N + 1" in " ".join(out.split())
