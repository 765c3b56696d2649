"""`lucebench models synth|shapes` through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}  # rich would wrap messages at 80 columns otherwise
    return subprocess.run([sys.executable, "-m", "lucebench", *args], capture_output=True, text=True, timeout=300,
                          check=False, env=env)


def test_synth_command_writes_a_checkpoint(tmp_path):
    out = tmp_path / "tiny"
    proc = _cli("models", "synth", "--shape", "tiny", "--out", str(out), "--seed", "5", "--dtype", "fp16")
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "lucebench_synth.json"} <= names
    prov = json.loads((out / "lucebench_synth.json").read_text())
    assert (prov["seed"], prov["dtype"], prov["layout"]) == (5, "fp16", "text")
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"


def test_synth_command_from_config_and_errors(tmp_path):
    from lucebench.models.shapes import get_shape

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(get_shape("tiny").config))
    proc = _cli("models", "synth", "--config", str(cfg), "--out", str(tmp_path / "m"), "--layout", "multimodal")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "qwen3_5"

    bad = _cli("models", "synth", "--shape", "nope", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "unknown model shape" in bad.stderr and "Traceback" not in bad.stderr
    both = _cli("models", "synth", "--out", str(tmp_path / "x"))
    assert both.returncode == 2 and "exactly one" in both.stderr
    (tmp_path / "broken.json").write_text("{nope")
    broken = _cli("models", "synth", "--config", str(tmp_path / "broken.json"), "--out", str(tmp_path / "x"))
    assert broken.returncode == 2 and "not JSON" in broken.stderr and "Traceback" not in broken.stderr


def test_shapes_command_lists_the_shapes():
    proc = _cli("models", "shapes", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["qwen3.5-0.8b"]["config"]["hidden_size"] == 1024
    assert "tiny" in data and "qwen3-0.6b" in data


def test_synth_refuses_to_replace_a_model_without_force(tmp_path):
    out = tmp_path / "tiny"
    assert _cli("models", "synth", "--shape", "tiny", "--out", str(out)).returncode == 0
    before = (out / "model.safetensors").read_bytes()
    proc = _cli("models", "synth", "--shape", "tiny", "--out", str(out), "--seed", "9")
    assert proc.returncode == 2 and "already holds a model" in proc.stderr and "--force" in proc.stderr
    assert (out / "model.safetensors").read_bytes() == before
    proc = _cli("models", "synth", "--shape", "tiny", "--out", str(out), "--seed", "9", "--force")
    assert proc.returncode == 0 and (out / "model.safetensors").read_bytes() != before
