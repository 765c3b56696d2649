"""`lucebench run` of a tiny CPU PFlash config (synthetic weights) with a needle suite: the pflash cell gets
the drafter's fields, records its compressed-prefill counts and each needle's survival from the kept ranges,
and the report has the compressed-prefill and retention tables with that data, the answers scored with and
without compression."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from lucebench.results.schema import Result


def test_pflash_run_fills_the_compressed_prefill_and_retention_tables(tmp_path):
    config = tmp_path / "pflash.yaml"
    config.write_text(textwrap.dedent("""\
        name: pflash-test
        description: synthetic weights
        backend: cpu
        models:
          tiny: {synth: {shape: tiny, seed: 0, dtype: fp32}}
          drafter: {synth: {shape: tiny-qwen3-odd, seed: 1, dtype: fp32}}
        engines:
          pflash: {type: pflash, options: {drafter: drafter, keep_ratio: 0.1, min_prompt_tokens: 0,
                                           drafter_sparse_from: 1024, drafter_sparse_budget: 0.2,
                                           drafter_kv: f16}}
        matrix: {engine: [ar, pflash], model: [tiny], suite: [needle], context: [2048]}
        suites: {needle: {n_gen: 4, sample_size: 2}}
        measure: {repetitions: 1, warmups: 0, timeout_s: 300}
        baseline: ar
        score: true
        """))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200",
           "LUCEBENCH_CACHE": os.environ.get("LUCEBENCH_CACHE", "") or str(Path.cwd() / ".cache" / "lucebench")}
    proc = subprocess.run([sys.executable, "-m", "lucebench", "run", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = Result.model_validate_json((out / "results.json").read_text())
    cell = next(c for c in result.cells if c.params["engine"] == "pflash")
    assert cell.status == "ok" and cell.params["keep_ratio"] == 0.1
    options = cell.engine.ready["engine"]["options"]  # the options reached the engine
    assert options["min_prompt_tokens"] == 0 and options["drafter_sparse_from"] == 1024
    assert options["drafter_sparse_budget"] == 0.2 and options["drafter_sparse_alpha"] == 0.85
    assert cell.engine.build["options"]["drafter_sparse_from"] == 1024  # and the config's choice is recorded
    # the cell's kv is the target's (the default here); the drafter's cache type is its own option
    assert options["drafter_kv"] == cell.engine.build["options"]["drafter_kv"] == "f16" and options["kv_k"] == "bf16"
    for s in cell.samples:
        pf = s.prefill
        assert pf is not None and pf.prompt_tokens == s.n_prompt == 2048 and pf.compressed is True
        assert 0 < pf.kept_tokens_target < pf.prompt_tokens and pf.kept_tokens_drafter and pf.drafter_prompt_tokens
        assert pf.needles_kept is not None and len(pf.needles_kept) == 1 and pf.needle_depths is not None
        assert set(pf.time_ms) == {"score", "select", "bridge", "target_prefill"}
        assert pf.drafter_attention_read is not None and 0 < pf.drafter_attention_read < 1  # block-sparse drafter
    assert cell.metrics["kept_pct"].median < 100 and cell.metrics["needle_retention_pct"].median is not None
    assert len(cell.samples) == 2  # sample_size: the first 2 of the suite's 5 cases at 2,048
    # score: true scores needle answers too, with and without compression
    for c in result.cells:
        assert c.metrics["accuracy"].median is not None and set(c.checks["scores"]) == set(c.workload.prompt_ids)
    report = (out / "report" / "report.md").read_text()
    compressed = report.split("## Compressed prefill")[1].split("##")[0]
    retention = report.split("## Needle retention")[1].split("##")[0]
    assert "| 2,048 | pflash |" in compressed and "| 2,048 | pflash |" in retention
    assert "n/a | n/a" not in compressed  # the full prefill partner (the ar cell) is found
    assert "Accuracy, compressed | Accuracy, full prompt |" in retention
    assert json.loads((out / "results.json").read_text())["cells"]
