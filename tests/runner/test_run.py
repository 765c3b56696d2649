"""`lucebench run` end to end through the command line, with a protocol-speaking fake engine.

The fake engine makes crash, hang and garbage cases cheap; the real engines run in tests/test_cpu_smoke.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lucebench.results.schema import Result

FAKE = str(Path(__file__).with_name("fake_engine.py"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from lucebench.models.shapes import get_shape
    from lucebench.models.synth import synthesize

    out = tmp_path_factory.mktemp("models") / "tiny"
    synthesize(get_shape("tiny"), out, seed=0, dtype="fp32")
    return out


def _config(tmp_path: Path, model: Path, *, engines: dict[str, list[str]] | None = None, extra: str = "",
            suites: str = "[pp16, tg8]", backend: str = "cpu") -> Path:
    engines = engines or {"fake": []}
    engine_yaml = "".join(
        f"  {name}:\n    type: external\n    options:\n      argv: {json.dumps([sys.executable, FAKE, '--model', '{model}', *args])}\n"
        for name, args in engines.items())
    text = textwrap.dedent(f"""\
        name: t
        backend: {backend}
        models:
          tiny: {{path: {model}}}
        engines:
        """) + engine_yaml + textwrap.dedent(f"""\
        matrix:
          engine: {json.dumps(list(engines))}
          model: [tiny]
          suite: {suites}
        measure:
          repetitions: 2
          warmups: 1
          request_timeout_s: 5
          timeout_s: 60
        """) + extra
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucebench", "run", *args, "--no-report"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def _result(out: Path) -> Result:
    return Result.model_validate_json((out / "results.json").read_text())


def test_all_cells_ok(tmp_path, tiny_model):
    out = tmp_path / "out"
    proc = _run(str(_config(tmp_path, tiny_model)), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = _result(out)
    assert result.complete and [c.status for c in result.cells] == ["ok", "ok"]
    pp, tg = result.cells
    assert pp.id == "fake/tiny/pp16" and pp.workload.n_gen == 1
    assert len(pp.samples) == 2 and pp.samples[0].n_prompt == 16
    assert pp.metrics["prefill_tok_s"].median > 0
    assert tg.metrics["decode_tok_s"].n == 2 and tg.samples[0].n_gen == 9
    assert result.environment.power_available is False
    assert "decode_j" not in tg.metrics  # no GPU: energy is unavailable, never 0
    assert Path(tg.log_file).exists()


def test_crash_and_hang_fail_their_cells_and_the_run_goes_on(tmp_path, tiny_model):
    out = tmp_path / "out"
    cfg = _config(tmp_path, tiny_model, engines={"crashy": ["--mode", "crash-after", "--after", "2"],
                                                 "hangs": ["--mode", "hang-after", "--after", "1"],
                                                 "garbage": ["--mode", "garbage"], "fake": []}, suites="[pp16]")
    proc = _run(str(cfg), "--out", str(out))
    assert proc.returncode == 1
    cells = {c.params["engine"]: c for c in _result(out).cells}
    assert cells["fake"].status == "ok"
    assert cells["crashy"].status == "failed" and cells["crashy"].error.exit_code == 3
    assert "simulated crash" in cells["crashy"].error.stderr_tail
    assert len(cells["crashy"].samples) == 1  # the sample measured before the crash is kept
    assert cells["hangs"].error.kind == "timeout"
    assert cells["garbage"].error.kind == "protocol"
    assert "crashy" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_after_kill_keeps_finished_cells(tmp_path, tiny_model):
    out = tmp_path / "out"
    cfg = _config(tmp_path, tiny_model, engines={"fast": [], "slow": ["--decode-s-per-token", "0.5"]},
                  suites="[tg8]")
    proc = subprocess.Popen([sys.executable, "-m", "lucebench", "run", str(cfg), "--out", str(out), "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    # results.json exists from before the preparation on; wait for the first finished cell in it
    while time.monotonic() < deadline and not ((out / "results.json").exists()
                                               and "fast/tiny/tg8" in (out / "results.json").read_text()):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: harness and engine, as a crash would
    proc.wait()
    first = _result(out)
    assert [c.id for c in first.cells] == ["fast/tiny/tg8"]
    again = _run(str(cfg), "--out", str(out))
    assert "results.json already exists" in again.stderr and again.returncode == 2
    resumed = _run(str(cfg), "--out", str(out), "--resume", "--only", "fast/*,slow/*")
    assert resumed.returncode == 0, resumed.stderr
    final = _result(out)
    assert [c.id for c in final.cells] == ["fast/tiny/tg8", "slow/tiny/tg8"]
    assert final.cells[0].finished == first.cells[0].finished  # reused, not re-measured
    assert "1 reused" in resumed.stderr


def test_resume_on_another_machine_keeps_the_earlier_environment(tmp_path, tiny_model):
    out = tmp_path / "out"
    cfg = _config(tmp_path, tiny_model, suites="[pp16, tg8]")
    first = _run(str(cfg), "--out", str(out), "--only", "fake/tiny/pp16")
    assert first.returncode == 0, first.stderr
    # as if the first call had run on another (lent) machine
    data = json.loads((out / "results.json").read_text())
    data["environment"]["hostname"] = "lent-machine-1"
    (out / "results.json").write_text(json.dumps(data))
    resumed = _run(str(cfg), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming on another machine" in resumed.stderr
    final = _result(out)
    pp, tg = final.cells
    assert pp.environment_id is not None and tg.environment_id is None
    assert final.environment_of(pp).hostname == "lent-machine-1"
    assert final.environment_of(tg).hostname == final.environment.hostname != "lent-machine-1"
    check = subprocess.run([sys.executable, "-m", "lucebench", "validate", str(out / "results.json")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_ctrl_c_keeps_what_was_measured(tmp_path, tiny_model):
    out = tmp_path / "out"
    # 3.5 s a request: the cell (a warm-up and two repetitions) cannot end before the signal, however fast start-up is
    cfg = _config(tmp_path, tiny_model, engines={"slow": ["--decode-s-per-token", "0.5"]}, suites="[tg8]")
    # SIGINT as a terminal's Ctrl-C, also when pytest runs in the background of a shell without job control
    # (which starts it, and so this child, with SIGINT ignored)
    proc = subprocess.Popen([sys.executable, "-m", "lucebench", "run", str(cfg), "--out", str(out), "--no-report"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(6)  # start-up and part of the cell
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    cell = _result(out).cells[0]
    assert cell.status == "failed" and cell.error.kind == "interrupted"


def test_user_errors_exit_2_without_traceback(tmp_path, tiny_model):
    # unwritable output folder
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _run(str(_config(tmp_path, tiny_model)), "--out", str(blocker / "out"))
    assert proc.returncode == 2 and "not writable" in proc.stderr and "Traceback" not in proc.stderr
    # missing model path: named with its config key
    proc = _run(str(_config(tmp_path, tmp_path / "no-such-model")), "--out", str(tmp_path / "o1"))
    assert proc.returncode == 2 and "no-such-model" in proc.stderr and "Traceback" not in proc.stderr
    # a CUDA config on a machine without an NVIDIA GPU
    if subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode != 0:
        proc = _run(str(_config(tmp_path, tiny_model, backend="cuda")), "--out", str(tmp_path / "o2"))
        assert proc.returncode == 2 and "needs an NVIDIA GPU" in proc.stderr
    # unknown suite
    proc = _run(str(_config(tmp_path, tiny_model, suites="[nosuchsuite]")), "--out", str(tmp_path / "o3"))
    assert proc.returncode == 2 and "nosuchsuite" in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_prints_the_plan(tmp_path, tiny_model):
    proc = _run(str(_config(tmp_path, tiny_model)), "--dry-run", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "fake/tiny/pp16" in proc.stderr and "estimated time" in proc.stderr
    assert not (tmp_path / "o" / "results.json").exists()
