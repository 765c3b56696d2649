"""The PyTorch HF baseline as a real subprocess speaking the engine protocol on a tiny synthetic model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lucebench.baselines import hf
from lucebench.models.shapes import get_shape
from lucebench.models.synth import synthesize

PROMPT = [314, 296, 832, 567, 8, 25, 40, 41]


class Engine:
    """A running engine process; every stdout line must be a protocol object."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=env)

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"engine closed stdout; stderr:\n{self.proc.stderr.read()[-3000:]}"
        msg = json.loads(line)  # anything but a JSON object here is a protocol violation
        assert isinstance(msg, dict) and msg["type"] in ("ready", "result", "error"), line
        return msg

    def send(self, obj: dict | str) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def ask(self, obj: dict | str) -> dict:
        self.send(obj)
        return self.read()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf-tiny")
    synthesize(get_shape("tiny"), out, seed=1, dtype="fp32")
    return out


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = Engine(hf.command(model_dir, device="cpu", dtype="fp32"))
    eng.ready = eng.read()
    yield eng
    if eng.proc.poll() is None:
        eng.proc.kill()
        eng.proc.wait()


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(prompt: list[int], n: int) -> list[int]:
        ids = torch.tensor([prompt])
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        return out[0, len(prompt):].tolist()

    return generate


def test_command_argv(tmp_path):
    argv = hf.command(tmp_path, device="cuda:1", dtype="bf16", compile=True, attn="sdpa")
    assert argv[:3] == [sys.executable, "-m", "lucebench.baselines.hf"]
    assert argv[3:] == ["--model", str(tmp_path), "--device", "cuda:1", "--dtype", "bf16", "--kernels", "auto",
                        "--compile", "--attn", "sdpa"]
    assert "--attn" not in hf.command(tmp_path, device="cpu", dtype="fp32")


def test_ready_line(engine):
    r = engine.ready
    assert r["protocol"] == "lucebench.engine/v1"
    assert r["engine"]["name"] == "hf" and r["engine"]["backend"] == "cpu"
    build = r["engine"]["build"]
    assert build["torch"] == torch.__version__ and build["transformers"]
    assert isinstance(build["fla"], bool) and isinstance(build["causal_conv1d"], bool)
    assert build["compile"] == {"requested": False, "enabled": False}
    m = r["model"]
    assert (m["arch"], m["n_layers"], m["hidden_size"], m["vocab_size"], m["dtype"]) == ("qwen3_5_text", 4, 64, 1088,
                                                                                        "fp32")
    assert m["weight_bytes"] == m["n_params"] * 4
    assert r["device"]["name"] == "cpu" and r["limits"]["max_ctx"] == 4096


def test_output_equals_transformers_generate(engine, reference):
    res = engine.ask({"type": "generate", "id": "r1", "prompt_ids": PROMPT, "n_gen": 24, "ignore_eos": True,
                      "eos_ids": []})
    assert res["type"] == "result" and res["id"] == "r1"
    assert res["n_gen"] == 24 and len(res["output_ids"]) == 24 and res["n_prompt"] == len(PROMPT)
    assert res["output_ids"] == reference(PROMPT, 24)
    assert res["decode_steps"] == 23 and res["stop"] == "length"
    t = res["timing"]
    assert t["t_prefill_start_ns"] < t["t_prefill_end_ns"] == t["t_decode_start_ns"] < t["t_decode_end_ns"]
    assert t["prefill_ms"] > 0 and t["decode_ms"] > 0
    # Device-timed durations agree with the monotonic stamps (both measured after synchronisation).
    assert abs((t["t_decode_end_ns"] - t["t_decode_start_ns"]) / 1e6 - t["decode_ms"]) < 50
    assert res["bytes_per_token"] > engine.ready["model"]["weight_bytes"]
    assert res["peak_mem_bytes"] > 0


def test_single_token_request_has_empty_decode(engine, reference):
    res = engine.ask({"type": "generate", "id": "one", "prompt_ids": PROMPT[:3], "n_gen": 1})
    assert res["output_ids"] == reference(PROMPT[:3], 1)
    assert res["decode_steps"] == 0 and res["timing"]["decode_ms"] == 0
    assert res["timing"]["t_decode_start_ns"] == res["timing"]["t_decode_end_ns"]


def test_eos_stops_only_when_allowed(engine, reference):
    full = reference(PROMPT, 12)
    stop_tok = full[4]
    first = full.index(stop_tok)
    res = engine.ask({"type": "generate", "id": "eos", "prompt_ids": PROMPT, "n_gen": 12, "ignore_eos": False,
                      "eos_ids": [stop_tok]})
    assert res["stop"] == "eos" and res["output_ids"] == full[:first + 1] and res["n_gen"] == first + 1
    ignored = engine.ask({"type": "generate", "id": "eos2", "prompt_ids": PROMPT, "n_gen": 12, "ignore_eos": True,
                          "eos_ids": [stop_tok]})
    assert ignored["output_ids"] == full and ignored["stop"] == "length"


def test_bad_requests_are_answered_and_serving_continues(engine, reference):
    bad = engine.ask("this is not json")
    assert bad["type"] == "error" and bad["kind"] == "bad_request"
    missing = engine.ask({"type": "generate", "id": "m", "prompt_ids": [1, 2]})
    assert (missing["kind"], missing["id"]) == ("bad_request", "m") and "n_gen" in missing["message"]
    out_of_vocab = engine.ask({"type": "generate", "id": "v", "prompt_ids": [1, 99999], "n_gen": 2})
    assert out_of_vocab["kind"] == "bad_request"
    overflow = engine.ask({"type": "generate", "id": "o", "prompt_ids": PROMPT, "n_gen": 5000})
    assert (overflow["kind"], overflow["id"]) == ("context_overflow", "o")
    unknown = engine.ask({"type": "teleport", "id": "u"})
    assert unknown["kind"] == "bad_request"
    ok = engine.ask({"type": "generate", "id": "after", "prompt_ids": PROMPT, "n_gen": 3})
    assert ok["type"] == "result" and ok["output_ids"] == reference(PROMPT, 3)


def test_shutdown_exits_zero(engine):
    engine.send({"type": "shutdown"})
    assert engine.proc.wait(timeout=60) == 0
    assert engine.proc.stdout.read() == ""  # nothing after the last reply


def test_missing_model_is_a_load_error(tmp_path):
    proc = subprocess.run(hf.command(tmp_path / "nope", device="cpu", dtype="fp32"), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    msg = json.loads(lines[0])
    assert msg["type"] == "error" and msg["kind"] == "load" and "config.json" in msg["message"]


def test_cuda_without_gpu_is_a_load_error(model_dir):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU error path cannot be exercised")
    proc = subprocess.run(hf.command(model_dir, device="cuda:0", dtype="bf16"), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0
    msg = json.loads(proc.stdout.splitlines()[0])
    assert msg["kind"] == "load" and "CUDA" in msg["message"]


def test_compile_runs_the_static_cache_path(model_dir, reference):
    # Dynamo's "eager" backend traces exactly what inductor would compile, in seconds instead of minutes.
    env = {**os.environ, "LUCEBENCH_HF_COMPILE_BACKEND": "eager"}
    eng = Engine(hf.command(model_dir, device="cpu", dtype="fp32", compile=True), env=env)
    try:
        ready = eng.read()
        comp = ready["engine"]["build"]["compile"]
        assert comp["requested"] and comp["enabled"] and comp["cache"] == "StaticCache" and comp["backend"] == "eager"
        expected = reference(PROMPT, 10)
        for rid in ("c1", "c2"):  # the second request reuses the reset static cache
            res = eng.ask({"type": "generate", "id": rid, "prompt_ids": PROMPT, "n_gen": 10})
            assert res["output_ids"] == expected and res["decode_steps"] == 9
        eng.send({"type": "shutdown"})
        assert eng.proc.wait(timeout=60) == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()


def test_compile_that_cannot_work_answers_unsupported(model_dir):
    env = {**os.environ, "LUCEBENCH_HF_COMPILE_BACKEND": "no-such-backend"}
    eng = Engine(hf.command(model_dir, device="cpu", dtype="fp32", compile=True), env=env)
    try:
        comp = eng.read()["engine"]["build"]["compile"]
        assert comp["requested"] and not comp["enabled"] and comp["reason"]
        res = eng.ask({"type": "generate", "id": "x", "prompt_ids": PROMPT, "n_gen": 2})
        assert (res["type"], res["kind"], res["id"]) == ("error", "unsupported", "x")
        eng.send({"type": "shutdown"})
        assert eng.proc.wait(timeout=60) == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()


def test_kernels_torch_hides_flash_linear_attention(model_dir, tmp_path):
    """A stand-in `fla` package is seen with --kernels auto and hidden with --kernels torch."""
    (tmp_path / "fla").mkdir()
    (tmp_path / "fla" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    seen = {}
    for kernels in ("auto", "torch"):
        eng = Engine(hf.command(model_dir, device="cpu", dtype="fp32", kernels=kernels), env=env)
        seen[kernels] = eng.read()["engine"]["build"]["fla"]
        out = eng.ask({"type": "generate", "id": "k", "prompt_ids": PROMPT, "n_gen": 4, "ignore_eos": True})
        assert out["type"] == "result" and len(out["output_ids"]) == 4
        eng.send({"type": "shutdown"})
        assert eng.proc.wait(timeout=60) == 0
    assert seen == {"auto": True, "torch": False}
