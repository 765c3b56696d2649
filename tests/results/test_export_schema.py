"""The committed JSON Schema file stays equal to what the pydantic models generate."""

from __future__ import annotations

import json

from lucebench.results.export_schema import SCHEMA_FILE, main, render_schema, result_json_schema


def test_committed_schema_is_current():
    assert SCHEMA_FILE.exists(), "run `python -m lucebench.results.export_schema`"
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render_schema(), \
        "stale: run `python -m lucebench.results.export_schema`"


def test_schema_describes_the_result():
    schema = result_json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"run_id", "environment", "cells", "schema"} <= set(schema["properties"])
    assert "MetricSummary" in schema["$defs"]
    assert schema["additionalProperties"] is False


def test_write_and_check(tmp_path):
    out = tmp_path / "s.json"
    assert main(["--out", str(out), "--check"]) == 1  # missing file is stale
    assert main(["--out", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "Result"
    assert main(["--out", str(out), "--check"]) == 0
