"""`lucebench submit`: validate a result and file it under results/<gpu-slug>/<date>-<engines>-<id>.json.

The layout is what the leaderboard reads and what pull requests add to:

    results/nvidia-geforce-rtx-3090/2026-05-01-llamacpp+megakernel-1a2b3c4d.json

`<gpu-slug>` comes from the GPU name (the CPU name for CPU runs), `<date>` from the result's creation
time, `<engines>` are the cells' engines joined with "+", and `<id>` is the first 8 hex digits of the
file's sha256, so re-submitting the same file is a no-op and two different files never collide.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lucebench.errors import UserError
from lucebench.reports.cells import card_name, slug
from lucebench.results.io import load_result
from lucebench.results.schema import Result
from lucebench.results.validate import errors, validate_file

MAX_ENGINES_IN_NAME = 4


@dataclass(frozen=True)
class Submitted:
    """Where a submission went; `existed` when the identical file was already there."""

    path: Path
    existed: bool


def gpu_slug(result: Result) -> str:
    """The folder name of a result's card: "NVIDIA H200" -> "nvidia-h200"."""
    return slug(card_name(result))


def engines_slug(result: Result) -> str:
    """The cells' engines, sorted and joined with "+" (at most a few, then "+more")."""
    names = sorted({str(c.params.get("engine") or (c.engine.name if c.engine else "unknown")) for c in result.cells})
    if not names:
        return "none"
    if len(names) > MAX_ENGINES_IN_NAME:
        names = names[:MAX_ENGINES_IN_NAME] + ["more"]
    return "+".join(slug(n) for n in names)


def result_date(result: Result) -> str:
    """YYYY-MM-DD of the result's creation time (today when unparseable)."""
    m = re.match(r"(\d{4}-\d{2}-\d{2})", result.created)
    return m.group(1) if m else datetime.now(timezone.utc).strftime("%Y-%m-%d")


def submission_path(result: Result, content: bytes, results_dir: Path) -> Path:
    """results_dir/<gpu-slug>/<date>-<engines>-<id>.json for this result and file content."""
    digest = hashlib.sha256(content).hexdigest()[:8]
    return Path(results_dir) / gpu_slug(result) / f"{result_date(result)}-{engines_slug(result)}-{digest}.json"


def submit(path: Path, results_dir: Path) -> Submitted:
    """Validate `path` and copy it into the submission layout. Invalid files raise UserError (exit 1)."""
    path = Path(path)
    problems = errors(validate_file(path))
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UserError(f"not submitted: {len(problems)} validation error(s):\n{shown}{more}", where=str(path),
                        hint="fix or re-run, then `lucebench validate` it", exit_code=1)
    result = load_result(path)
    content = path.read_bytes()
    dest = submission_path(result, content, results_dir)
    if dest.exists() and dest.read_bytes() == content:
        return Submitted(dest, existed=True)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    except OSError as exc:
        raise UserError(f"cannot write the submission: {exc.strerror}", where=str(dest)) from None
    return Submitted(dest, existed=False)


def main(argv: list[str] | None = None) -> int:
    """`python -m lucebench.reports.submission slug RESULT`: print the card slug (used by the nightly workflow)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "slug":
        print("usage: python -m lucebench.reports.submission slug RESULT.json", file=sys.stderr)
        return 2
    try:
        print(gpu_slug(load_result(Path(args[1]))))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
