"""Fixtures shared by tests/results and tests/reports: fabricated results (tests/results/fabricate.py) and a
CLI runner. In the tests root so both folders see them."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def load_fabricate() -> ModuleType:
    """Import tests/results/fabricate.py by path (pytest runs in importlib mode: no package imports)."""
    name = "lucebench_test_fabricate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "results" / "fabricate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fab() -> ModuleType:
    return load_fabricate()


@pytest.fixture
def write_result(tmp_path: Path) -> Callable[..., Path]:
    """Write a Result (or raw JSON text) to a file under tmp_path and return its path."""
    def write(result: object, name: str = "results.json") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = result if isinstance(result, str) else result.model_dump_json(by_alias=True, indent=1)  # type: ignore[attr-defined]
        path.write_text(text, encoding="utf-8")
        return path
    return write


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run `lucebench ARGS` in-process through the real entry point; returns (exit code, stdout, stderr)."""
    from lucebench.cli import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        code = 0
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err
    return run
