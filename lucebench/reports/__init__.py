"""What users look at and what CI acts on: reports, comparisons, the leaderboard and submissions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lucebench.reports.build import ReportFiles

REPORT_SUBDIR = "report"


def write_report(result_paths: Sequence[Path], run_dir: Path) -> ReportFiles:
    """The report of a run: load the result files and write report.md, PNGs and index.html to run_dir/report/.

    Called by `lucebench run` at the end; `lucebench report --out DIR` writes to DIR instead. Malformed
    result files raise UserError. Imports matplotlib lazily, so importing this package stays cheap.
    """
    from lucebench.reports.build import build_report
    from lucebench.results.io import load_results

    return build_report(load_results([Path(p) for p in result_paths]), Path(run_dir) / REPORT_SUBDIR)


__all__ = ["REPORT_SUBDIR", "write_report"]
