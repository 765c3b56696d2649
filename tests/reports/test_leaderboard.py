"""`lucebench leaderboard`: cross-card tables and plots; invalid files skipped with a reason."""

from __future__ import annotations

from lucebench.reports.leaderboard import build_leaderboard
from lucebench.reports.submission import submit


def test_cross_card_leaderboard(fab, write_result, tmp_path, cli):
    results = tmp_path / "results"
    submit(write_result(fab.gpu_result(seed=1), "a.json"), results)
    submit(write_result(fab.gpu_result(seed=2, gpu="NVIDIA H200", failures=False), "b.json"), results)
    # a smoke run placed there by hand (submit refuses it): the leaderboard keeps it out too
    smoke = write_result(fab.cpu_result(), "c.json")
    (results / "amd-ryzen").mkdir()
    (results / "amd-ryzen" / "smoke.json").write_bytes(smoke.read_bytes())
    (results / "nvidia-h200" / "junk.json").write_text('{"schema": "lucebench.result/v1"}')
    files = build_leaderboard(results, tmp_path / "lb")
    assert len(files.included) == 2
    assert [s.path.name for s in files.skipped] == ["smoke.json", "junk.json"]
    assert "smoke run" in files.skipped[0].reason and "validation error" in files.skipped[1].reason
    md = files.markdown.read_text()
    assert "## Decode tok/s by card" in md and "## Decode tok/J by card" in md
    assert "| Engine · model · workload | NVIDIA GeForce RTX 3090 | NVIDIA H200 |" in md
    row = next(line for line in md.splitlines() if line.startswith("| megakernel · qwen3.5-0.8b · tg128"))
    assert "@ 300 W" in row  # best decode tok/s was at the 300 W limit
    # like with like: a pp520 cell's decode is never ranked beside a tg128 one
    assert any(line.startswith("| megakernel · qwen3.5-0.8b · pp520") for line in md.splitlines())
    assert "## Skipped files" in md and "junk.json" in md
    assert {p.name for p in files.plots} == {"decode_tok_s.png", "decode_tok_per_j.png"}
    assert all(p.stat().st_size > 1000 for p in files.plots)

    code, out, _ = cli(["leaderboard", str(results), "--out", str(tmp_path / "lb2")])
    assert code == 0 and "skipped" in out and (tmp_path / "lb2" / "index.html").is_file()


def test_missing_results_dir_is_a_user_error(cli, tmp_path):
    code, _, err = cli(["leaderboard", str(tmp_path / "nope"), "--out", str(tmp_path / "lb")])
    assert code == 2 and "no such folder" in " ".join(err.split())
