"""llama.cpp baseline: fast tests (no llama.cpp build). The real build lives in test_llamacpp_e2e.py.

The adapter is driven here against a fake `llama-server` (a small Python HTTP server written by the test)
so the protocol, port handling, start-up failures and shutdown paths are checked in seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lucebench.baselines.llamacpp import adapter, bench, build, convert, source
from lucebench.baselines.llamacpp.build import LlamaCppBuild
from lucebench.engines.protocol import GenerateRequest
from lucebench.errors import EngineError, UserError

ROW = {"build_commit": "0c1e570", "build_number": 0, "cpu_info": "x", "gpu_info": "", "backends": "CPU",
       "model_filename": "m.gguf", "model_type": "qwen35 ?B F16", "model_size": 421888, "model_n_params": 210000,
       "n_batch": 2048, "n_ubatch": 512, "n_threads": 2, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 0,
       "flash_attn": 0, "test_time": "2025-01-01T00:00:00Z", "avg_ns": 1500, "stddev_ns": 10, "avg_ts": 10.0,
       "stddev_ts": 0.1}


def _row(**kw: object) -> str:
    return json.dumps({**ROW, **kw})


# ------------------------------------------------------------------------------------------------ parser
def test_parser_keeps_only_bench_rows_in_noisy_output() -> None:
    pp = _row(n_prompt=16, n_gen=0, n_depth=0, samples_ns=[1000, 2000])
    tg = _row(n_prompt=0, n_gen=8, n_depth=16, samples_ns=[3000, 4000])
    noisy = "\n".join([
        "ggml_cuda_init: found 1 CUDA devices:",
        "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes",
        "load_backend: loaded CUDA backend from /x/libggml-cuda.so",
        '{"not": "a row"}',
        "{broken json",
        pp,
        "warning: something {with braces} but no json",
        "load_tensors: offloaded 4/4 layers to GPU" + tg,  # a log line without newline before the JSON row
        '[{"n_prompt": 1}]',
        "",
    ])
    rows = bench.parse_bench_output(noisy)
    assert [(r.test, r.n_prompt, r.n_gen, r.n_depth) for r in rows] == [("pp", 16, 0, 0), ("tg", 0, 8, 16)]
    assert rows[0].samples_ns == [1000, 2000] and rows[1].samples_ns == [3000, 4000]
    assert rows[1].name == "tg8 @ d16"
    assert rows[0].tokens_per_s() == pytest.approx([16 / 1e-6, 16 / 2e-6])
    assert rows[0].build_commit == "0c1e570"


def test_parser_rejects_rows_with_bad_samples() -> None:
    assert bench.parse_row(_row(n_prompt=1, n_gen=0, n_depth=0, samples_ns="oops")) is None
    assert bench.parse_row("no json here") is None


# ------------------------------------------------------------------------------------------------ flags
@pytest.mark.parametrize(("ours", "theirs"), [("f16", "f16"), ("bf16", "bf16"), ("q8_0", "q8_0"), ("Q4_0", "q4_0")])
def test_kv_type_mapping(ours: str, theirs: str) -> None:
    assert bench.kv_type_flag(ours) == theirs


@pytest.mark.parametrize("bad", ["fp8", "q4_1", "int8", ""])
def test_kv_type_unsupported_is_a_user_error(bad: str) -> None:
    with pytest.raises(UserError) as e:
        bench.kv_type_flag(bad, where="kv_k")
    assert "not supported" in e.value.message and e.value.where == "kv_k" and "q8_0" in (e.value.hint or "")


def test_bench_argv_is_exact() -> None:
    argv = bench.bench_argv("/b/llama-bench", "/m.gguf", n_prompt=[520], n_gen=[128], depth=[0, 4096], reps=5,
                            flash_attn=True, kv_k="q8_0", kv_v="bf16", n_gpu_layers=99, threads=8)
    assert argv == ["/b/llama-bench", "-m", "/m.gguf", "-o", "jsonl", "-p", "520", "-n", "128", "-d", "0,4096",
                    "-r", "5", "-fa", "on", "-ctk", "q8_0", "-ctv", "bf16", "-ngl", "99", "-t", "8"]
    assert bench.bench_argv("b", "m", flash_attn=None)[bench.bench_argv("b", "m").index("-fa") + 1] == "auto"
    with pytest.raises(UserError):
        bench.bench_argv("b", "m", reps=0)
    with pytest.raises(UserError):
        bench.bench_argv("b", "m", kv_v="f8")


def _fake_build(tmp: Path, backend: str = "cpu") -> LlamaCppBuild:
    bin_dir = tmp / "cmake" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    b = LlamaCppBuild(bin_dir=bin_dir, commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f", backend=backend, arch=None,
                      cmake_flags=("-DCMAKE_BUILD_TYPE=Release",), compiler="gcc 12", build_log=tmp / "build.log",
                      source_hash="abc")
    (tmp / build.RECORD_NAME).write_text(json.dumps(b.to_dict()))
    return b


def test_command_line(tmp_path: Path) -> None:
    b = _fake_build(tmp_path)
    argv = adapter.command(Path("/m.gguf"), build=b, mode="server", ctx=1024, kv_k="f16", kv_v="q8_0",
                           flash_attn=False, n_gpu_layers=0, threads=4)
    assert argv[:3] == [sys.executable, "-m", "lucebench.baselines.llamacpp"]
    assert argv[3:] == ["--mode", "server", "--gguf", "/m.gguf", "--build", str(tmp_path), "--ctx", "1024",
                        "--kv-k", "f16", "--kv-v", "q8_0", "--flash-attn", "off", "--n-gpu-layers", "0", "--threads", "4"]
    assert "--threads" not in adapter.command(Path("/m"), build=b, mode="bench", ctx=8, kv_k="f16", kv_v="f16",
                                              flash_attn=True, n_gpu_layers=99, threads=None)
    with pytest.raises(UserError):
        adapter.command(Path("/m"), build=b, mode="daemon", ctx=8, kv_k="f16", kv_v="f16", flash_attn=True,
                        n_gpu_layers=0, threads=None)
    with pytest.raises(UserError, match="not supported"):
        adapter.command(Path("/m"), build=b, mode="server", ctx=8, kv_k="fp8", kv_v="f16", flash_attn=True,
                        n_gpu_layers=0, threads=None)
    assert LlamaCppBuild.load(tmp_path) == b


def test_server_argv_pins_one_slot_and_no_cache(tmp_path: Path) -> None:
    b = _fake_build(tmp_path)
    (b.bin_dir / "llama-server").write_text("")
    s = adapter.LlamaServer(b, Path("/m.gguf"), ctx=2048, kv_k="bf16", kv_v="q4_0", flash_attn="on", n_gpu_layers=99,
                            threads=None, log_path=tmp_path / "log")
    argv = s.server_argv(4321)
    joined = " ".join(argv)
    for piece in ("--host 127.0.0.1", "--port 4321", "-c 2048", "-np 1", "-ctk bf16", "-ctv q4_0", "-fa on",
                  "-ngl 99", "--no-cache-prompt", "--cache-ram 0", "--ctx-checkpoints 0", "--no-webui"):
        assert piece in joined
    assert "-ub" not in argv  # llama.cpp's own batch sizes unless the config sets ubatch
    big = adapter.LlamaServer(b, Path("/m.gguf"), ctx=2048, kv_k="bf16", kv_v="bf16", flash_attn="on", n_gpu_layers=99,
                              threads=None, log_path=tmp_path / "log", ubatch=4096).server_argv(1)
    assert " ".join(big).endswith("-b 4096 -ub 4096")
    assert adapter.command(Path("/m"), build=b, mode="server", ctx=8, kv_k="f16", kv_v="f16", flash_attn=True,
                           n_gpu_layers=99, threads=None, ubatch=2048)[-2:] == ["--ubatch", "2048"]


def test_greedy_payload_pins_sampling() -> None:
    p = adapter.greedy_payload([1, 2, 3], 5, True)
    assert p["prompt"] == [1, 2, 3] and p["n_predict"] == 5 and p["ignore_eos"] is True
    assert p["samplers"] == ["top_k"] and p["top_k"] == 1 and p["temperature"] == 0.0
    assert p["cache_prompt"] is False and p["return_tokens"] is True and p["seed"] == 0


def test_server_result_phase_stamps_and_error_bound() -> None:
    req = GenerateRequest(id="r1", prompt_ids=[5, 6, 7], n_gen=4, ignore_eos=True)
    reply = {"tokens": [1, 2, 3, 4], "stop_type": "limit",
             "timings": {"prompt_ms": 2.0, "predicted_ms": 3.0, "prompt_n": 3, "predicted_n": 4, "cache_n": 0}}
    r = adapter.server_result(req, reply, t_send=1_000_000, t_recv=7_000_000)
    t = r["timing"]
    assert (t["t_prefill_start_ns"], t["t_prefill_end_ns"], t["t_decode_start_ns"], t["t_decode_end_ns"]) == \
        (2_000_000, 4_000_000, 4_000_000, 7_000_000)
    assert t["clock_error_ns"] == 1_000_000 and r["decode_steps"] == 3 and r["stop"] == "length"
    one = adapter.server_result(replace(req, n_gen=1), {**reply, "tokens": [9]}, t_send=0, t_recv=5_000_000)
    assert one["timing"]["decode_ms"] == 0.0 and one["timing"]["t_decode_start_ns"] == one["timing"]["t_decode_end_ns"]
    with pytest.raises(adapter.RequestError):
        adapter.server_result(req, {**reply, "tokens": [1, 2]}, 0, 1)
    cut = adapter.server_result(replace(req, ignore_eos=False, eos_ids=[3]), reply, 0, 10_000_000)
    assert cut["output_ids"] == [1, 2, 3] and cut["stop"] == "eos"


@pytest.mark.parametrize(("line", "kind"), [("not json", "bad_request"), ('{"type": "dance"}', "bad_request"),
                                            ('{"type": "generate", "prompt_ids": [], "n_gen": 3}', "bad_request"),
                                            ('{"type": "generate", "prompt_ids": [1], "n_gen": 0}', "bad_request")])
def test_parse_request_errors(line: str, kind: str) -> None:
    with pytest.raises(adapter.RequestError) as e:
        adapter.parse_request(line)
    assert e.value.kind == kind


def test_cuda_arch_normalisation() -> None:
    assert build.normalize_cuda_arch("sm_90") == "90"
    assert build.normalize_cuda_arch("8.6") == "86"
    assert build.normalize_cuda_arch("90a;120") == "90a;120"
    with pytest.raises(UserError):
        build.normalize_cuda_arch("hopper")
    flags = build.cmake_flags_for("cuda", "90", "0c1e57098bba")
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=90" in flags and "-DLLAMA_BUILD_COMMIT=0c1e570" in flags
    assert "-DGGML_HIP=ON" in build.cmake_flags_for("hip", "gfx1100", "x") and \
        "-DGPU_TARGETS=gfx1100" in build.cmake_flags_for("hip", "gfx1100", "x")
    with pytest.raises(UserError):
        build.cmake_flags_for("metal", None, "x")


def test_prune_objects_keeps_binaries(tmp_path: Path) -> None:
    for rel in ("bin/llama-server", "CMakeCache.txt", "ggml/src/x.o", "build.ninja", "common/CMakeFiles/y.o"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    build.prune_objects(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CMakeCache.txt", "bin"]
    assert (tmp_path / "bin" / "llama-server").is_file()


def _standin_tree(root: Path) -> Path:
    """A llama.cpp-shaped tree whose CMake project builds three trivial programs under the real tools' names."""
    for rel in ("ggml/CMakeLists.txt", "convert_hf_to_gguf.py", "tools/llama-bench/x.cpp", "tools/server/y.cpp"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    (root / "main.cpp").write_text("int main() { return 0; }\n")
    (root / "CMakeLists.txt").write_text(textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.16)
        project(standin CXX)
        if(STANDIN_FAIL)
          message(FATAL_ERROR "standin-configure-failure")
        endif()
        set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
        foreach(t llama-bench llama-server llama-quantize)
          add_executable(${t} main.cpp)
        endforeach()
        """))
    return root


def test_build_steps_cache_and_failure_on_a_standin_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(source.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("LUCEBENCH_LLAMACPP_COMMIT", "0c1e57098bba43ac29e6e3b677cdceebdd22334f")
    tree = _standin_tree(tmp_path / "llama.cpp")
    b = build.build_llamacpp(backend="cpu", source=tree, jobs=2)
    assert b.backend == "cpu" and b.arch is None and b.commit.startswith("0c1e570") and b.compiler
    assert all(os.access(b.binary(t), os.X_OK) for t in build.TARGETS)
    log = b.build_log.read_text()
    assert "$ cmake -S" in log and "[exit 0]" in log and "-DLLAMA_BUILD_COMMIT=0c1e570" in log
    assert build.LlamaCppBuild.load(b.build_dir) == b
    assert build.build_llamacpp(backend="cpu", source=tree, jobs=2) == b  # cached: the same record
    with pytest.raises(build.LlamaCppBuildError) as e:
        build.build_llamacpp(backend="cpu", source=tree, cmake_args=["-DSTANDIN_FAIL=ON"])
    assert e.value.exit_code == 1 and e.value.log is not None and str(e.value.log) in str(e.value)
    assert "standin-configure-failure" in str(e.value) and not (e.value.log.parent / "build.json").exists()


def test_unknown_backend_is_user_error() -> None:
    with pytest.raises(UserError, match="unknown backend"):
        build.build_llamacpp(backend="vulkan")


def test_normalize_dtype() -> None:
    assert convert.normalize_dtype("Q4_K_M") == "q4_k_m" and convert.normalize_dtype("BF16") == "bf16"
    with pytest.raises(UserError):
        convert.normalize_dtype("q3_xxs")
    assert convert.base_type_for({"torch_dtype": "bfloat16"}) == "bf16"
    assert convert.base_type_for({"dtype": "float16"}) == "f16"
    assert convert.base_type_for({"text_config": {"dtype": "bfloat16"}}) == "bf16"


# ------------------------------------------------------------------------------------------------ source
def test_missing_source_tree_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError) as e:
        source.locate_source(tmp_path / "nope")
    assert "not found" in e.value.message
    monkeypatch.setenv(source.ENV_SRC, str(tmp_path))
    with pytest.raises(UserError) as e2:
        source.locate_source()
    assert "not a llama.cpp source tree" in e2.value.message and "CMakeLists.txt" in e2.value.message


def _mini_tree(root: Path) -> Path:
    for rel in ("CMakeLists.txt", "ggml/CMakeLists.txt", "convert_hf_to_gguf.py", "tools/llama-bench/x.cpp",
                "tools/server/y.cpp", "models/huge-vocab.gguf", "docs/readme.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def test_source_hash_commit_and_pack_roundtrip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(source.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("LUCEBENCH_LLAMACPP_COMMIT", "deadbeef" * 5)
    tree = _mini_tree(tmp_path / "sdist" / "vendor" / "llama.cpp")
    src = source.locate_source(tree)
    assert src.origin == "path" and src.commit == "deadbeef" * 5
    (tree / "models" / "huge-vocab.gguf").write_text("changed")  # not part of the build: same hash
    assert source.locate_source(tree).source_hash == src.source_hash
    (tree / "ggml" / "CMakeLists.txt").write_text("changed")
    changed = source.locate_source(tree)
    assert changed.source_hash != src.source_hash
    # the sdist layout: the commit comes from the parent's .git/modules
    head = tmp_path / "sdist" / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    head.parent.mkdir(parents=True)
    head.write_text("0c1e57098bba43ac29e6e3b677cdceebdd22334f\n")
    assert source.detect_commit(tree) == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    packed = source.pack_source(changed, tmp_path / "carry" / "llama.cpp.tar.xz")
    with tarfile.open(packed) as tf:
        names = tf.getnames()
    assert "llama.cpp/models/huge-vocab.gguf" not in names and "llama.cpp/ggml/CMakeLists.txt" in names
    unpacked = source.locate_source(packed)
    assert unpacked.origin == "archive" and unpacked.source_hash == changed.source_hash
    assert unpacked.commit == changed.commit and (unpacked.root / "tools" / "server" / "y.cpp").is_file()


# ------------------------------------------------------------------------------------------------ adapter vs a fake server
FAKE_SERVER = textwrap.dedent('''\
    import http.server, json, os, sys
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    state = os.environ["FAKE_STATE"]
    if os.environ.get("FAKE_FAIL_BIND_ONCE") and not os.path.exists(state + ".bound"):
        open(state + ".bound", "w").close()
        print("couldn't bind HTTP server socket, hostname: 127.0.0.1, port: %d" % port, flush=True)
        sys.exit(1)
    class H(http.server.BaseHTTPRequestHandler):
        def _send(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send(200, {"status": "ok"})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with open(state + ".requests", "a") as f:
                f.write(json.dumps(body) + "\\n")
            n = body["n_predict"]
            toks = [(sum(body["prompt"]) + i) % 50 for i in range(n)]
            self._send(200, {"tokens": toks, "stop_type": "limit", "timings": {
                "prompt_ms": 1.0, "predicted_ms": 2.0, "prompt_n": len(body["prompt"]), "predicted_n": n, "cache_n": 0}})
        def log_message(self, *a):
            sys.stderr.write("fake: " + (a[0] % a[1:]) + "\\n")
    with open(state + ".pid", "w") as f:
        f.write(str(os.getpid()))
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def _tiny_gguf(path: Path) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_block_count(2)
    w.add_embedding_length(8)
    w.add_context_length(128)
    w.add_file_type(1)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.zeros((3, 8), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _fake_setup(tmp: Path, script: str) -> tuple[LlamaCppBuild, Path]:
    b = _fake_build(tmp / "build")
    exe = b.bin_dir / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + script)
    exe.chmod(0o755)
    return b, _tiny_gguf(tmp / "m.gguf")


def _start(tmp: Path, b: LlamaCppBuild, gguf: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = adapter.command(gguf, build=b, mode="server", ctx=64, kv_k="f16", kv_v="f16", flash_attn=False,
                           n_gpu_layers=0, threads=None) + ["--log", str(tmp / "server.log"), *extra]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FAKE_STATE": str(tmp / "state"), **(env or {})})


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_adapter_protocol_with_fake_server_and_taken_port(tmp_path: Path) -> None:
    b, gguf = _fake_setup(tmp_path, FAKE_SERVER)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    try:
        p = _start(tmp_path, b, gguf, "--port", str(taken))
        assert p.stdin and p.stdout
        ready = json.loads(p.stdout.readline())
        assert ready["type"] == "ready" and ready["protocol"] == "lucebench.engine/v1"
        assert ready["engine"]["name"] == "llama.cpp" and ready["engine"]["build"]["commit"].startswith("0c1e570")
        assert ready["engine"]["ports_tried"][0] == taken and ready["engine"]["port"] != taken
        assert ready["model"]["arch"] == "qwen35" and ready["model"]["n_layers"] == 2 and ready["model"]["dtype"] == "f16"
        assert ready["limits"]["max_ctx"] == 64
        p.stdin.write(json.dumps({"type": "generate", "id": "a", "prompt_ids": [1, 2], "n_gen": 3, "ignore_eos": True}) + "\n")
        p.stdin.write(json.dumps({"type": "generate", "id": "big", "prompt_ids": [1] * 60, "n_gen": 8}) + "\n")
        p.stdin.write("garbage\n")
        p.stdin.flush()
        res = json.loads(p.stdout.readline())
        assert res["type"] == "result" and res["id"] == "a" and res["output_ids"] == [3, 4, 5]
        assert res["timing"]["prefill_ms"] == 1.0 and res["timing"]["decode_ms"] == 2.0
        overflow = json.loads(p.stdout.readline())
        assert overflow == {**overflow, "type": "error", "id": "big", "kind": "context_overflow"}
        bad = json.loads(p.stdout.readline())
        assert bad["type"] == "error" and bad["kind"] == "bad_request"
        server_pid = int((tmp_path / "state.pid").read_text())
        assert _pid_alive(server_pid)
        p.stdin.write('{"type": "shutdown"}\n')
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
        assert p.stdout.read() == ""  # nothing but protocol lines on stdout
        deadline = time.monotonic() + 10
        while _pid_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(server_pid)
        sent = json.loads((tmp_path / "state.requests").read_text().splitlines()[0])
        assert sent["samplers"] == ["top_k"] and sent["top_k"] == 1 and sent["cache_prompt"] is False
    finally:
        blocker.close()


def test_adapter_retries_when_server_cannot_bind_and_stops_on_sigterm(tmp_path: Path) -> None:
    b, gguf = _fake_setup(tmp_path, FAKE_SERVER)
    p = _start(tmp_path, b, gguf, env={"FAKE_FAIL_BIND_ONCE": "1"})
    assert p.stdout
    ready = json.loads(p.stdout.readline())
    assert ready["type"] == "ready" and len(ready["engine"]["ports_tried"]) == 2
    server_pid = int((tmp_path / "state.pid").read_text())
    p.terminate()  # SIGTERM
    assert p.wait(timeout=30) != 0
    deadline = time.monotonic() + 10
    while _pid_alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(server_pid)


def test_adapter_stops_server_on_stdin_eof(tmp_path: Path) -> None:
    b, gguf = _fake_setup(tmp_path, FAKE_SERVER)
    p = _start(tmp_path, b, gguf)
    assert p.stdout and p.stdin
    assert json.loads(p.stdout.readline())["type"] == "ready"
    server_pid = int((tmp_path / "state.pid").read_text())
    p.stdin.close()
    assert p.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while _pid_alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(server_pid)


def test_server_that_never_becomes_healthy(tmp_path: Path) -> None:
    hang = "import os, sys, time\nopen(os.environ['FAKE_STATE'] + '.pid', 'w').write(str(os.getpid()))\n" \
           "print('loading model... (fake, never listens)', flush=True)\ntime.sleep(600)\n"
    b, gguf = _fake_setup(tmp_path, hang)
    p = _start(tmp_path, b, gguf, "--startup-timeout", "2")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1
    line = json.loads(out.splitlines()[0])
    assert line["type"] == "error" and line["kind"] == "load" and "id" not in line
    assert "did not become healthy" in line["message"] and "never listens" in line["message"]  # log tail included
    assert not _pid_alive(int((tmp_path / "state.pid").read_text()))


def test_server_that_crashes_at_start(tmp_path: Path) -> None:
    b, gguf = _fake_setup(tmp_path, "import sys\nprint('error: failed to load model', flush=True)\nsys.exit(3)\n")
    p = _start(tmp_path, b, gguf)
    out, _ = p.communicate(timeout=60)
    line = json.loads(out.splitlines()[0])
    assert p.returncode == 1 and line["kind"] == "load" and "status 3" in line["message"]
    assert "failed to load model" in line["message"]


def test_adapter_load_errors(tmp_path: Path) -> None:
    b = _fake_build(tmp_path / "build")
    argv = adapter.command(tmp_path / "missing.gguf", build=b, mode="server", ctx=64, kv_k="f16", kv_v="f16",
                           flash_attn=False, n_gpu_layers=0, threads=None)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1 and json.loads(r.stdout)["kind"] == "load" and "GGUF file not found" in r.stdout
    gguf = _tiny_gguf(tmp_path / "m.gguf")
    argv = [*adapter.command(gguf, build=b, mode="server", ctx=64, kv_k="f16", kv_v="f16", flash_attn=False,
                             n_gpu_layers=0, threads=None)]
    argv[argv.index("--kv-k") + 1] = "fp8"
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1 and "not supported" in json.loads(r.stdout)["message"]
    r = subprocess.run(argv[:argv.index("--build") + 1] + [str(tmp_path / "nobuild")] + argv[argv.index("--build") + 2:],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1 and "build record" in json.loads(r.stdout)["message"]


def test_a_gguf_model_runs_as_published(tmp_path, monkeypatch):
    """A model that is a GGUF file (a published quantisation) is run as it is, not converted; a `gguf:` type
    to convert to is then a config error."""
    from types import SimpleNamespace

    import lucebench.baselines.llamacpp as L
    from lucebench.engines.registry import ENGINE_TYPES, LaunchRequest
    from lucebench.errors import UserError

    build = SimpleNamespace(to_dict=lambda: {"commit": "c"})
    monkeypatch.setattr(L, "build_llamacpp", lambda **_: build)
    monkeypatch.setattr(L, "prepare_gguf", lambda *a, **k: pytest.fail("a GGUF model is not converted"))
    monkeypatch.setattr(L, "command", lambda gguf, **_: ["llama-server", "-m", str(gguf)])
    gguf = tmp_path / "Qwen3.5-27B-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    launch = ENGINE_TYPES["llama.cpp"].launch
    req = LaunchRequest(engine="llama.cpp-gguf", options={"mode": "server"}, model_dir=gguf, backend="cpu",
                        device=0, max_ctx=64)
    out = launch(req)
    assert out.argv == ["llama-server", "-m", str(gguf)]
    assert out.build["gguf"] == gguf.name and out.build["gguf_type"] == "as published"
    with pytest.raises(UserError, match="option gguf: 'q4_k_m' converts a checkpoint folder"):
        launch(LaunchRequest(engine="x", options={"gguf": "q4_k_m"}, model_dir=gguf, backend="cpu", device=0,
                             max_ctx=64))


def test_llama_bench_timeout_kills_a_silent_run(tmp_path: Path) -> None:
    """llama-bench prints a row only when a test ends: a run past timeout_s is killed at the deadline, not
    when it next prints (a 128K prefill can run minutes without a line)."""
    b = _fake_build(tmp_path)
    exe = b.bin_dir / "llama-bench"
    exe.write_text("#!/bin/sh\nsleep 30\n")
    exe.chmod(0o755)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        bench.run_llama_bench(b, gguf, n_prompt=[131072], n_gen=[0], reps=1, timeout_s=1.0, version="fake",
                              extra=["--no-warmup"])
    assert e.value.kind == "timeout"
    assert time.monotonic() - t0 < 10
