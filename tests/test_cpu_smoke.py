"""The README's main job on a CPU-only machine: configs/cpu-smoke.yaml end to end, every engine, the
result validated and the report rendered. Slow-ish (builds the C++ engine once; llama.cpp when present)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lucebench.results.schema import Result

REPO = Path(__file__).resolve().parents[1]


def _lucebench(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucebench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.slow
def test_cpu_smoke_config_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = _lucebench("run", "configs/cpu-smoke.yaml", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = Result.model_validate_json((out / "results.json").read_text())
    assert result.complete
    engines = {c.params["engine"] for c in result.cells}
    assert {"ar", "hf", "llama.cpp"} <= engines
    for cell in result.cells:
        assert cell.status == "ok", (cell.id, cell.error)
        assert cell.samples and cell.metrics
        assert cell.model.synthetic and cell.model.files
    # every engine saw the same token ids: equal workload identity per suite
    by_suite: dict[str, set[str]] = {}
    for cell in result.cells:
        by_suite.setdefault(cell.params["suite"], set()).add(cell.workload.identity)
    assert all(len(ids) == 1 for ids in by_suite.values()), by_suite
    # ar against the HF baseline on the same weights: speedups and token agreement are computed
    ar_gsm = next(c for c in result.cells if c.params["engine"] == "ar" and c.params["suite"] == "gsm8k")
    assert ar_gsm.metrics["speedup_decode"].median > 0
    assert ar_gsm.metrics["token_match_pct"].median >= 99.0, ar_gsm.checks.get("lossless")
    # llama.cpp on the same weights (converted to GGUF F32) generates the same greedy tokens
    for cell in result.cells:
        if cell.params["engine"] == "llama.cpp" and "token_match_pct" in cell.metrics:
            assert cell.metrics["token_match_pct"].median >= 99.0, (cell.id, cell.checks.get("lossless"))
    # the result validates and the report was written
    check = _lucebench("validate", str(out / "results.json"))
    assert check.returncode == 0, check.stdout + check.stderr
    report = (out / "report" / "report.md").read_text()
    assert "ar" in report and "synthetic weights" in report
    assert (out / "report" / "index.html").exists()
    assert json.loads((out / "results.json").read_text())["schema"] == "lucebench.result/v1"
