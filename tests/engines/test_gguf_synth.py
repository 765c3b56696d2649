"""`lucebench models synth --format gguf`: a qwen35 GGUF written directly, typed as llama.cpp's Q4_K_M recipe.
The file must hold what the recipe gives each tensor, read back as the values the scale rule asks for, say it is
synthetic, load in our CPU engine (which then generates varied tokens) and in llama.cpp (llama-bench runs it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

from lucebench.models.gguf_synth import gguf_tensors, synthesize_gguf, tensor_type
from lucebench.models.shapes import Shape, _qwen3_5, _small_special_ids, get_shape

# Every dimension a whole number of 256-element blocks; 4 layers: 3 DeltaNet, 1 attention; value heads tiled.
TINY = Shape(name="tiny-gguf", special_ids=_small_special_ids(1024), bpe_vocab=1024,
             config=_qwen3_5(n_layers=4, hidden=256, intermediate=512, vocab=1088, heads=2, kv_heads=1, head_dim=128,
                             lin_k_heads=2, lin_v_heads=4, lin_k_dim=64, lin_v_dim=64, tied=False, max_pos=4096,
                             eos=1024, mrope=[11, 11, 10]))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_gguf(TINY, tmp_path_factory.mktemp("gguf"), quant="q4_k_m", seed=3).path


def test_q4_k_m_recipe_27b() -> None:
    """The 27B mix: 64 layers, the "more bits" layers (first and last 8, every third between) get Q6_K for
    attn_v / attn_qkv and ffn_down; output Q6_K; the untied token_embd Q4_K; norms, conv, A, dt F32."""
    cfg = get_shape("qwen3.5-27b").config
    types = {t.name: tensor_type(t.name, t.layer, 64, tied=False, quant="q4_k_m") for t in gguf_tensors(cfg)}
    more = [i for i in range(64) if i < 8 or i >= 56 or (i - 8) % 3 == 2]
    assert len(more) == 32
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    for i in range(64):
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.ffn_down.weight"] == want
        assert types.get(f"blk.{i}.attn_qkv.weight", types.get(f"blk.{i}.attn_v.weight")) == want
        assert types[f"blk.{i}.ffn_gate.weight"] == "Q4_K"
    assert types["blk.0.ssm_conv1d.weight"] == "F32" and types["blk.0.ssm_a"] == "F32"
    assert types["blk.3.attn_q_norm.weight"] == "F32" and types["blk.0.ssm_alpha.weight"] == "Q4_K"
    assert get_shape("qwen3.5-0.8b").config["tie_word_embeddings"]
    assert tensor_type("token_embd.weight", -1, 24, tied=True, quant="q4_k_m") == "Q6_K"


def test_file_contents(tiny_gguf: Path) -> None:
    r = gguf.GGUFReader(tiny_gguf)
    assert r.fields["general.architecture"].contents() == "qwen35"
    assert r.fields["lucebench.synthetic"].contents() is True
    assert "SYNTHETIC" in r.fields["general.name"].contents()
    assert r.fields["general.file_type"].contents() == 15
    assert r.fields["qwen35.attention.recurrent_layers"].contents() == [True, True, True, False]
    side = json.loads((tiny_gguf.parent / "lucebench_synth.json").read_text())
    assert side["synthetic"] is True and side["quant"] == "q4_k_m"
    names = [t.name for t in r.tensors]
    assert names[:3] == ["output.weight", "output_norm.weight", "token_embd.weight"]
    assert names == [t.name for t in gguf_tensors(TINY.config)]
    for t in r.tensors:
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        assert t.tensor_type.name == tensor_type(t.name, layer, 4, tied=False, quant="q4_k_m"), t.name
        if t.tensor_type.name == "F32":
            continue
        v = gguf.quants.dequantize(t.data, t.tensor_type)
        want = 1.0 if t.name == "token_embd.weight" else 1.0 / np.sqrt(v.shape[-1])
        assert np.all(np.isfinite(v)) and abs(v.std() / want - 1) < 0.2, (t.name, v.std(), want)
        if v.size >= 64 * 256:  # centred (a few blocks' means vary too much to say)
            assert abs(v.mean()) < 0.2 * want, t.name
        rows = v.reshape(-1, v.shape[-1])
        assert len({r.tobytes() for r in rows}) == len(rows), f"{t.name}: repeated rows"


def test_cpu_engine_loads_and_generates(tiny_gguf: Path, engine) -> None:
    e = engine(tiny_gguf, "--max-ctx", "64")
    assert e.ready["model"]["arch"] == "qwen3_5" and e.ready["model"]["dtype"] in ("q4_k", "q6_k")
    out = e.generate([5, 77, 123, 9, 250, 31], 12, ignore_eos=True)["output_ids"]
    assert len(out) == 12 and len(set(out)) > 3, out


@pytest.mark.slow
def test_llamacpp_loads_it(tiny_gguf: Path) -> None:
    from lucebench.baselines.llamacpp.build import build_llamacpp

    b = build_llamacpp(backend="cpu")
    proc = subprocess.run([str(b.binary("llama-bench")), "-m", str(tiny_gguf), "-p", "8", "-n", "4", "-r", "1", "-t", "1",
                           "-o", "json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert {r["n_gen"] for r in rows} >= {4} and all(r["avg_ts"] > 0 for r in rows)
    assert "Q4_K - Medium" in rows[0]["model_type"]


@pytest.mark.slow
def test_recipe_matches_llama_quantize(tmp_path: Path) -> None:
    """llama-quantize itself, requantising a Q8_0 file of the tiny shape to Q4_K_M, picks our type for every
    tensor (the DeltaNet attn_qkv included: Q4_K / Q6_K with attn_v's rule, not the Q5_K of the recipe's
    unreachable ATTENTION_QKV branch)."""
    from lucebench.baselines.llamacpp.build import build_llamacpp

    b = build_llamacpp(backend="cpu")
    src = synthesize_gguf(TINY, tmp_path, quant="q8_0", seed=1).path
    out = tmp_path / "requant.gguf"
    proc = subprocess.run([str(b.binary("llama-quantize")), "--allow-requantize", str(src), str(out), "Q4_K_M", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    want = {t.name: tensor_type(t.name, t.layer, 4, tied=False, quant="q4_k_m") for t in gguf_tensors(TINY.config)}
    assert got == want
    assert {got["blk.0.attn_qkv.weight"], got["blk.2.attn_qkv.weight"]} == {"Q4_K", "Q6_K"}
