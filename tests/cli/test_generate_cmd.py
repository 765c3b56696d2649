"""`lucebench generate`: each invocation has its own engine log, so an error never shows another call's output."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from lucebench.engines import registry

FAKE = str(Path(__file__).parents[1] / "runner" / "fake_engine.py")


def test_each_call_gets_its_own_log(cli, tmp_path, monkeypatch):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    marker = {"text": ""}

    def launch(req: registry.LaunchRequest) -> registry.EngineLaunch:
        code = (f"import sys; print({marker['text']!r}, file=sys.stderr); sys.exit(3)")
        return registry.EngineLaunch(argv=[sys.executable, "-c", code])

    fake = dataclasses.replace(registry.ENGINE_TYPES["external"], launch=launch)
    monkeypatch.setitem(registry.ENGINE_TYPES, "external", fake)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    errs = []
    for text in ("first-call-traceback", "second-call-error"):
        marker["text"] = text
        code, _, err = cli(["generate", "--engine", "external", "--model", str(model), "--prompt-ids", "1,2",
                            "--backend", "cpu"])
        assert code == 1
        errs.append(" ".join(err.split()))
    assert "second-call-error" in errs[1] and "first-call-traceback" not in errs[1]
    logs = sorted(tmp_path.glob("lucebench-generate-external-*.log"))
    assert len(logs) == 2 and "whole log of this call" in errs[1]
