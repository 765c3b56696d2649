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
from lucebench.results.io import load_result, result_file
from lucebench.results.schema import Result
from lucebench.results.validate import errors, validate_file

MAX_ENGINES_IN_NAME = 4


@dataclass(frozen=True)
class Submitted:
    """Where a submission went; `existed` when the identical file was already there."""

    path: Path
    existed: bool
    what: str = ""


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


#: Model shapes that exist to check the pipeline (configs/cpu-smoke.yaml), not to be measured.
SMOKE_SHAPES = frozenset({"tiny", "tiny-odd", "tiny-qwen3", "small"})


def _config_models(result: Result) -> dict[str, dict]:
    models = result.config.content.get("models") if isinstance(result.config.content, dict) else None
    return models if isinstance(models, dict) else {}


def is_smoke_run(result: Result) -> bool:
    """A pipeline check rather than a measurement: the cpu-smoke config, or a cell on a tiny synthetic shape."""
    if result.config.content.get("name") == "cpu-smoke":
        return True
    models = _config_models(result)
    used = {str(c.params.get("model")) for c in result.cells}
    return any(((models.get(m) or {}).get("synth") or {}).get("shape") in SMOKE_SHAPES for m in used)


def submission_problems(result: Result) -> list[str]:
    """Why a valid result is still not a leaderboard entry: unfinished, uncommitted code, or a smoke run."""
    out = []
    interrupted = [c.id for c in result.cells if c.error is not None and c.error.kind == "interrupted"]
    if interrupted or not result.complete:
        out.append("the run is unfinished (interrupted or still running"
                   + (f": {', '.join(interrupted[:3])}" if interrupted else "") + "); finish it with --resume")
    if result.environment.lucebench_dirty or any(e.lucebench_dirty for e in result.other_environments.values()):
        out.append("it was measured with uncommitted changes to lucebench (lucebench_dirty); commit, then run again")
    if is_smoke_run(result):
        out.append("it is a smoke run on a tiny synthetic model: it checks the pipeline and measures nothing a "
                   "leaderboard compares")
    return out


def describe(result: Result) -> str:
    """What a submission is, in one line: card, engines, models and their weights, workloads."""
    models = _config_models(result)
    names = sorted({str(c.params.get("model")) for c in result.cells})

    def synthetic(m: str) -> bool:
        return bool((models.get(m) or {}).get("synth")) or any(
            c.model is not None and c.model.synthetic for c in result.cells if c.params.get("model") == m)

    weights = ", ".join(f"{m} ({'synthetic weights' if synthetic(m) else 'trained weights'})" for m in names)
    suites = ", ".join(sorted({str(c.params.get("suite")) for c in result.cells}))
    ok = sum(c.status == "ok" for c in result.cells)
    return (f"{card_name(result)}; engines {engines_slug(result).replace('+', ', ')}; models {weights}; "
            f"workloads {suites}; {ok} of {len(result.cells)} cells ok")


def submit(path: Path, results_dir: Path) -> Submitted:
    """Validate `path` and copy it into the submission layout. Invalid files raise UserError (exit 1)."""
    path = result_file(Path(path))
    problems = errors(validate_file(path))
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UserError(f"not submitted: {len(problems)} validation error(s):\n{shown}{more}", where=str(path),
                        hint="fix or re-run, then `lucebench validate` it", exit_code=1)
    result = load_result(path)
    refused = submission_problems(result)
    if refused:
        raise UserError("not submitted: " + "; ".join(refused), where=str(path), exit_code=1,
                        hint="the leaderboard compares finished runs of committed code on real workloads")
    content = path.read_bytes()
    dest = submission_path(result, content, results_dir)
    if dest.exists() and dest.read_bytes() == content:
        return Submitted(dest, existed=True, what=describe(result))
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    except OSError as exc:
        raise UserError(f"cannot write the submission: {exc.strerror}", where=str(dest)) from None
    return Submitted(dest, existed=False, what=describe(result))


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
