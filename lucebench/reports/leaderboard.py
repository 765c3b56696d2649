"""`lucebench leaderboard`: a cross-card comparison of everything submitted under results/.

Invalid files are skipped with the reason listed on the page (and returned), never silently.
Per card and engine (and model) the leaderboard shows the best decode tok/s and the best decode tok/J
over that card's synthetic throughput cells, each with its spread and the power limit it was reached at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lucebench.errors import UserError
from lucebench.reports import cells as C
from lucebench.reports.cells import CellView
from lucebench.reports.fmt import NA, fmt_summary
from lucebench.reports.plots import Plot, grouped_bars
from lucebench.reports.render import Page, page_html, page_markdown
from lucebench.reports.submission import submission_problems
from lucebench.reports.tables import Table
from lucebench.results.io import load_result
from lucebench.results.validate import errors, validate_file


@dataclass(frozen=True)
class Skipped:
    """A file left out of the leaderboard and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class LeaderboardFiles:
    """What `build_leaderboard` wrote and what it skipped."""

    markdown: Path
    html: Path
    plots: list[Path]
    included: list[Path]
    skipped: list[Skipped]


def _best(views: Sequence[CellView], metric: str) -> CellView | None:
    cands = [v for v in views if v.median(metric) is not None]
    return max(cands, key=lambda v: v.median(metric) or 0.0) if cands else None


def _row_key(v: CellView) -> tuple[str, str, str]:
    """(model, workload, engine): a row compares cards on one engine, one model and one workload, never across."""
    model = str(v.cell.params.get("model", v.cell.model.name if v.cell.model else "?"))
    return model, str(v.cell.params.get("suite", "?")), v.engine


def _row_label(key: tuple[str, str, str]) -> str:
    model, suite, engine = key
    return f"{engine} · {model} · {suite}"


def _at(v: CellView) -> str:
    lim = C.power_limit_of(v)
    return f" @ {lim:g} W" if lim is not None else ""


def build_leaderboard(results_dir: Path, out_dir: Path) -> LeaderboardFiles:
    """Validate and read every results_dir/**/*.json, then write leaderboard.md, index.html and plots."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    if not results_dir.is_dir():
        raise UserError("no such folder", where=str(results_dir), hint="pass the results/ folder of the repository")
    included, skipped, results = [], [], []
    for path in sorted(results_dir.rglob("*.json")):
        errs = errors(validate_file(path))
        if errs:
            skipped.append(Skipped(path, f"{len(errs)} validation error(s), first: {errs[0]}"))
            continue
        result = load_result(path)
        refused = submission_problems(result)
        if refused:
            skipped.append(Skipped(path, "; ".join(refused)))
            continue
        results.append(result)
        included.append(path)
    views = [v for v in C.collect(results) if v.ok and not C.is_speculative(v) and not C.is_context(v)
             and not C.is_dataset(v)]
    cards = sorted({v.card for v in views})
    groups: dict[tuple[str, str], list[CellView]] = {}
    for v in views:
        groups.setdefault((_row_label(_row_key(v)), v.card), []).append(v)
    rows_labels = [_row_label(k) for k in sorted({_row_key(v) for v in views})]
    tables: list[Table] = []
    plot_data: dict[str, tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]] = {}
    for metric, title in (("decode_tok_s", "Decode tok/s by card"), ("decode_tok_per_j", "Decode tok/J by card"),
                          ("prefill_tok_s", "Prefill tok/s by card")):
        rows, vals, errs_ = [], {}, {}
        for label in rows_labels:
            row = [label]
            for card in cards:
                best = _best(groups.get((label, card), []), metric)
                row.append(fmt_summary(best.metric(metric), metric) + _at(best) if best else NA)
                if best is not None:
                    m = best.metric(metric)
                    vals.setdefault(label, {})[card] = best.median(metric) or 0.0
                    errs_.setdefault(label, {})[card] = (m.stddev or 0.0) if m else 0.0
            rows.append(row)
        if vals:
            tables.append(Table(metric, title, ["Engine · model · workload"] + cards, rows,
                                notes=[("each row is one engine on one model and one workload, so a column ranks "
                                        "like with like; best median over the card's submitted cells of it, with "
                                        "its spread and the power limit it was measured at; smoke runs, unfinished "
                                        "runs and runs of uncommitted code are not listed")]))
            plot_data[metric] = (vals, errs_)
    tables.append(Table("submissions", "Submissions", ["File", "Card", "Run", "Created", "lucebench commit"],
                        [[str(p.relative_to(results_dir)), C.card_name(r), r.run_id, r.created,
                          (r.environment.lucebench_commit or r.lucebench_version)[:12]]
                         for p, r in zip(included, results)]))
    if skipped:
        tables.append(Table("skipped", "Skipped files", ["File", "Reason"],
                            [[str(s.path.relative_to(results_dir)), s.reason] for s in skipped]))
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: list[Plot] = []
    for metric, ylabel in (("decode_tok_s", "decode tok/s"), ("decode_tok_per_j", "decode tok/J")):
        if metric in plot_data:
            vals, errs_ = plot_data[metric]
            name = grouped_bars(vals, errs_, ylabel, f"{ylabel} per card per engine", out_dir, f"{metric}.png")
            plots.append(Plot(name, f"{ylabel} per card", "best median per card and engine, stddev error bars"))
    page = Page(title="lucebench leaderboard", tables=tables, plots=plots,
                subtitle=f"{len(included)} result file(s) from {results_dir}, {len(cards)} card(s); "
                         f"{len(skipped)} skipped")
    md, html = out_dir / "leaderboard.md", out_dir / "index.html"
    md.write_text(page_markdown(page), encoding="utf-8")
    html.write_text(page_html(page), encoding="utf-8")
    return LeaderboardFiles(md, html, [out_dir / p.file for p in plots], included, skipped)
