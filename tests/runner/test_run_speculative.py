"""A speculative cell's second model (draft or drafter) is resolved, hashed and recorded like the first; an
engine type without an executable fails the run with one clear message; dflash runs for real; typed engine
options."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lucebench.results.schema import Result

FAKE = str(Path(__file__).with_name("fake_engine.py"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from lucebench.models.shapes import get_shape
    from lucebench.models.synth import synthesize

    out = tmp_path_factory.mktemp("models") / "tiny-odd"
    synthesize(get_shape("tiny-odd"), out, seed=0, dtype="fp32")
    return out


def _config(tmp_path: Path, model: Path) -> Path:
    text = textwrap.dedent(f"""\
        name: spec
        backend: cpu
        models:
          target: {{path: {model}}}
          draft: {{synth: {{draft_for: target, seed: 1, dtype: fp32}}}}
        engines:
          dflash-tree: {{type: dflash, options: {{draft: draft, budget: 22, top_k: 3, chain_seed: false}}}}
          dflash-chain: {{type: dflash, options: {{draft: draft, verify: chain}}}}
        matrix:
          engine: [dflash-tree, dflash-chain]
          model: [target]
          suite: [tg8]
          budget: [null, 8]
        measure: {{repetitions: 2, warmups: 0, timeout_s: 60, request_timeout_s: 10}}
        """)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def _pflash_config(tmp_path: Path, model: Path) -> Path:
    """pflash: an engine type whose executable engines/ does not build yet."""
    text = textwrap.dedent(f"""\
        name: spec
        backend: cpu
        models:
          target: {{path: {model}}}
          drafter: {{synth: {{shape: tiny-qwen3-odd, seed: 1, dtype: fp32}}}}
        engines:
          pf: {{type: pflash, options: {{drafter: drafter, keep_ratio: 0.5}}}}
        matrix:
          engine: [pf]
          model: [target]
          suite: [tg8]
        measure: {{repetitions: 2, warmups: 0, timeout_s: 60, request_timeout_s: 10}}
        """)
    path = tmp_path / "pflash.yaml"
    path.write_text(text)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucebench", "run", *args, "--no-report"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200",
                                                       "LUCEBENCH_CACHE": os.environ.get("LUCEBENCH_CACHE", "")
                                                       or str(Path.cwd() / ".cache" / "lucebench")})


def test_dflash_runs_with_a_synthetic_draft(tmp_path, tiny_model):
    """The real lucebench-dflash on the CPU: a target and its synthetic draft, tree and chain cells."""
    cfg = _config(tmp_path, tiny_model)
    plan = _cli(str(cfg), "--dry-run", "--out", str(tmp_path / "out"))
    assert plan.returncode == 0, plan.stderr
    text = " ".join(plan.stderr.split())
    assert "draft draft: synthetic DFlash draft for target seed 1 fp32" in text
    proc = _cli(str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    result = Result.model_validate_json((tmp_path / "out" / "results.json").read_text())
    cells = {c.id: c for c in result.cells}
    assert set(cells) == {"dflash-tree/target/tg8/kvbf16/b22", "dflash-tree/target/tg8/kvbf16/b8",
                          "dflash-chain/target/tg8/kvbf16", "dflash-chain/target/tg8/kvbf16/b8"}
    for cell in cells.values():
        spec = cell.samples[0].spec
        assert spec is not None and sum(spec.al_histogram) == spec.draft_steps >= 1
    # top_k and chain_seed: chosen in the config (engine.build), used by the engine (its ready line).
    tree = cells["dflash-tree/target/tg8/kvbf16/b22"]
    assert tree.engine.build["options"] == {"draft": "draft", "budget": 22, "top_k": 3, "chain_seed": False}
    assert tree.engine.ready["engine"]["options"]["top_k"] == 3
    assert tree.engine.ready["engine"]["options"]["chain_seed"] is False
    chain = cells["dflash-chain/target/tg8/kvbf16"].engine.ready["engine"]["options"]
    assert chain["chain_seed"] is True and chain["top_k"] == 1


def test_dflash_runs_with_a_gguf_draft(tmp_path, tiny_model):
    """A `models:` entry that is a GGUF draft (`models convert-draft`) serves as a dflash cell's draft; one for
    another target is a config error before any cell runs."""
    from lucebench.models.dflash_draft import synthesize_draft
    from lucebench.models.dflash_gguf import convert_draft

    synthesize_draft(tiny_model, tmp_path / "st", seed=1, dtype="fp32")
    gguf_draft = convert_draft(tmp_path / "st", tmp_path / "draft.gguf", wtype="bf16").path
    cfg = _config(tmp_path, tiny_model)
    text = cfg.read_text().replace("draft: {synth: {draft_for: target, seed: 1, dtype: fp32}}",
                                   f"draft: {{path: {gguf_draft}}}")
    cfg.write_text(text.replace("engine: [dflash-tree, dflash-chain]", "engine: [dflash-chain]"))
    proc = _cli(str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    result = Result.model_validate_json((tmp_path / "out" / "results.json").read_text())
    cell = result.cells[0]
    assert cell.engine.ready["engine"]["options"]["draft_format"] == "gguf"
    assert cell.samples[0].spec is not None and cell.samples[0].spec.draft_steps >= 1

    other = tmp_path / "other"
    synthesize_draft(tiny_model, other, seed=1, dtype="fp32")
    c = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**c, "dflash_config": {**c["dflash_config"],
                                                                         "mask_token_id": c["vocab_size"] + 5},
                                                   "vocab_size": c["vocab_size"] + 10}))
    convert_draft(other, tmp_path / "other.gguf")
    cfg.write_text(cfg.read_text().replace(str(gguf_draft), str(tmp_path / "other.gguf")))
    proc = _cli(str(cfg), "--out", str(tmp_path / "out2"))
    assert proc.returncode != 0 and "does not fit target" in proc.stderr and "mask_token_id" in proc.stderr, proc.stderr


def test_second_model_is_resolved_hashed_recorded_and_passed(tmp_path, tiny_model, monkeypatch):
    """With an executable standing in for dflash (the protocol fake), the whole path runs in process."""
    from typer.testing import CliRunner

    from lucebench.cli import app
    from lucebench.engines import registry
    from lucebench.engines.registry import EngineLaunch, _bundled_argv

    seen: list[list[str]] = []

    def launch(req):
        flags = _bundled_argv(Path(FAKE), req)[1:]
        seen.append(flags)
        return EngineLaunch(argv=[sys.executable, FAKE, *flags], build={"fake": True})

    monkeypatch.setitem(registry.ENGINE_TYPES, "dflash", dataclasses.replace(registry.ENGINE_TYPES["dflash"],
                                                                             launch=launch))
    monkeypatch.setenv("LUCEBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(_config(tmp_path, tiny_model)), "--out", str(out), "--no-report"])
    assert res.exit_code == 0, res.output
    result = Result.model_validate_json((out / "results.json").read_text())
    cells = {c.id: c for c in result.cells}
    assert set(cells) == {"dflash-tree/target/tg8/kvbf16/b22", "dflash-tree/target/tg8/kvbf16/b8",
                          "dflash-chain/target/tg8/kvbf16", "dflash-chain/target/tg8/kvbf16/b8"}
    cell = cells["dflash-tree/target/tg8/kvbf16/b22"]
    draft = cell.draft_model
    assert draft is not None and draft.name == "draft" and draft.synthetic
    assert set(draft.files) == {"config.json", "model.safetensors", "lucebench_synth.json"}
    assert all(len(h) == 64 for h in draft.files.values())
    assert json.loads((Path(draft.path) / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    assert cell.model.name == "target" and cell.params["budget"] == 22
    # The engine got the draft's folder and the cell's budget; the chain variant --chain and no budget.
    # (The preparation before the first cell launches each engine once more, to build it, without a model.)
    cell_launches = [f for f in seen if "--draft" in f]
    assert len(cell_launches) == 4
    tree = next(f for f in cell_launches if "--budget" in f and f[f.index("--budget") + 1] == "22")
    assert tree[tree.index("--draft") + 1] == draft.path and "--chain" not in tree
    assert tree[tree.index("--top-k") + 1] == "3" and tree[tree.index("--chain-seed") + 1] == "off"
    chain = [f for f in cell_launches if "--chain" in f]
    assert len(chain) == 2 and any("--budget" not in f for f in chain)
    # The reply's spec counts became typed samples and metrics: 8 decode tokens in rounds of 3, 3 and 2.
    assert cell.samples[0].spec.al_histogram == [0, 0, 1, 2] and cell.metrics["acceptance_length"].median == 8 / 3


def test_dflash_cells_on_a_backend_it_does_not_compute_on_are_skipped(tmp_path, tiny_model, monkeypatch):
    """lucebench-dflash computes on the cpu backend only: on another backend its cells are skipped with the
    reason (here: the engine type told it runs on cuda only), nothing is built for it, the run goes on."""
    from typer.testing import CliRunner

    from lucebench.cli import app
    from lucebench.engines import registry

    def launch(req):
        raise AssertionError("a skipped engine is neither built nor launched")

    monkeypatch.setitem(registry.ENGINE_TYPES, "dflash", dataclasses.replace(
        registry.ENGINE_TYPES["dflash"], launch=launch, runs_on=frozenset({"cuda"})))
    monkeypatch.setenv("LUCEBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(_config(tmp_path, tiny_model)), "--out", str(out), "--no-report"])
    assert res.exit_code == 0, res.output
    result = Result.model_validate_json((out / "results.json").read_text())
    assert len(result.cells) == 4
    for cell in result.cells:
        assert cell.status == "skipped" and cell.error is not None
        assert cell.error.message == ("dflash runs on the cuda backend only so far; its cpu cells are skipped "
                                      "(docs/engines.md)")
    plan = CliRunner().invoke(app, ["run", str(_config(tmp_path, tiny_model)), "--dry-run", "--out", str(out)])
    assert plan.exit_code == 0 and "4 of 4 cells will be skipped: dflash runs on the cuda backend only" in " ".join(
        plan.output.split())
