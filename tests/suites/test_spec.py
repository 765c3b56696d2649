"""The suite file schema and its strict loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites.registry import list_suites, repo_root
from lucebench.suites.spec import load_suite_file


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_every_repository_suite_loads_and_declares_its_file_name() -> None:
    names = {ref.name for ref in list_suites()}
    assert {"humaneval", "gsm8k", "math500", "pp520", "tg128", "pp", "tg", "needle"} <= names
    for ref in list_suites():
        assert ref.spec.name == ref.path.stem
        assert ref.spec.version


def test_upstream_formats_are_pinned_in_the_suite_files() -> None:
    specs = {ref.name: ref.spec for ref in list_suites()}
    assert specs["gsm8k"].prompt.template == "Question: {question}\nAnswer: "
    assert specs["math500"].prompt.template == "Problem: {problem}\nSolution: Put your final answer in \\boxed{}.\n"
    assert specs["humaneval"].prompt.template == "{prompt}"
    for name in ("humaneval", "gsm8k", "math500"):
        assert specs[name].selection.seed == 42 and specs[name].selection.sample_size == 10
        assert specs[name].max_prompt_tokens == 3500
    assert specs["pp520"].n_gen == 1 and specs["pp520"].phase == "prefill"
    assert specs["tg128"].n_gen == 129 and specs["tg128"].phase == "decode"


def test_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    src = (repo_root() / "suites" / "gsm8k.yaml").read_text().replace("  split: test\n", "  split: test\n  spilt: x\n")
    path = _write(tmp_path, src)
    with pytest.raises(UserError) as exc:
        load_suite_file(path)
    err = exc.value
    assert "dataset.spilt" in err.message
    line = src.splitlines().index("  spilt: x") + 1
    assert err.where == f"{path}:{line}"
    assert "split" in (err.hint or "")


def test_unknown_top_level_key_is_rejected(tmp_path: Path) -> None:
    src = (repo_root() / "suites" / "pp520.yaml").read_text() + "n_gem: 3\n"
    with pytest.raises(UserError, match="unknown key `n_gem`"):
        load_suite_file(_write(tmp_path, src))


def test_kind_needs_its_section_and_only_its_section(tmp_path: Path) -> None:
    src = "schema: lucebench.suite/v1\nname: x\nversion: '1'\nkind: synthetic\nn_gen: 1\n"
    with pytest.raises(UserError, match="needs a `synthetic:` section"):
        load_suite_file(_write(tmp_path, src))


def test_wrong_type_and_bad_stop_policy_are_named(tmp_path: Path) -> None:
    src = (repo_root() / "suites" / "pp520.yaml").read_text().replace("stop: fixed", "stop: sometimes")
    with pytest.raises(UserError, match="`stop`"):
        load_suite_file(_write(tmp_path, src))


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_suite_file(tmp_path / "missing.yaml")
