"""`lucebench-ar` on the protocol (docs/protocol.md), its load errors, KV cache types and limits."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import qwen35_synth as synth
import torch
from safetensors.torch import load_file, save_file


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    model = synth.make_model(seed=4)
    return synth.save(model, tmp_path_factory.mktemp("proto") / "m")


def run_once(exe: Path, *args: str, stdin: str = "") -> tuple[int, list[dict], str]:
    proc = subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True, timeout=120)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------- load errors

def expect_load_error(exe: Path, model: Path, fragment: str, kind: str = "load", *extra: str) -> None:
    code, lines, _ = run_once(exe, "--model", str(model), *extra)
    assert code != 0
    assert len(lines) == 1 and lines[0]["type"] == "error" and "id" not in lines[0], lines
    assert lines[0]["kind"] == kind, lines[0]
    assert fragment in lines[0]["message"], lines[0]["message"]


def test_missing_model(ar_exe, tmp_path):
    expect_load_error(ar_exe, tmp_path / "nowhere", "does not exist")


def test_missing_tensor(ar_exe, model_dir, tmp_path):
    m = copy_model(model_dir, tmp_path / "m")
    sd = load_file(m / "model.safetensors")
    del sd["model.layers.1.linear_attn.A_log"]
    save_file(sd, m / "model.safetensors", metadata={"format": "pt"})
    expect_load_error(ar_exe, m, "missing tensor model.layers.1.linear_attn.A_log")


def test_wrong_shape(ar_exe, model_dir, tmp_path):
    m = copy_model(model_dir, tmp_path / "m")
    sd = load_file(m / "model.safetensors")
    sd["model.layers.3.self_attn.o_proj.weight"] = torch.zeros(64, 100)
    save_file(sd, m / "model.safetensors", metadata={"format": "pt"})
    expect_load_error(ar_exe, m, "model.layers.3.self_attn.o_proj.weight has shape [64, 100], expected [64, 128]")


def test_unsupported_dtype(ar_exe, model_dir, tmp_path):
    m = copy_model(model_dir, tmp_path / "m")
    sd = load_file(m / "model.safetensors")
    sd["model.norm.weight"] = sd["model.norm.weight"].double()
    save_file(sd, m / "model.safetensors", metadata={"format": "pt"})
    expect_load_error(ar_exe, m, "F64", "unsupported")


def test_truncated_file(ar_exe, model_dir, tmp_path):
    m = copy_model(model_dir, tmp_path / "m")
    data = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(data[: len(data) // 2])
    expect_load_error(ar_exe, m, "truncated")


def test_truncated_gguf(ar_exe, tmp_path):
    from gguf_writer import write_qwen35_gguf

    path = write_qwen35_gguf(synth.make_model(seed=9, hidden_size=64), tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    expect_load_error(ar_exe, path, "truncated")


def test_bad_kv_type(ar_exe, model_dir):
    expect_load_error(ar_exe, model_dir, "q5_1", "unsupported", "--kv-k", "q5_1")


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_gpu_backend_on_a_cpu_build(ar_exe, model_dir, backend):
    """A cpu build asked for a GPU backend says how to rebuild (core/engine_main.cpp, make_backend)."""
    expect_load_error(ar_exe, model_dir, f"built for the cpu backend only; rebuild with --backend {backend}",
                      "unsupported", "--backend", backend)


@pytest.mark.parametrize("flags", [("--budget", "22"), ("--budget=22",), ("--draft", "/some/draft"),
                                   ("--drafter=/some/drafter",), ("--keep-ratio", "0.05"), ("--chain",),
                                   ("--chain=false",), ("--budget", "0")])
def test_speculative_flags_are_refused_by_name(ar_exe, model_dir, flags):
    """`ar` takes none of the speculative engines' flags: one `unsupported` line naming the flag, exit 2,
    whatever the value (docs/protocol.md)."""
    code, lines, _ = run_once(ar_exe, "--model", str(model_dir), *flags)
    name = flags[0].split("=")[0]
    assert code == 2
    assert len(lines) == 1 and lines[0]["type"] == "error" and lines[0]["kind"] == "unsupported", lines
    assert f"lucebench-ar does not take {name}" in lines[0]["message"], lines[0]["message"]


def test_unknown_and_malformed_flags(ar_exe, model_dir):
    code, lines, _ = run_once(ar_exe, "--model", str(model_dir), "--budgets", "3")
    assert code == 2 and lines[0]["kind"] == "load" and "unknown flag --budgets" in lines[0]["message"]
    code, lines, _ = run_once(ar_exe, "--model", str(model_dir), "--max-ctx=99999999999")
    assert code == 2 and "needs an integer" in lines[0]["message"]


# ---------------------------------------------------------------------------------------------- protocol

def test_ready_and_result_fields(engine, model_dir):
    e = engine(model_dir, "--max-ctx", "64")
    r = e.ready
    assert r["type"] == "ready" and r["protocol"] == "lucebench.engine/v1"
    assert r["engine"]["name"] == "ar" and r["engine"]["backend"] == "cpu"
    assert set(r["engine"]["build"]) >= {"compiler", "flags", "arch", "source_hash"}
    assert r["model"]["arch"] == "qwen3_5" and r["model"]["vocab_size"] == 512 and r["model"]["n_params"] > 0
    assert r["limits"]["max_ctx"] == 64 and r["device"]["memory_bytes"] > 0
    res = e.generate([1, 2, 3], 5, id="x/1")
    assert res["type"] == "result" and res["id"] == "x/1"
    assert len(res["output_ids"]) == 5 and res["n_prompt"] == 3 and res["n_gen"] == 5 and res["stop"] == "length"
    t = res["timing"]
    assert t["t_prefill_start_ns"] <= t["t_prefill_end_ns"] == t["t_decode_start_ns"] <= t["t_decode_end_ns"]
    assert t["prefill_ms"] > 0 and t["decode_ms"] > 0 and res["decode_steps"] == 4
    assert res["bytes_per_token"] > 0 and res["peak_mem_bytes"] > 0
    # n_gen 1: empty decode phase
    one = e.generate([5, 6], 1)
    assert one["decode_steps"] == 0 and one["timing"]["decode_ms"] == 0
    assert one["timing"]["t_decode_start_ns"] == one["timing"]["t_decode_end_ns"]
    # Same request twice gives the same tokens (state is reset between requests).
    assert e.generate([1, 2, 3], 5)["output_ids"] == res["output_ids"]
    assert e.close() == 0


def test_errors_keep_serving(engine, model_dir):
    e = engine(model_dir, "--max-ctx", "16")
    over = e.generate(list(range(10)), 10, id="big")
    assert over == {"type": "error", "id": "big", "kind": "context_overflow",
                    "message": "prompt 10 + n_gen 10 exceeds max_ctx 16"}
    e.send("this is not json")
    assert e.read()["kind"] == "bad_request"
    e.send({"type": "dance", "id": "d"})
    bad = e.read()
    assert bad["kind"] == "bad_request" and bad["id"] == "d"
    assert e.generate([600], 2)["kind"] == "bad_request"  # outside the vocabulary
    assert e.generate([1], 0)["kind"] == "bad_request"
    assert e.generate([], 3)["kind"] == "bad_request"
    ok = e.generate(list(range(10)), 6)
    assert ok["type"] == "result" and len(ok["output_ids"]) == 6
    assert e.close() == 0


def test_eos_stops_when_not_ignored(engine, model_dir):
    e = engine(model_dir)
    full = e.generate([7, 8, 9], 12)["output_ids"]
    eos = full[3]
    stopped = e.generate([7, 8, 9], 12, ignore_eos=False, eos_ids=[eos])
    first = full.index(eos)
    assert stopped["output_ids"] == full[: first + 1] and stopped["stop"] == "eos"
    assert e.generate([7, 8, 9], 12, ignore_eos=True, eos_ids=[eos])["output_ids"] == full


def test_stdout_is_protocol_only(ar_exe, model_dir):
    reqs = "\n".join(json.dumps(r) for r in (
        {"type": "generate", "id": "a", "prompt_ids": [1, 2], "n_gen": 3},
        {"type": "shutdown"},
        {"type": "generate", "id": "never", "prompt_ids": [1, 2], "n_gen": 3})) + "\n"
    code, lines, stderr = run_once(ar_exe, "--model", str(model_dir), stdin=reqs)
    assert code == 0
    assert [line["type"] for line in lines] == ["ready", "result"]
    assert "loading" in stderr


# ---------------------------------------------------------------------------------------------- KV cache types

@pytest.mark.slow
@pytest.mark.parametrize("kv", ["f16", "bf16", "q8_0", "q4_0"])
def test_kv_types_agree_with_f32(engine, model_dir, kv):
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5] * 3, [42]]
    ref = engine(model_dir, "--kv-k", "f32", "--kv-v", "f32")
    want = [ref.generate(p, 32, return_logits=True) for p in prompts]
    e = engine(model_dir, "--kv-k", kv, "--kv-v", kv)
    assert e.ready["engine"]["options"] == {"kv_k": kv, "kv_v": kv, "compute_dtype": "f32"}
    got = [e.generate(p, 32, return_logits=True) for p in prompts]
    agree = sum(a == b for g, w in zip(got, want) for a, b in zip(g["output_ids"], w["output_ids"]))
    total = sum(len(w["output_ids"]) for w in want)
    tol = {"f16": 0.95, "bf16": 0.6, "q8_0": 0.6, "q4_0": 0.3}[kv]
    assert agree / total >= tol, f"{kv}: {agree}/{total} tokens agree with an f32 cache"
    for g, w in zip(got, want):
        a, b = torch.tensor(g["last_logits"]), torch.tensor(w["last_logits"])
        assert float((a - b).norm() / b.norm()) < {"f16": 1e-3, "bf16": 1e-2, "q8_0": 1e-2, "q4_0": 0.1}[kv]
    # K and V types are independent.
    mixed = engine(model_dir, "--kv-k", "q8_0", "--kv-v", "f16")
    assert mixed.ready["engine"]["options"]["kv_k"] == "q8_0"
    assert mixed.generate(prompts[0], 4)["type"] == "result"
    # A bigger cache element means more bytes per decode step.
    if kv == "q4_0":
        assert e.generate(prompts[0], 4)["bytes_per_token"] < ref.generate(prompts[0], 4)["bytes_per_token"]


def test_core_unit_tests(ar_exe):
    """The C++ unit checks (JSON, fp16/bf16, KV blocks, chunked vs recurrent delta rule)."""
    build = ar_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-core-tests", "-j", "2"], check=True,
                   capture_output=True)
    proc = subprocess.run([str(build / "lucebench-core-tests")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
