"""`lucebench report`: report.md, PNG plots and index.html from one or more result files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lucebench.errors import UserError
from lucebench.reports import cells as C
from lucebench.reports import plots as P
from lucebench.reports import tables as T
from lucebench.reports.render import EnvBlock, Page, page_html, page_markdown
from lucebench.results.schema import Result


@dataclass(frozen=True)
class ReportFiles:
    """What `build_report` wrote."""

    out_dir: Path
    markdown: Path
    html: Path
    plots: list[Path]
    tables: list[str]


def report_page(results: Sequence[Result], out_dir: Path) -> Page:
    """Build the page model (tables, environment blocks) and write the plots under out_dir."""
    views = C.collect(results)
    page = Page(title="lucebench report")
    runs = ", ".join(r.run_id for r in results)
    n_ok = sum(v.ok for v in views)
    page.subtitle = f"{len(views)} cells from {len(results)} result file(s) ({runs}); {n_ok} ok"
    for r in results:
        if not r.complete:
            page.notes.append(f"run {r.run_id} is incomplete: some cells of its matrix have not run yet")
        title = f"{C.card_name(r)} ({r.run_id})"
        page.environments.append(EnvBlock(title, T.environment_rows(r), synthetic=T.any_synthetic(r)))
        for key, env in r.other_environments.items():  # a run resumed on another machine: its earlier ones
            page.environments.append(EnvBlock(f"{C.env_card_name(env)} ({r.run_id}, earlier machine {key})",
                                              T.environment_rows(r, key), synthetic=T.any_synthetic(r)))
    page.tables = T.result_tables(views)
    page.caveats = T.caveat_tables(views)
    if not n_ok:
        page.notes.append("no cell finished ok: there is nothing to plot")
    page.plots = P.all_plots(views, out_dir)
    return page


def build_report(results: Sequence[Result], out_dir: Path) -> ReportFiles:
    """Write report.md, index.html and the PNGs for `results` into out_dir; return the paths."""
    if not results:
        raise UserError("no result files given", hint="lucebench report out/run/results.json [--out DIR]")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the report folder: {exc.strerror}", where=str(out_dir)) from None
    page = report_page(results, out_dir)
    md = out_dir / "report.md"
    html = out_dir / "index.html"
    md.write_text(page_markdown(page), encoding="utf-8")
    html.write_text(page_html(page), encoding="utf-8")
    return ReportFiles(out_dir, md, html, [out_dir / p.file for p in page.plots], [t.key for t in page.tables + page.caveats])
