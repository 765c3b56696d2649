"""`lucebench run` with a `synth: {format: gguf}` model: the random GGUF is written into the cache, prompts get
their ids from the tokenizer.json beside it, `ar` runs the file, and the result says synthetic weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from lucebench.models.shapes import _qwen3_5
from lucebench.results.schema import Result


def test_run_on_a_synthetic_gguf(tmp_path):
    shape = tmp_path / "tiny-gguf.json"  # every row a whole number of 256-element blocks (Q8_0 needs 32)
    shape.write_text(json.dumps(_qwen3_5(n_layers=4, hidden=256, intermediate=512, vocab=1088, heads=2, kv_heads=1,
                                         head_dim=128, lin_k_heads=2, lin_v_heads=4, lin_k_dim=64, lin_v_dim=64,
                                         tied=False, max_pos=4096, eos=1024, mrope=[11, 11, 10])))
    config = tmp_path / "gguf.yaml"
    config.write_text(textwrap.dedent(f"""\
        name: gguf-test
        backend: cpu
        models:
          tiny: {{synth: {{config: {shape}, seed: 0, format: gguf, quant: q8_0}}}}
        matrix: {{engine: [ar], model: [tiny], suite: [needle], context: [512]}}
        suites: {{needle: {{n_gen: 4, sample_size: 1}}}}
        measure: {{repetitions: 1, warmups: 0, timeout_s: 300}}
        """))
    out = tmp_path / "out"
    cache = tmp_path / "cache"
    engines = Path(os.environ.get("LUCEBENCH_CACHE", "") or Path.cwd() / ".cache" / "lucebench") / "build"
    cache.mkdir()
    (cache / "build").symlink_to(engines)  # the CPU engine build, shared; the models cache is this test's
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "LUCEBENCH_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "lucebench", "run", str(config), "--out", str(out), "--no-report"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = Result.model_validate_json((out / "results.json").read_text())
    (cell,) = result.cells
    assert cell.status == "ok", cell.error
    assert cell.model.synthetic and cell.model.path.endswith("model-q8_0.gguf")
    assert cell.samples[0].n_prompt == 512 and cell.samples[0].n_gen >= 1
    gguf_dir = Path(cell.model.path).parent
    assert (gguf_dir / "tokenizer.json").is_file() and gguf_dir.parent == cache / "models"
