"""The C++ verify checks (engines/tests/verify_tests.cpp): verify + commit + continue == autoregressive
greedy on scripted trees (accepted depths 0..15, wrong siblings, random branches, chains) for Qwen3.5 and
Qwen3 random models, states after commit == AR states, two models in one process, truncate; and a verify's
logits and features against transformers."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import qwen3_synth
import qwen35_synth
import torch


def test_verify_forward_and_commit(ar_exe):
    proc = subprocess.run([_verify_exe(ar_exe)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("verify rounds == AR greedy") == 3, proc.stdout


def _verify_exe(ar_exe) -> str:
    build = ar_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-verify-tests", "-j", "2"], check=True,
                   capture_output=True)
    return str(build / "lucebench-verify-tests")


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3"])
def test_verify_outputs_match_transformers(arch, ar_exe, tmp_path):
    """A chain verify's logits at every row and its features (the residual stream after layer id, HF's
    hidden_states[id + 1]) against transformers on the same checkpoint."""
    if arch == "qwen3":
        model = qwen3_synth.make_model(seed=4, num_hidden_layers=4)
    else:
        model = qwen35_synth.make_model(seed=4)
    path = qwen35_synth.save(model, tmp_path / arch)
    layers = [0, 2]
    tokens = [7, 300, 12, 99, 45, 3, 211, 150, 8, 64, 1, 500]
    proc = subprocess.run([_verify_exe(ar_exe), "features", str(path), ",".join(map(str, layers)),
                           ",".join(map(str, tokens))], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    n, H, V = len(tokens), model.config.hidden_size, model.config.vocab_size
    logits = torch.tensor(got["logits"]).reshape(n, V)
    err = float((logits - out.logits[0]).norm() / out.logits[0].norm())
    assert err < 1e-4, f"logits relative error {err:.2e}"
    feats = torch.tensor(got["features"]).reshape(n, len(layers), H)
    for f, layer in enumerate(layers):
        want = out.hidden_states[layer + 1][0]
        ferr = float((feats[:, f] - want).norm() / want.norm())
        assert ferr < 1e-5, f"layer {layer} features relative error {ferr:.2e}"
    top = out.logits[0].topk(2, dim=-1)
    clear = (top.values[:, 0] - top.values[:, 1]) > 1e-4 * out.logits[0].abs().max()
    for row in range(n):
        if clear[row]:
            assert got["argmax"][row] == int(top.indices[row, 0]), f"row {row} argmax"


def test_ready_line_reports_memory(engine, tmp_path):
    """model.memory in the ready line: weights, KV cache, recurrent state, and what one verify row keeps per
    DeltaNet layer for commit (k, u, gamma and the conv input, fp32)."""
    model = qwen35_synth.make_model(seed=2)
    c = model.config
    e = engine(qwen35_synth.save(model, tmp_path / "m"), "--kv-k", "f16", "--kv-v", "f32", "--max-ctx", "100")
    mem = e.ready["model"]["memory"]
    n_full = c.layer_types.count("full_attention")
    n_lin = c.num_hidden_layers - n_full
    kd, vd = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
    conv_dim = 2 * kd + vd
    assert e.ready["model"]["arch"] == "qwen3_5"
    assert mem["weights_bytes"] == 4 * sum(p.numel() for p in model.parameters())
    assert mem["kv_cache_bytes"] == n_full * 100 * c.num_key_value_heads * c.head_dim * (2 + 4)
    assert mem["recurrent_state_bytes"] == 4 * n_lin * (
        c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim + conv_dim * (c.linear_conv_kernel_dim - 1))
    assert mem["verify_bytes_per_node"] == 4 * n_lin * (kd + vd + c.linear_num_value_heads + conv_dim)
