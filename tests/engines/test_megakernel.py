"""The `megakernel` engine (engines/megakernel).

Runs anywhere: the decode kernel compiles for sm_90, sm_86 and sm_75 (fp16 weights) when nvcc is on PATH,
and a CPU build of lucebench-megakernel answers with one `unsupported` error line. With a CUDA GPU: greedy
tokens against transformers' Qwen3_5ForCausalLM (fp32) on a small synthetic model of the shape class the
kernel supports, plus determinism and the no-round-trip decode chain.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "engines"


def _nvcc() -> str | None:
    return shutil.which("nvcc")


@pytest.mark.parametrize("arch,extra", [("90", []), ("86", []), ("75", ["-DLB_GPU_FP16=1"])])
def test_decode_kernel_compiles(arch: str, extra: list[str], tmp_path: Path) -> None:
    if _nvcc() is None:
        pytest.skip("nvcc not on PATH")
    for src in ("decode_kernel.cu", "mk_backend.cu"):
        cmd = [_nvcc(), "-O3", "-std=c++17", f"-arch=sm_{arch}", "--expt-relaxed-constexpr", *extra, "-I", str(ENGINES),
               "-Xptxas", "-v", "-c", str(ENGINES / "megakernel" / src), "-o", str(tmp_path / f"{src}.o")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]


def _build(backend: str, arch: str | None = None) -> Path:
    """The engine as `lucebench build` makes it (cached by source hash, backend and arch)."""
    from lucebench.engines.build import build_engine

    return build_engine("megakernel", backend=backend, arch=arch)


def test_cpu_build_reports_unsupported(tmp_path_factory) -> None:
    exe = _build("cpu")
    proc = subprocess.run([str(exe), "--model", "/nonexistent"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    err = json.loads(lines[0])
    assert err["type"] == "error" and err["kind"] == "unsupported" and "cuda" in err["message"]


def _gpu_arch() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0].replace(".", "") if out else None


@pytest.mark.skipif(_gpu_arch() is None or _nvcc() is None, reason="needs an NVIDIA GPU and nvcc")
def test_megakernel_matches_transformers(tmp_path_factory) -> None:
    import qwen35_synth as synth
    import torch
    from conftest import Engine

    exe = _build("cuda", _gpu_arch())
    # Hybrid 3:1, GQA 4:1, head_dim 256 with partial rotary, DeltaNet 128-dim heads: the kernel's shape class.
    model = synth.make_model(seed=3, vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=256, linear_num_key_heads=2,
                             linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=64,
                             tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    ckpt = synth.save(model, tmp_path_factory.mktemp("mk-ckpt"), torch.bfloat16)
    model = model.to(torch.bfloat16).to(torch.float32)  # the reference on the same bf16-rounded weights
    rng = random.Random(5)
    prompts = [[rng.randrange(4096) for _ in range(n)] for n in (1, 9, 80)]
    eng = Engine(exe, ckpt, "--max-ctx", "256")
    assert eng.ready["type"] == "ready", eng.ready
    matched = total = 0
    for i, p in enumerate(prompts):
        want, _ = synth.reference(model, p, 48)
        got = eng.generate(p, 48, id=f"p{i}")
        assert got["type"] == "result" and got["decode_steps"] == 47 and got["bytes_per_token"] > 0
        again = eng.generate(p, 48, id=f"q{i}")
        assert again["output_ids"] == got["output_ids"], "decode is not deterministic (a race?)"
        matched += sum(a == b for a, b in zip(got["output_ids"], want))
        total += len(want)
    assert eng.close() == 0
    assert matched / total >= 0.95, f"agreement {matched}/{total}"
