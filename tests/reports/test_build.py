"""`lucebench report`: report.md, PNGs and index.html from result files."""

from __future__ import annotations

import re

from PIL import Image

from lucebench.reports import cells as C
from lucebench.reports.build import build_report


def test_gpu_report_files(fab, tmp_path):
    files = build_report([fab.gpu_result()], tmp_path / "rep")
    md = files.markdown.read_text()
    for title in ("Throughput and energy", "Power-limit sweep", "Speculative decoding", "DDTree budget sweep",
                  "Acceptance per draft depth", "Long context", "Compressed prefill: time to first token by context",
                  "Needle retention in the compressed prompt", "Failed and skipped cells",
                  "Environment: NVIDIA GeForce RTX 3090"):
        assert f"## {title}" in md
    names = {p.name for p in files.plots}
    assert {"throughput.png", "power_sweep.png", "speedup_by_dataset.png", "budget_sweep.png", "acceptance.png",
            "context_sweep.png", "ttft_vs_length.png", "roofline.png"} <= names
    assert any(n.startswith("power_") and n != "power_sweep.png" for n in names)
    for p in files.plots:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.width > 100 and im.height > 100
    # Every image the page references exists, by relative path.
    html = files.html.read_text()
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert sorted(srcs) == sorted(names)
    assert all((files.out_dir / s).is_file() for s in srcs)
    assert "synthetic weights" in html and "CUDA out of memory" in html


def test_cpu_report_has_a_plot_and_na_energy(fab, tmp_path):
    files = build_report([fab.cpu_result()], tmp_path / "rep")
    assert [p.name for p in files.plots] == ["throughput.png"]
    md = files.markdown.read_text()
    assert "n/a" in md and "none (CPU run; power unavailable)" in md
    assert files.tables == ["throughput"]


def test_report_cli(fab, write_result, cli, tmp_path):
    path = write_result(fab.cpu_result(), "run/results.json")
    code, _, err = cli(["report", str(path), "--out", str(tmp_path / "out")])
    assert code == 0, err
    assert (tmp_path / "out" / "index.html").is_file() and (tmp_path / "out" / "report.md").is_file()
    code, _, _ = cli(["report", str(path.parent)])  # a run folder; default output next to it
    assert code == 0 and (path.parent / "report" / "index.html").is_file()


def test_report_cli_malformed_file_is_a_clean_error(write_result, cli):
    path = write_result('{"schema": "lucebench.result/v1", "cells": [}')
    code, out, err = cli(["report", str(path)])
    assert code == 2
    assert f"{path}:1:" in err and "Traceback" not in err + out


def test_incomplete_run_is_noted(fab, tmp_path):
    r = fab.cpu_result()
    r.complete = False
    files = build_report([r], tmp_path / "rep")
    assert "incomplete" in files.markdown.read_text()


def test_write_report_for_the_runner(fab, write_result, tmp_path):
    from lucebench.reports import write_report

    path = write_result(fab.cpu_result(), "run/results.json")
    files = write_report([path], path.parent)
    assert files.html == path.parent / "report" / "index.html" and files.html.is_file()


def test_speculative_plots_only_where_their_cells_exist(fab, tmp_path):
    from lucebench.reports import cells as C
    from lucebench.reports.plots import acceptance_by_depth, ttft_vs_length

    views = C.collect([fab.gpu_result()])
    assert ttft_vs_length(views, tmp_path).file == "ttft_vs_length.png"
    assert acceptance_by_depth(views, tmp_path).file == "acceptance.png"
    without = [v for v in views if "keep_ratio" not in v.cell.params and "budget" not in v.cell.params]
    assert ttft_vs_length(without, tmp_path / "x") is None and acceptance_by_depth(without, tmp_path / "x") is None


def test_ttft_plot_takes_one_point_per_length_over_several_suites(fab, tmp_path):
    """Several needle variants at one length (the reference PFlash config): one point per method and length,
    their median, said in the caption; a plain run's caption says nothing of suites."""
    from lucebench.reports.plots import ttft_vs_length

    result = fab.gpu_result()
    extra = []
    for c in result.cells:
        if c.params.get("suite") == "niah":
            o = c.model_copy(deep=True)
            o.id = c.id + "-code"
            o.params["suite"] = "niah-code"
            if o.workload is not None:
                o.workload = o.workload.model_copy(update={"suite": "niah-code"})
            extra.append(o)
    plain = ttft_vs_length(C.collect([fab.gpu_result()]), tmp_path / "a")
    assert "suites" not in plain.caption
    result.cells += extra
    plot = ttft_vs_length(C.collect([result]), tmp_path / "b")
    assert plot is not None and "the median over the suites niah, niah-code" in plot.caption
    assert (tmp_path / "b" / "ttft_vs_length.png").stat().st_size > 0


def test_every_figure_names_the_weights_that_produced_it(fab):
    from lucebench.reports.plots import weights_note

    views = C.collect([fab.gpu_result()])
    synthetic = [v for v in views if v.cell.model is not None and v.cell.model.synthetic]
    trained = [v for v in views if v.cell.model is not None and not v.cell.model.synthetic]
    assert synthetic and trained
    assert weights_note(synthetic).startswith("SYNTHETIC weights (random: speed only): ")
    assert weights_note(trained).startswith("weights: ") and "SYNTHETIC" not in weights_note(trained)
    assert "some SYNTHETIC" in weights_note(synthetic[:1] + trained[:1])
    assert weights_note([]) == ""


def test_budget_sweep_plot_marks_a_forced_al(fab, tmp_path):
    """The sweep's AL panel would show a forced AL (dflash --force-accept-length) as a flat line that reads like
    a measured acceptance: its series and the caption say it is the benchmark's setting."""
    from lucebench.reports.plots import budget_sweep

    result = fab.gpu_result()
    measured = budget_sweep(C.collect([result]), tmp_path / "m")
    assert measured is not None and "forced" not in measured.caption
    for c in result.cells:
        if c.params.get("engine") == "dflash" and "budget" in c.params:
            for s in c.samples:
                s.spec.forced_acceptance_length = 8.31
    forced = budget_sweep(C.collect([result]), tmp_path / "f")
    assert forced is not None and "'AL forced'" in forced.caption and "not a measured AL" in forced.caption
