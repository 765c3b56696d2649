"""The CI workflows do what docs/reports.md promises (actionlint itself runs in CI: scripts/ci/lint_workflows.sh)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def _steps(job: dict) -> list[dict]:
    return job["steps"]


def test_nightly_runs_compares_uploads_always_and_fails_on_regression():
    wf = _load("nightly.yml")
    job = wf["jobs"]["nightly"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    runs = "\n".join(s.get("run", "") for s in _steps(job))
    assert "make setup" in runs
    assert 'lucebench run configs/nightly.yaml --out "$OUT"' in runs and job["env"]["OUT"] == "out/nightly"
    assert "results/baselines/${slug}.json" in runs and "lucebench compare" in runs
    upload = next(s for s in _steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    fail = _steps(job)[-1]
    assert fail["if"].startswith("always()") and "exit 1" in fail["run"]
    # The failing step comes after the upload, so the report is published even on a regression.
    assert _steps(job).index(upload) < _steps(job).index(fail)


def test_pr_validates_changed_results_rebuilds_leaderboard_and_lints():
    wf = _load("pr.yml")
    runs = "\n".join(s.get("run", "") for job in wf["jobs"].values() for s in _steps(job))
    assert "lucebench validate" in runs and "git diff --name-only" in runs
    assert "lucebench leaderboard results --out reports/leaderboard" in runs
    assert "scripts/ci/install_chromium.sh" in runs and "scripts/ci/lint_workflows.sh" in runs
    assert (ROOT / "scripts" / "ci" / "lint_workflows.sh").stat().st_mode & 0o111
    assert (ROOT / "scripts" / "ci" / "install_chromium.sh").stat().st_mode & 0o111
