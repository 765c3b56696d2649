"""The runner's GPU path against a simulated NVML GPU (lucebench.measure.fake): power-limit cells are
skipped unless both the config and the flag allow them, applied and restored when they do, and energy
per phase lands in the result. No real GPU setting is ever touched here."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from lucebench.config import load_config
from lucebench.measure import nvml as nvml_module
from lucebench.measure.fake import FakeGpu, FakeNvmlBackend
from lucebench.measure.nvml import Nvml
from lucebench.runner.run import Runner, RunOptions

FAKE_ENGINE = str(Path(__file__).with_name("fake_engine.py"))


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    backend = FakeNvmlBackend([FakeGpu(power=lambda t: 250.0, counter_period_s=0.02)])
    monkeypatch.setattr(nvml_module, "_default", Nvml(backend))
    monkeypatch.setenv("LUCEBENCH_BACKEND", "cuda")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the power-limit journal goes under ~/.local/state
    # no torch copy on this machine: the datasheet bandwidth of the card's name is used
    return backend


def _config(tmp_path: Path, model: Path, allow: bool) -> Path:
    argv = json.dumps([sys.executable, FAKE_ENGINE, "--model", "{model}", "--decode-s-per-token", "0.01"])
    text = textwrap.dedent(f"""\
        name: gpu-double
        backend: cuda
        gpu: {{name: H200, arch: "90"}}
        models:
          tiny: {{path: {model}}}
        engines:
          fake: {{type: external, options: {{argv: {argv}}}}}
        matrix:
          engine: [fake]
          model: [tiny]
          suite: [tg32]
          power_limit_w: [null, 300]
        measure: {{repetitions: 2, warmups: 1, min_energy_window_s: 0.5, max_extension_s: 10}}
        power: {{allow_set_limit: {str(allow).lower()}, idle_s: 0.2}}
        """)
    path = tmp_path / "gpu.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from lucebench.models.shapes import get_shape
    from lucebench.models.synth import synthesize

    out = tmp_path_factory.mktemp("models") / "tiny"
    synthesize(get_shape("tiny"), out, seed=0, dtype="fp32")
    return out


def _run(tmp_path: Path, model: Path, *, allow_config: bool, allow_flag: bool):
    loaded = load_config(_config(tmp_path, model, allow_config))
    out = tmp_path / f"out-{allow_config}-{allow_flag}"
    summary = Runner(loaded, RunOptions(out_dir=out, allow_power_limit=allow_flag, report=False)).run()
    return summary, {c.id: c for c in json_result(out).cells}


def json_result(out: Path):
    from lucebench.results.schema import Result

    return Result.model_validate_json((out / "results.json").read_text())


def test_power_limit_cells_need_config_and_flag(fake_gpu, tmp_path, tiny_model):
    summary, cells = _run(tmp_path, tiny_model, allow_config=True, allow_flag=False)
    assert summary.ok == 1 and summary.skipped == 1 and summary.exit_code == 0
    skipped = cells["fake/tiny/tg32/pl300W"]
    assert skipped.status == "skipped" and "--allow-power-limit" in skipped.error.message
    assert fake_gpu.set_calls == []  # nothing was ever set
    ok = cells["fake/tiny/tg32"]
    assert ok.power.limit_w == 700.0 and ok.power.idle_power_w == pytest.approx(250.0)
    # energy per phase from the simulated counter, tok/J derived from it
    assert ok.metrics["decode_tok_per_j"].median == pytest.approx(1 / (250.0 * 0.01), rel=0.15)
    assert ok.power_trace


def test_power_limit_applied_then_restored(fake_gpu, tmp_path, tiny_model):
    summary, cells = _run(tmp_path, tiny_model, allow_config=True, allow_flag=True)
    assert summary.ok == 2
    limited = cells["fake/tiny/tg32/pl300W"]
    assert limited.power.applied and limited.power.requested_limit_w == 300 and limited.power.limit_w == 300
    assert [mw for _, mw in fake_gpu.set_calls] == [300_000, 700_000]  # applied, then restored on exit
    assert fake_gpu.gpus[0].limit_mw == 700_000


def test_resume_keeps_the_runs_idle_power(fake_gpu, tmp_path, tiny_model):
    """A --resume on the same machine subtracts the idle power the run's first cells measured, not a new reading."""
    loaded = load_config(_config(tmp_path, tiny_model, allow=True))
    out = tmp_path / "out-resume"
    first = Runner(loaded, RunOptions(out_dir=out, only="fake/tiny/tg32", report=False)).run()
    assert first.ok == 1
    fake_gpu.gpus[0].power = lambda t: 150.0  # the card now reads lower at rest
    second = Runner(loaded, RunOptions(out_dir=out, resume=True, allow_power_limit=True, report=False)).run()
    assert second.reused == 1 and second.ok == 1
    cells = {c.id: c for c in json_result(out).cells}
    assert cells["fake/tiny/tg32"].power.idle_power_w == pytest.approx(250.0)
    assert cells["fake/tiny/tg32/pl300W"].power.idle_power_w == pytest.approx(250.0)
    # and a new run measures it afresh
    fresh = tmp_path / "out-fresh"
    Runner(loaded, RunOptions(out_dir=fresh, only="fake/tiny/tg32", report=False)).run()
    assert json_result(fresh).cells[0].power.idle_power_w == pytest.approx(150.0)


def test_other_processes_on_the_gpu_are_recorded_and_warned(fake_gpu, tmp_path, tiny_model):
    # a process left on the card (here pid 2**22 + 7, which no machine runs) time-slices with the engine: the
    # cell records it and the console says so; this process itself is not "other"
    import io
    import os

    from rich.console import Console

    fake_gpu.gpus[0].processes = [(os.getpid(), 500 * 2**20), (2**22 + 7, 2340 * 2**20)]
    loaded = load_config(_config(tmp_path, tiny_model, allow=False))
    out = tmp_path / "out-procs"
    buf = io.StringIO()
    Runner(loaded, RunOptions(out_dir=out, allow_power_limit=False, report=False),
           console=Console(file=buf, width=400)).run()
    cells = {c.id: c for c in json_result(out).cells}
    measured = [c for c in cells.values() if c.status == "ok"]
    assert measured
    for cell in measured:
        assert cell.power.other_gpu_processes == [f"pid {2**22 + 7} (not visible from here) (2340 MiB)"]
    assert "other processes compute on GPU 0 before its engine ran" in buf.getvalue()
    assert f"pid {os.getpid()}" not in buf.getvalue()


def test_a_clean_gpu_records_no_other_processes(fake_gpu, tmp_path, tiny_model):
    _, cells = _run(tmp_path, tiny_model, allow_config=False, allow_flag=False)
    assert all(c.power.other_gpu_processes == [] for c in cells.values() if c.status == "ok")
