"""Reading result files: JSON syntax errors with line and column, schema errors with JSON paths.

A result file may be gzip-compressed (`results.json.gz`, as reference runs are kept in `reports/`): it reads
the same.

Every failure a user can cause (missing file, broken JSON, a file that is not a `lucebench.result/v1`)
becomes a `UserError` naming the file and where inside it, never a traceback.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lucebench.errors import UserError
from lucebench.results.schema import SCHEMA_ID, Result


@dataclass(frozen=True)
class SchemaProblem:
    """One schema violation: a JSON path such as `$.cells[3].metrics.decode_tok_s.median` and what is wrong."""

    path: str
    message: str


def json_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """Turn a pydantic/JSON location tuple into a JSONPath-like string (`$.cells[0].params`)."""
    out = "$"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


def result_file(path: Path) -> Path:
    """A run folder stands for its results.json, or results.json.gz (what report, compare and validate accept)."""
    path = Path(path)
    if path.is_dir():
        for name in ("results.json", "results.json.gz"):
            if (path / name).is_file():
                return path / name
    return path


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing file or a syntax error is a UserError naming line and column."""
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    except FileNotFoundError:
        raise UserError("no such file", where=str(path), hint="pass the results.json that `lucebench run` wrote",
                        exit_code=2) from None
    except IsADirectoryError:
        raise UserError("is a directory, not a result file", where=str(path),
                        hint="pass DIR/results.json", exit_code=2) from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # gzip.BadGzipFile is an OSError
        raise UserError(f"cannot read: {exc}", where=str(path), exit_code=2) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"not valid JSON: {exc.msg}", where=f"{path}:{exc.lineno}:{exc.colno}",
                        hint="the file may be truncated or hand-edited; re-run or restore it", exit_code=2) from None


def iter_non_finite(data: Any, loc: tuple[int | str, ...] = ()) -> Iterator[tuple[int | str, ...]]:
    """Locations of NaN / Infinity numbers. Python's json accepts them, the JSON standard does not."""
    if isinstance(data, float) and not math.isfinite(data):
        yield loc
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from iter_non_finite(value, (*loc, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from iter_non_finite(value, (*loc, i))


def schema_problems(data: Any) -> list[SchemaProblem]:
    """Every schema violation of parsed JSON `data` (pydantic reports all of them, not only the first)."""
    if not isinstance(data, dict):
        return [SchemaProblem("$", f"expected a JSON object, got {type(data).__name__}")]
    problems: list[SchemaProblem] = []
    schema = data.get("schema")
    if schema is None:
        # The model gives `schema` a default, but a file without it does not say what it is.
        return [SchemaProblem("$.schema", f"required key is missing: a result file names its schema, {SCHEMA_ID!r}")]
    if "cells" not in data:
        problems.append(SchemaProblem("$.cells", "required key is missing: a result lists its cells (an empty list "
                                                 "for a run that measured nothing yet)"))
    if schema != SCHEMA_ID:
        # A different schema version deserves one clear message rather than dozens of field errors.
        return [SchemaProblem("$.schema", f"unsupported schema {schema!r}; this lucebench reads {SCHEMA_ID!r}")]
    try:
        Result.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.append(SchemaProblem(json_path(err["loc"]), err["msg"]))
    return problems


def parse_result(data: Any, where: str) -> Result:
    """Validate parsed JSON against the schema; all problems are listed in one UserError (exit 2)."""
    problems = schema_problems(data)
    if problems:
        shown = problems[:25]
        lines = [f"  {p.path}: {p.message}" for p in shown]
        if len(problems) > len(shown):
            lines.append(f"  ... and {len(problems) - len(shown)} more")
        raise UserError(f"not a valid {SCHEMA_ID} result ({len(problems)} problem(s)):\n" + "\n".join(lines),
                        where=where, hint="run `lucebench validate` on it for the full list", exit_code=2)
    return Result.model_validate(data)


def load_result(path: Path) -> Result:
    """Load and schema-check one result file. Raises UserError (exit 2) naming the file and JSON path."""
    path = Path(path)
    return parse_result(read_json(path), str(path))


def load_results(paths: list[Path]) -> list[Result]:
    """Load several result files; a directory stands for its results.json."""
    out: list[Result] = []
    for p in paths:
        out.append(load_result(result_file(p)))
    return out
