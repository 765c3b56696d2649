"""The CPU `ar` engine on Qwen3 dense checkpoints against transformers' Qwen3ForCausalLM (fp32).

Greedy tokens must agree up to the first near-tie of the reference's logits (a random model's later
tokens diverge chaotically after a rounding-level flip), with the prefill logits' relative error small,
on odd tiny shapes (tied and untied, MHA and GQA) and, as one slower test, the qwen3-0.6b shape that
`lucebench models synth` writes. `lucebench generate --engine ar` runs the same checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import qwen3_synth
import qwen35_synth
import torch

N_GEN = 24

CONFIGS = qwen3_synth.TINY_CONFIGS


def margins(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Relative top-1 minus top-2 margin of the reference logits that chose each token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    top = logits.topk(2, dim=-1).values
    return ((top[:, 0] - top[:, 1]) / logits.abs().max(dim=-1).values).tolist()


def check(res: dict, model, prompt: list[int]) -> float:
    """Prefill logits within 1e-4; greedy tokens equal up to the first near-tie. Returns the logits' error."""
    want, want_logits = qwen35_synth.reference(model, prompt, len(res["output_ids"]))
    got = res["output_ids"]
    err = float((torch.tensor(res["last_logits"]) - want_logits).norm() / want_logits.norm())
    assert err < 1e-4, f"prefill logits relative error {err:.2e}"
    m = margins(model, prompt, want)
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            assert m[i] < 1e-4, f"token {i}: {a} vs transformers {b} with a clear margin {m[i]:.2e}"
            break
    return err


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_qwen3_matches_transformers(name, engine, tmp_path):
    model = qwen3_synth.make_model(seed=len(name), **CONFIGS[name])
    path = qwen35_synth.save(model, tmp_path / name)
    e = engine(path, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "128")
    assert e.ready["model"]["arch"] == "qwen3"
    assert e.ready["model"]["memory"]["recurrent_state_bytes"] == 0
    rng = random.Random(5)
    seen: set[int] = set()
    for n in (1, 9, 40):
        prompt = [rng.randrange(model.config.vocab_size) for _ in range(n)]
        res = e.generate(prompt, N_GEN, return_logits=True)
        assert res["type"] == "result", res
        check(res, model, prompt)
        seen.update(res["output_ids"])
    assert len(seen) > 6, "the test model repeats itself"


@pytest.mark.slow
def test_qwen3_06b_shape(engine, tmp_path):
    """The qwen3-0.6b shape (28 layers, hidden 1024, 16/8 heads x 128, vocab 151936, tied), synthesized by
    lucebench, against transformers loading the same folder."""
    from transformers import Qwen3ForCausalLM

    out = tmp_path / "q06"
    subprocess.run([sys.executable, "-m", "lucebench", "models", "synth", "--shape", "qwen3-0.6b", "--out", str(out)],
                   check=True, capture_output=True)
    model = Qwen3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    e = engine(out, "--kv-k", "f32", "--kv-v", "f32", "--max-ctx", "64")
    assert e.ready["model"]["n_layers"] == 28 and e.ready["model"]["arch"] == "qwen3"
    prompt = [1, 500, 20000, 151000, 7]
    res = e.generate(prompt, 8, return_logits=True)
    err = check(res, model, prompt)
    print(f"qwen3-0.6b shape: prefill logits relative error {err:.2e}")


@pytest.mark.slow
def test_generate_cli_runs_qwen3(ar_exe, tmp_path):
    model = qwen3_synth.make_model(seed=9)
    path = qwen35_synth.save(model, tmp_path / "g")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "lucebench", "generate", "--engine", "ar", "--backend", "cpu", "--model", str(path),
                           "--prompt-ids", "3,1,4,1,5", "--n-gen", "6", "--json"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)["output_ids"]
    want, _ = qwen35_synth.reference(model, [3, 1, 4, 1, 5], 6)
    assert got[0] == want[0]
    assert len(got) == 6
