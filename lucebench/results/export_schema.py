"""Export the pydantic result model as a JSON Schema file: `python -m lucebench.results.export_schema`.

The committed file `lucebench/schemas/result-v1.schema.json` is what other tools (and other languages)
validate against; a test keeps it equal to what this module generates.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lucebench.results.schema import SCHEMA_ID, Result

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "result-v1.schema.json"


def result_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `lucebench.result/v1`, generated from the pydantic models."""
    schema = Result.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://lucebench.dev/schemas/{SCHEMA_ID.replace('/', '-')}.schema.json",
        **schema,
    }


def render_schema() -> str:
    """The schema as the exact text written to disk (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(result_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schema(path: Path = SCHEMA_FILE) -> Path:
    """Write the schema file and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_schema(), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: write the schema (or with --check, exit 1 when the committed file is stale)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=SCHEMA_FILE)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the models")
    args = parser.parse_args(argv)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != render_schema():
            print(f"{args.out} is stale: run `python -m lucebench.results.export_schema`")
            return 1
        print(f"{args.out} is up to date")
        return 0
    print(write_schema(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
