"""`lucebench build`: what it builds by default, and a clear refusal for an engine the backend cannot run."""

from __future__ import annotations

from lucebench.cli.build_cmd import default_engines


def test_default_engines_are_what_the_default_run_needs():
    assert default_engines("cpu") == ["ar", "llama.cpp"]
    assert default_engines("cuda") == ["ar", "megakernel", "llama.cpp"]


def _help_text(cli, *argv: str) -> str:
    code, out, _ = cli([*argv, "--help"])
    assert code == 0
    return " ".join(w for w in out.replace("│", " ").split())


def test_help_names_the_default_engines(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    text = _help_text(cli, "build")
    assert "ar and llama.cpp, and megakernel on cuda" in text and "all bundled engines" not in text


def test_megakernel_for_cpu_is_refused_before_building(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCEBENCH_CACHE", str(tmp_path))
    code, _, err = cli(["build", "megakernel", "--backend", "cpu"])
    assert code == 2 and "megakernel runs only on cuda" in err and "nothing to build" in err
    assert not (tmp_path / "build").exists()


def test_flags_show_no_value_type(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    text = _help_text(cli, "run")
    assert "<bool>" not in text and "--resume keep finished cells" in text
    assert "--out <path>" in text  # options that take a value keep their type
