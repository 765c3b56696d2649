"""lucebench.engines.cmake: the one arch contract and the shared build steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebench.engines import cmake
from lucebench.errors import UserError


def test_cuda_arch_forms_and_range() -> None:
    assert cmake.normalize_cuda_arch("sm_90") == "90" and cmake.normalize_cuda_arch("9.0") == "90"
    assert cmake.normalize_cuda_arch("90a, 120") == "90a;120"
    for bad in ("hopper", "sm_61", "130", ""):
        with pytest.raises(UserError):
            cmake.normalize_cuda_arch(bad)


def test_resolve_arch_validates_what_is_given() -> None:
    assert cmake.resolve_arch("cpu", None) is None
    assert cmake.resolve_arch("cuda", "sm_86") == "86"
    assert cmake.resolve_arch("hip", "gfx1100") == "gfx1100"
    with pytest.raises(UserError):
        cmake.resolve_arch("hip", "sm_90")
    with pytest.raises(UserError):
        cmake.resolve_arch("metal", None)


def test_logged_steps_and_failure_tail(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    assert cmake.run_logged(["sh", "-c", "echo compiling; echo 'x.cu: error: bad' >&2; exit 3"], log) == 3
    text = log.read_text()
    assert text.startswith("$ sh -c") and "x.cu: error: bad" in text and "[exit 3]" in text
    log.write_text("\n".join(["a: error: first"] + [f"line {i}" for i in range(40)]))
    tail = cmake.log_tail(log, n=5)
    assert tail.splitlines()[0] == "a: error: first" and tail.splitlines()[-1] == "line 39"


def test_build_jobs_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUCEBENCH_BUILD_JOBS", "3")
    assert cmake.build_jobs() == 3 and cmake.build_jobs(5) == 5
    monkeypatch.delenv("LUCEBENCH_BUILD_JOBS")
    assert 1 <= cmake.build_jobs() <= cmake.MAX_DEFAULT_JOBS


def test_tree_hash_follows_sources_not_builds(tmp_path: Path) -> None:
    (tmp_path / "a.cpp").write_text("int a;")
    (tmp_path / "notes.md").write_text("x")
    first = cmake.tree_hash(tmp_path, {".cpp"})
    (tmp_path / "notes.md").write_text("y")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gen.cpp").write_text("int g;")
    assert cmake.tree_hash(tmp_path, {".cpp"}) == first
    (tmp_path / "a.cpp").write_text("int b;")
    assert cmake.tree_hash(tmp_path, {".cpp"}) != first
