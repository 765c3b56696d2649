"""Fixtures for the engine tests: the CPU `ar`, `dflash` and `pflash` engines built once per session, and a
protocol client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # qwen35_synth, gguf_writer


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """The test models are tiny: one thread each for torch and the engine beats fighting over a busy CPU."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ar_exe() -> Path:
    """The CPU build of lucebench-ar (cached across sessions by source hash)."""
    from lucebench.engines.build import build_engine

    return build_engine("ar", backend="cpu")


@pytest.fixture(scope="session")
def dflash_exe() -> Path:
    """The CPU build of lucebench-dflash (cached across sessions by source hash)."""
    from lucebench.engines.build import build_engine

    return build_engine("dflash", backend="cpu")


@pytest.fixture(scope="session")
def pflash_exe() -> Path:
    """The CPU build of lucebench-pflash (cached across sessions by source hash)."""
    from lucebench.engines.build import build_engine

    return build_engine("pflash", backend="cpu")


class Engine:
    """An engine subprocess driven through docs/protocol.md."""

    def __init__(self, exe: Path, model: Path, *extra: str):
        self.proc = subprocess.Popen([str(exe), "--model", str(model), *extra], stdin=subprocess.PIPE,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = self.read()

    def read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        assert line, f"engine closed stdout; stderr:\n{self.proc.stderr.read()}"
        return json.loads(line)

    def send(self, obj: dict[str, Any] | str) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def generate(self, prompt: list[int], n_gen: int, **kw: Any) -> dict[str, Any]:
        self.send({"type": "generate", "id": kw.pop("id", "r"), "prompt_ids": prompt, "n_gen": n_gen, **kw})
        return self.read()

    def close(self) -> int:
        if self.proc.poll() is None:
            self.send({"type": "shutdown"})
            self.proc.wait(timeout=30)
        return self.proc.returncode


@pytest.fixture
def engine(ar_exe):
    """Factory: engine(model_dir, *flags) -> a started Engine, shut down after the test."""
    started: list[Engine] = []

    def start(model: Path, *extra: str) -> Engine:
        e = Engine(ar_exe, model, *extra)
        started.append(e)
        return e

    yield start
    for e in started:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()
