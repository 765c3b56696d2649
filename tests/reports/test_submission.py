"""`lucebench submit`: validate, then file under results/<gpu-slug>/<date>-<engines>-<id>.json."""

from __future__ import annotations

import hashlib

import pytest

from lucebench.errors import UserError
from lucebench.reports.submission import engines_slug, gpu_slug, main, submit


def test_layout_and_idempotence(fab, write_result, tmp_path):
    src = write_result(fab.gpu_result(gpu="NVIDIA H200"))
    done = submit(src, tmp_path / "results")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:8]
    assert done.path == tmp_path / "results" / "nvidia-h200" / f"2026-05-01-ar+dflash+hf+llamacpp+more-{digest}.json"
    assert done.path.read_bytes() == src.read_bytes() and not done.existed
    assert submit(src, tmp_path / "results").existed


def test_slugs(fab):
    assert gpu_slug(fab.gpu_result()) == "nvidia-geforce-rtx-3090"
    assert gpu_slug(fab.cpu_result()) == "amd-ryzen-9-5950x"
    assert engines_slug(fab.cpu_result()) == "ar"


def test_invalid_file_is_refused_with_its_problems(fab, write_result, tmp_path):
    r = fab.cpu_result()
    r.cells[0].metrics["prefill_tok_s"].median = 1.0
    with pytest.raises(UserError) as exc:
        submit(write_result(r), tmp_path / "results")
    assert exc.value.exit_code == 1 and "$.cells[0].metrics.prefill_tok_s.median" in exc.value.message
    assert not (tmp_path / "results").exists()


def test_cli(fab, write_result, cli, tmp_path):
    cpu = fab.cpu_result()  # a CPU run of a real-size model is a measurement, not a smoke run
    cpu.config.content = {"name": "cpu-real", "models": {"synthetic-tiny": {"synth": {"shape": "qwen3-0.6b"}}}}
    src = write_result(cpu)
    code, out, _ = cli(["submit", str(src), "--results-dir", str(tmp_path / "results")])
    assert code == 0 and "submitted:" in out
    assert len(list((tmp_path / "results" / "amd-ryzen-9-5950x").glob("2026-05-01-ar-*.json"))) == 1


def test_slug_entry_point(fab, write_result, capsys):
    assert main(["slug", str(write_result(fab.gpu_result()))]) == 0
    assert capsys.readouterr().out.strip() == "nvidia-geforce-rtx-3090"
    assert main(["nonsense"]) == 2


def test_unfinished_dirty_and_smoke_runs_are_refused(fab, write_result, tmp_path):
    unfinished = fab.gpu_result()
    unfinished.complete = False
    dirty = fab.gpu_result()
    dirty.environment.lucebench_dirty = True
    for result, why in ((unfinished, "unfinished"), (dirty, "uncommitted changes"), (fab.cpu_result(), "smoke run")):
        with pytest.raises(UserError) as exc:
            submit(write_result(result), tmp_path / "results")
        assert why in str(exc.value) and exc.value.exit_code == 1
    assert not (tmp_path / "results").exists()


def test_a_submission_says_what_it_is(fab, write_result, tmp_path, cli):
    code, out, _ = cli(["submit", str(write_result(fab.gpu_result(gpu="NVIDIA H200"))), "--results-dir",
                        str(tmp_path / "results")])
    assert code == 0
    assert "what it is: NVIDIA H200; engines ar, dflash, hf, llamacpp, more;" in " ".join(out.split())
    assert "workloads gsm8k, humaneval, math500, niah, pp520, tg128" in " ".join(out.split())
