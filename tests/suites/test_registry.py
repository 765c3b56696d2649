"""Resolving suite names, families and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites.registry import resolve_suite


def test_names_resolve_to_repository_files() -> None:
    ref = resolve_suite("gsm8k")
    assert ref.path.name == "gsm8k.yaml" and ref.spec.kind == "dataset"


@pytest.mark.parametrize("name,n_gen,length", [("pp2048", 1, 2048), ("tg64", 65, 64), ("pp1", 1, 1)])
def test_pp_tg_families_are_parameterised_by_name(name: str, n_gen: int, length: int) -> None:
    ref = resolve_suite(name)
    assert ref.spec.name == name and ref.spec.n_gen == n_gen
    assert ref.spec.synthetic is not None and ref.spec.synthetic.length == length


def test_unknown_suite_lists_the_known_ones() -> None:
    with pytest.raises(UserError) as exc:
        resolve_suite("humaneavl")
    assert "unknown suite 'humaneavl'" in exc.value.message
    assert "humaneval" in (exc.value.hint or "") and "pp{N}" in (exc.value.hint or "")


def test_a_path_and_the_extra_suites_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helpers) -> None:
    path = helpers.write_suite(tmp_path / "extra", "gsm8k", name="gsm8k-mini", selection__sample_size=3)
    assert resolve_suite(str(path)).spec.selection.sample_size == 3
    monkeypatch.setenv("LUCEBENCH_SUITES_DIR", str(tmp_path / "extra"))
    assert resolve_suite("gsm8k-mini").path == path
    assert resolve_suite("humaneval").spec.name == "humaneval"  # the repository's suites stay visible


def test_a_file_whose_name_differs_from_its_suite_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  helpers) -> None:
    path = helpers.write_suite(tmp_path / "extra", "gsm8k", name="other")
    path.rename(tmp_path / "extra" / "mine.yaml")
    monkeypatch.setenv("LUCEBENCH_SUITES_DIR", str(tmp_path / "extra"))
    with pytest.raises(UserError, match="declares name 'other'"):
        resolve_suite("mine")
