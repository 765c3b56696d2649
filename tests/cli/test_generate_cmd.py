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


def test_speculative_flags(cli, tmp_path, monkeypatch):
    """--draft/--budget/--chain reach a dflash engine as flags and `spec` comes back; other engines refuse
    them by name; an engine without an executable (pflash) says so."""
    import json

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    draft = tmp_path / "d"
    draft.mkdir()
    args = ["generate", "--model", str(model), "--prompt-ids", "1,2,3", "--n-gen", "8", "--backend", "cpu"]
    code, _, err = cli([*args, "--engine", "ar", "--budget", "22"])
    assert code == 2 and "engine 'ar' takes no --budget" in " ".join(err.split()) and "dflash" in err
    code, _, err = cli([*args, "--engine", "dflash", "--budget", "22"])
    assert code == 2 and "needs --draft" in err
    code, _, err = cli([*args, "--engine", "ar", "--top-k", "3"])
    assert code == 2 and "engine 'ar' takes no --top-k" in " ".join(err.split())
    code, _, err = cli([*args, "--engine", "dflash", "--draft", str(draft), "--chain-seed", "maybe"])
    assert code == 2 and "--chain-seed is on or off" in err

    seen = []

    def launch(req: registry.LaunchRequest) -> registry.EngineLaunch:
        flags = registry._bundled_argv(Path(FAKE), req)[1:]
        seen.append(flags)
        return registry.EngineLaunch(argv=[sys.executable, FAKE, *flags])

    monkeypatch.setitem(registry.ENGINE_TYPES, "dflash", dataclasses.replace(registry.ENGINE_TYPES["dflash"],
                                                                             launch=launch))
    code, out, err = cli([*args, "--engine", "dflash", "--draft", str(draft), "--budget", "22", "--chain", "--json"])
    assert code == 0, err
    flags = seen[-1]
    assert flags[flags.index("--draft") + 1] == str(draft) and flags[flags.index("--budget") + 1] == "22"
    assert "--chain" in flags and "--top-k" not in flags and "--chain-seed" not in flags
    assert json.loads(out)["spec"]["accepted_tokens"] == 7
    code, out, err = cli([*args, "--engine", "dflash", "--draft", str(draft), "--top-k", "3", "--chain-seed", "off"])
    assert code == 0, err
    flags = seen[-1]
    assert flags[flags.index("--top-k") + 1] == "3" and flags[flags.index("--chain-seed") + 1] == "off"
