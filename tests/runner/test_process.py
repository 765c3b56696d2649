import sys
from pathlib import Path

import pytest

from lucebench.errors import EngineError
from lucebench.runner.process import EngineProcess

FAKE = str(Path(__file__).with_name("fake_engine.py"))


def _proc(tmp_path, *args):
    return EngineProcess([sys.executable, FAKE, *args], log_path=tmp_path / "engine.log")


def _req(i=0, n_gen=4):
    return {"type": "generate", "id": f"r{i}", "prompt_ids": [1, 2, 3], "n_gen": n_gen, "ignore_eos": True, "eos_ids": []}


def test_ready_request_and_shutdown(tmp_path):
    with _proc(tmp_path) as p:
        ready = p.wait_ready(30)
        assert ready["engine"]["name"] == "fake"
        reply = p.request(_req(n_gen=5), 30)
        assert reply["n_gen"] == 5 and len(reply["output_ids"]) == 5
        t = reply["timing"]
        assert t["t_prefill_start_ns"] <= t["t_prefill_end_ns"] <= t["t_decode_end_ns"]
    assert p.proc.returncode == 0
    assert "fake engine starting" in (tmp_path / "engine.log").read_text()


def test_crash_reports_exit_code_and_stderr(tmp_path):
    with _proc(tmp_path, "--mode", "crash-after", "--after", "1") as p:
        p.wait_ready(30)
        p.request(_req(0), 30)
        with pytest.raises(EngineError) as info:
            p.request(_req(1), 30)
    assert info.value.kind == "crash"
    assert info.value.exit_code == 3
    assert "simulated crash" in info.value.stderr_tail


def test_signal_is_named(tmp_path):
    with _proc(tmp_path, "--mode", "segv-after") as p:
        p.wait_ready(30)
        with pytest.raises(EngineError) as info:
            p.request(_req(), 30)
    assert info.value.signal == "SIGSEGV"


def test_hang_times_out_and_is_killed(tmp_path):
    with _proc(tmp_path, "--mode", "hang-after") as p:
        p.wait_ready(30)
        with pytest.raises(EngineError) as info:
            p.request(_req(), 1.0)
        assert p.proc.poll() is not None
    assert info.value.kind == "timeout"


def test_garbage_on_stdout_is_a_protocol_error(tmp_path):
    with _proc(tmp_path, "--mode", "garbage") as p:
        p.wait_ready(30)
        with pytest.raises(EngineError) as info:
            p.request(_req(), 30)
    assert info.value.kind == "protocol"
    assert "loading weights" in info.value.message


def test_load_error_and_error_reply(tmp_path):
    with _proc(tmp_path, "--mode", "load-error", "--model", "/nope") as p:
        with pytest.raises(EngineError) as info:
            p.wait_ready(30)
    assert info.value.kind == "load" and "/nope" in info.value.message
    with _proc(tmp_path, "--mode", "error-reply") as p:
        p.wait_ready(30)
        with pytest.raises(EngineError) as info:
            p.request(_req(), 30)
        assert info.value.kind == "context_overflow"
        assert p.proc.poll() is None  # a per-request error keeps the engine alive


def test_missing_executable(tmp_path):
    with pytest.raises(EngineError) as info:
        EngineProcess(["/nonexistent/engine"], log_path=tmp_path / "x.log")
    assert info.value.kind == "crash"


def test_a_long_non_protocol_line_is_never_cut_silently(tmp_path):
    code = ("import json, sys\n"
            "print(json.dumps({'type': 'ready', 'protocol': 'lucebench.engine/v1', 'engine': {'name': 'x'}}), flush=True)\n"
            "sys.stdin.readline()\n"
            "print('{\"type\": \"result\", \"id\": \"r0\", \"note\": \"' + 'x' * 1000 + ' END-OF-LINE', flush=True)\n")
    with EngineProcess([sys.executable, "-c", code], log_path=tmp_path / "engine.log") as p:
        p.wait_ready(30)
        with pytest.raises(EngineError) as info:
            p.request(_req(0), 30)
    message = info.value.message
    assert info.value.kind == "protocol" and "not JSON: Unterminated string" in message
    assert "more characters; the whole line is in" in message and str(tmp_path / "engine.log") in message
    assert "END-OF-LINE" in (tmp_path / "engine.log").read_text()
