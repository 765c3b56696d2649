"""The preparation phase of `lucebench run`: builds and conversions before any cell's clock starts, with their
own time limit; a Ctrl-C during them leaves a run that --resume finishes. Also --resume of a missing folder and
the mode of results.json."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lucebench.config import load_config
from lucebench.engines import registry
from lucebench.errors import UserError
from lucebench.runner.run import Runner, RunOptions

FAKE = str(Path(__file__).with_name("fake_engine.py"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from lucebench.models.shapes import get_shape
    from lucebench.models.synth import synthesize

    out = tmp_path_factory.mktemp("models") / "tiny"
    synthesize(get_shape("tiny"), out, seed=0, dtype="fp32")
    return out


def _config(tmp_path: Path, model: Path, *, timeout_s: float = 60, prepare_timeout_s: float = 600) -> Path:
    argv = json.dumps([sys.executable, FAKE, "--model", "{model}"])
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: t
        backend: cpu
        models:
          tiny: {{path: {model}}}
        engines:
          slowbuild: {{type: external, options: {{argv: {argv}}}}}
        matrix:
          engine: [slowbuild]
          model: [tiny]
          suite: [pp16]
        measure:
          repetitions: 1
          warmups: 0
          timeout_s: {timeout_s}
          prepare_timeout_s: {prepare_timeout_s}
        """))
    return path


class _Build:
    """An engine type whose first launch takes `seconds` (a build) or raises (Ctrl-C), later ones are cached."""

    def __init__(self, seconds: float = 0.0, interrupt_first: bool = False, compile_in_child: bool = False):
        self.seconds, self.interrupt_first, self.calls, self.built = seconds, interrupt_first, 0, False
        self.compile_in_child = compile_in_child  # a shell whose own child sleeps, as cmake runs the compilers
        self.child: subprocess.Popen | None = None

    def launch(self, req: registry.LaunchRequest) -> registry.EngineLaunch:
        self.calls += 1
        if not self.built:
            if self.interrupt_first and self.calls == 1:
                raise KeyboardInterrupt
            if self.compile_in_child:
                self.child = subprocess.Popen(["sh", "-c", f"sleep {self.seconds}; true"])
                self.child.wait()
            else:
                time.sleep(self.seconds)
            self.built = True
        return registry._launch_external(req)


@pytest.fixture
def slow_build(monkeypatch):
    def install(build: _Build) -> _Build:
        fake = dataclasses.replace(registry.ENGINE_TYPES["external"], kind="bundled", launch=build.launch)
        monkeypatch.setitem(registry.ENGINE_TYPES, "external", fake)
        return build
    return install


def _runner(cfg: Path, out: Path, **options) -> Runner:
    return Runner(load_config(cfg), RunOptions(out_dir=out, report=False, **options))


def test_a_build_longer_than_the_cell_timeout_is_not_the_cells_time(tmp_path, tiny_model, slow_build):
    build = slow_build(_Build(seconds=4.0))
    summary = _runner(_config(tmp_path, tiny_model, timeout_s=3), tmp_path / "out").run()
    assert summary.failed == 0 and summary.ok == 1, summary.failures
    assert build.built and build.calls == 2  # prepared once, then the cell's launch read the cache


def test_preparation_has_its_own_time_limit(tmp_path, tiny_model, slow_build):
    build = slow_build(_Build(seconds=30.0, compile_in_child=True))
    t0 = time.monotonic()
    summary = _runner(_config(tmp_path, tiny_model, prepare_timeout_s=1), tmp_path / "out").run()
    assert time.monotonic() - t0 < 20
    assert build.child is not None and build.child.poll() is not None  # the "compiler" was stopped too
    assert summary.failed == 1
    [line] = summary.failures
    assert "build:" in line and "preparation time limit (1 s" in line and "timeout (" not in line


def test_ctrl_c_during_preparation_then_resume_finishes(tmp_path, tiny_model, slow_build):
    build = slow_build(_Build(interrupt_first=True))
    cfg, out = _config(tmp_path, tiny_model), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _runner(cfg, out).run()
    assert (out / "results.json").exists()  # a run to resume, with nothing measured yet
    summary = _runner(cfg, out, resume=True).run()
    assert summary.ok == 1 and summary.failed == 0 and build.built


def test_resume_of_a_folder_without_a_run_refuses(tmp_path, tiny_model):
    out = tmp_path / "no-such-run"
    with pytest.raises(UserError) as exc:
        _runner(_config(tmp_path, tiny_model), out, resume=True).run()
    assert "no results.json" in str(exc.value) and exc.value.exit_code == 2
    assert not out.exists()


def test_results_json_gets_the_umask_mode(tmp_path, tiny_model):
    old = os.umask(0o022)
    try:
        _runner(_config(tmp_path, tiny_model), tmp_path / "out").run()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out" / "results.json").stat().st_mode) == 0o644


def test_cpu_cells_record_the_machines_load(tmp_path, tiny_model):
    from lucebench.results.io import load_result

    _runner(_config(tmp_path, tiny_model), tmp_path / "out").run()
    [cell] = load_result(tmp_path / "out" / "results.json").cells
    assert cell.cpu_load is not None and cell.cpu_load.cpu_count == os.cpu_count() and cell.cpu_load.window_s > 0


def test_ctrl_c_while_models_are_prepared_then_resume_finishes(tmp_path, tiny_model, monkeypatch):
    from lucebench.runner import prepare

    real_get, calls = prepare.ModelCache.get, {"n": 0}

    def get(self, name):
        calls["n"] += 1
        if calls["n"] == 1:  # as if Ctrl-C arrived while a synthetic checkpoint was being written
            raise KeyboardInterrupt
        return real_get(self, name)

    monkeypatch.setattr(prepare.ModelCache, "get", get)
    cfg, out = _config(tmp_path, tiny_model), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _runner(cfg, out).run()
    assert (out / "results.json").exists()
    assert _runner(cfg, out, resume=True).run().ok == 1
