"""A bundled engine's knobs reach the result: `lucebench run` with the real CPU `ar` engine and LB_* variables
set finds the knob in the cell's engine record (from the ready line's engine.tuning), the stray variable in
the engine's warnings, and both in the environment record (docs/engines.md, "Knobs")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from lucebench.results.schema import Result


@pytest.mark.slow
def test_knob_and_stray_variable_recorded(tmp_path):
    from lucebench.models.shapes import get_shape
    from lucebench.models.synth import synthesize

    model = tmp_path / "tiny"
    synthesize(get_shape("tiny"), model, seed=0, dtype="fp32")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        name: knobs
        backend: cpu
        models:
          tiny: {{path: {model}}}
        matrix:
          engine: [ar]
          model: [tiny]
          suite: [tg8]
        measure:
          repetitions: 1
          warmups: 0
          timeout_s: 300
        """))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    env.update({"COLUMNS": "200", "OMP_NUM_THREADS": "1", "LB_GV_TILE": "8192", "LB_NOT_A_KNOB": "1"})
    proc = subprocess.run([sys.executable, "-m", "lucebench", "run", str(cfg), "--out", str(out), "--no-report"],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = Result.model_validate_json((out / "results.json").read_text())
    (cell,) = result.cells
    assert cell.status == "ok", cell.error
    tuning = cell.engine.tuning
    assert tuning is not None and tuning["gemv_tile_bytes"] == 8192 and tuning["set"] == ["LB_GV_TILE"], tuning
    assert tuning["gpu_pdl"] is True  # every knob is recorded, set or not
    assert any("LB_NOT_A_KNOB" in w and "ignored" in w for w in cell.engine.warnings), cell.engine.warnings
    assert "LB_NOT_A_KNOB" in proc.stderr  # and said on the console
    assert result.environment.lb_env == {"LB_GV_TILE": "8192", "LB_NOT_A_KNOB": "1"}
