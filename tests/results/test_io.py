"""lucebench.results.io: loading result files, with user errors naming file, line/column and JSON paths."""

from __future__ import annotations

import gzip
import json

import pytest

from lucebench.errors import UserError
from lucebench.results.io import json_path, load_result, load_results, schema_problems


def test_round_trip(fab, write_result):
    original = fab.gpu_result()
    loaded = load_result(write_result(original))
    assert loaded == original
    assert loaded.schema_ == "lucebench.result/v1"


def test_directory_means_its_results_json(fab, write_result, tmp_path):
    write_result(fab.cpu_result(), "run/results.json")
    [loaded] = load_results([tmp_path / "run"])
    assert loaded.run_id == "run-cpu-0"


def test_gzipped_result_reads_the_same(fab, tmp_path):
    original = fab.cpu_result()
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json.gz").write_bytes(gzip.compress(original.model_dump_json(by_alias=True).encode()))
    assert load_result(run / "results.json.gz") == original
    [loaded] = load_results([run])  # a folder holding only the compressed file
    assert loaded == original


def test_broken_gzip_is_a_user_error(tmp_path):
    path = tmp_path / "results.json.gz"
    path.write_bytes(gzip.compress(b'{"schema": "lucebench.result/v1"}')[:-6])  # truncated
    with pytest.raises(UserError) as exc:
        load_result(path)
    assert "cannot read" in exc.value.message and exc.value.exit_code == 2


def test_syntax_error_names_line_and_column(write_result):
    path = write_result('{\n  "schema": "lucebench.result/v1",\n  "run_id": \n}\n')
    with pytest.raises(UserError) as exc:
        load_result(path)
    assert exc.value.where == f"{path}:4:1"
    assert "not valid JSON" in exc.value.message
    assert exc.value.exit_code == 2


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as exc:
        load_result(tmp_path / "nope.json")
    assert "no such file" in exc.value.message and exc.value.where.endswith("nope.json")


def test_schema_errors_all_listed_with_json_paths(fab, write_result):
    data = json.loads(fab.cpu_result().model_dump_json(by_alias=True))
    data["cells"][0]["status"] = "great"
    data["cells"][0]["metrics"]["decode_tok_s"]["median"] = "fast"
    del data["environment"]["os"]
    data["surprise"] = 1
    problems = {p.path for p in schema_problems(data)}
    assert problems == {"$.cells[0].status", "$.cells[0].metrics.decode_tok_s.median", "$.environment.os",
                        "$.surprise"}
    with pytest.raises(UserError) as exc:
        load_result(write_result(json.dumps(data)))
    for path in problems:
        assert path in exc.value.message


def test_other_schema_version_gets_one_clear_message():
    [p] = schema_problems({"schema": "lucebench.result/v2"})
    assert p.path == "$.schema" and "v2" in p.message


def test_json_path_quotes_odd_keys():
    assert json_path(("cells", 0, "metrics", "tok/J")) == '$.cells[0].metrics["tok/J"]'
