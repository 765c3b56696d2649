"""Every config under configs/ validates and dry-runs; the DFlash and PFlash configs name the weights they would
fetch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lucebench.config.load import load_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def _dry_run(path: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    # A dry run prints the plan of a GPU config on any machine (a warning says this one cannot run it).
    return subprocess.run([sys.executable, "-m", "lucebench", "run", str(path), "--dry-run", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "250", "HF_HUB_OFFLINE": "1",
                               "LUCEBENCH_CACHE": str(tmp_path / "cache")})


def test_configs_are_found():
    assert {p.name for p in CONFIGS} >= {"cpu-smoke.yaml", "rtx3090.yaml", "rtx3090-synthetic.yaml",
                                         "h100-dflash.yaml", "h200-dflash.yaml", "cpu-dflash.yaml",
                                         "cpu-dflash-reference.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_validates_and_dry_runs(path, tmp_path):
    load_config(path)
    proc = _dry_run(path, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "cells on" in proc.stderr
    assert not (tmp_path / "out").exists()  # a plan writes nothing


@pytest.mark.parametrize("name", ["rtx3090.yaml", "h100-dflash.yaml", "h200-dflash.yaml"])
def test_dflash_configs_show_the_published_weights(name, tmp_path):
    text = " ".join(_dry_run(CONFIGS[0].parent / name, tmp_path).stderr.split())
    assert "model qwen3.5-27b-q4km: hub unsloth/Qwen3.5-27B-GGUF file Qwen3.5-27B-Q4_K_M.gguf" in text
    assert "draft qwen3.5-27b-dflash: hub z-lab/Qwen3.5-27B-DFlash" in text
    assert "lucebench models fetch unsloth/Qwen3.5-27B-GGUF --include Qwen3.5-27B-Q4_K_M.gguf" in text
    assert "lucebench models fetch z-lab/Qwen3.5-27B-DFlash" in text
    assert "lucebench models fetch Qwen/Qwen3.5-27B --include 'tokenizer*'" in text
    # The DFlash cells of a GPU config run on cuda: built like the other bundled engines.
    assert "dflash runs on" not in text
    assert "builds (cuda): ar, dflash, llama.cpp" in text
    for suite in ("humaneval", "gsm8k", "math500"):
        assert f"dflash/qwen3.5-27b-q4km/{suite}/kvbf16/b22" in text
        assert f"dflash-chain/qwen3.5-27b-q4km/{suite}/kvbf16/b40" in text
        assert f"ar/qwen3.5-27b-q4km/{suite}/kvbf16" in text and f"llama.cpp-gguf/qwen3.5-27b-q4km/{suite}" in text
    assert "dflash/qwen3.5-27b-q4km/tg256/ctx131072/kvq4_0/b22" in text


@pytest.mark.parametrize("name", ["rtx3090.yaml", "rtx3090-synthetic.yaml"])
def test_pflash_table_of_the_rtx3090_configs(name, tmp_path):
    """64K and 128K, keep 0.05 and 0.02, against llama.cpp's full prefill with flash attention on the same GGUF
    and KV type; the pflash cells run on the GPU (none skipped for the engine's backend)."""
    config = load_config(CONFIGS[0].parent / name).config
    cells = [c for c in config.include if c.get("suite") == "needle-lucebox"]
    pflash = {(c["context"], c["keep_ratio"]) for c in cells if c["engine"] == "pflash"}
    assert pflash == {(65536, 0.05), (65536, 0.02), (131072, 0.05), (131072, 0.02)}
    full = [c for c in cells if c["engine"] != "pflash"]
    assert {c["context"] for c in full} == {65536, 131072}
    assert {c["kv"] for c in cells} == {"q4_0"} and len({c["model"] for c in cells}) == 1
    for c in full:
        variant = config.engines[c["engine"]]
        assert variant.type == "llama.cpp" and variant.options["flash_attn"] is True
    text = " ".join(_dry_run(CONFIGS[0].parent / name, tmp_path).stderr.split())
    assert "pflash runs on" not in text
    if name == "rtx3090.yaml":  # the real published weights
        assert ("model qwen3.6-27b-q4km: hub unsloth/Qwen3.6-27B-GGUF file Qwen3.6-27B-Q4_K_M.gguf, prompts "
                "tokenised by Qwen/Qwen3.6-27B") in text
        assert "drafter qwen3-0.6b: hub Qwen/Qwen3-0.6B" in text
        assert "lucebench models fetch unsloth/Qwen3.6-27B-GGUF --include Qwen3.6-27B-Q4_K_M.gguf" in text
        assert "lucebench models fetch Qwen/Qwen3-0.6B" in text
    for ctx in (65536, 131072):
        for keep in (0.05, 0.02):
            assert f"pflash/{cells[0]['model']}/needle-lucebox/ctx{ctx}/kvq4_0/k{keep:g}" in text


@pytest.mark.parametrize("name", ["rtx3090-synthetic.yaml", "h100-dflash-synthetic.yaml",
                                  "h200-dflash-synthetic.yaml"])
def test_synthetic_twins_use_random_weights(name, tmp_path):
    """One random Q4_K_M GGUF target that ar, dflash and llama.cpp all read (no conversion), a draft sized from it,
    and forced-acceptance cells whose budget can commit the forced AL (at most min(budget, 15) + 1 a round)."""
    from lucebench.matrix import expand

    config = load_config(CONFIGS[0].parent / name).config
    assert all(source.synth is not None for source in config.models.values())
    assert "SYNTHETIC" in config.description
    cells = expand(config, "cuda")
    (target,) = {c.model for c in cells}
    assert config.models[target].synth.format == "gguf" and config.models[target].synth.quant == "q4_k_m"
    types = {c.engine_type for c in cells}
    assert {"ar", "llama.cpp", "dflash"} <= types
    for variant in config.engines.values():
        assert "gguf" not in variant.options  # llama.cpp runs the target's own file
        draft = variant.options.get("draft")
        if draft is not None:
            assert config.models[draft].synth.draft_for == target
    forced = [c for c in cells if config.engines.get(c.engine) and
              config.engines[c.engine].options.get("force_accept_length")]
    budgets = set()
    for c in forced:
        options = config.engines[c.engine].options
        budget = c.budget or options.get("budget") or 15
        assert options["force_accept_length"] <= min(budget, 15) + 1, c.id
        budgets.add(budget)
        assert c.engine_type == "dflash"
    assert len(budgets) >= 6 and {8, 22} <= budgets  # the budget sweep
    for suite in ("humaneval", "gsm8k", "math500"):  # the DFlash table: AR, llama.cpp and DFlash per dataset
        for engine in ("ar", "llama.cpp-gguf", "dflash-forced"):
            assert any(c.engine == engine and c.suite == suite for c in cells), (engine, suite)
    text = " ".join(_dry_run(CONFIGS[0].parent / name, tmp_path).stderr.split())
    assert f"model {target}: synthetic qwen3.5-27b seed 0 q4_k_m GGUF" in text
    assert f"DFlash draft for {target}" in text and "lucebench models fetch" not in text
