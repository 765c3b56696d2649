"""GPU check of the `ar` engine (run on the device machine from the repository root, PYTHONPATH=.).

Builds the CUDA engine, synthesises a Qwen3.5-0.8B-shaped random checkpoint (BF16, re-scaled init),
compares ar with transformers on cuda (greedy tokens over 128 steps on 8 prompts, prefill logits), and
times pp520 / tg128 for ar and transformers eager. Prints a table; writes $OUT/check_ar.json.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engines"))
import qwen35_synth as synth  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
H200_BW = 4.8e12  # bytes/s, HBM3e spec
results: dict = {}


def log(msg: str) -> None:
    print(msg, flush=True)


def build(arch: str) -> Path:
    import shutil

    t = time.time()
    if shutil.which("cmake"):
        from lucebench.engines.build import build_engine

        exe = build_engine("ar", backend="cuda", arch=arch)
    else:  # no CMake on this machine: the same sources, one nvcc command
        root = Path(__file__).resolve().parents[2] / "engines"
        srcs = [str(p) for p in sorted((root / "core").rglob("*.cpp")) + sorted((root / "core" / "cuda").glob("*.cu"))]
        exe = Path("/tmp/lucebench-ar")
        cmd = ["nvcc", "-O3", "-std=c++17", f"-arch=sm_{arch}", "-x", "cu", "-DLB_HAVE_GPU=1",
               '-DLB_DEFAULT_BACKEND="cuda"', f'-DLB_ARCH="sm_{arch}"', "-Xcompiler", "-fopenmp", "-I", str(root),
               *srcs, str(root / "ar" / "main.cpp"), "-o", str(exe), "-lgomp"]
        subprocess.run(cmd, check=True)
    results["build_seconds"] = round(time.time() - t, 1)
    log(f"built {exe} in {results['build_seconds']} s")
    return exe


class Engine:
    def __init__(self, exe: Path, model: Path, *extra: str):
        self.p = subprocess.Popen([str(exe), "--model", str(model), *extra], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        self.ready = json.loads(self.p.stdout.readline())

    def gen(self, prompt: list[int], n: int, **kw) -> dict:
        self.p.stdin.write(json.dumps({"type": "generate", "id": "x", "prompt_ids": prompt, "n_gen": n, **kw}) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.write('{"type": "shutdown"}\n')
        self.p.stdin.flush()
        self.p.wait(60)


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    out = model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
    last = out.logits[0, -1].float().clone()
    cache, toks = out.past_key_values, [int(out.logits[0, -1].argmax())]
    for _ in range(n - 1):
        out = model(input_ids=torch.tensor([[toks[-1]]], device="cuda"), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        toks.append(int(out.logits[0, -1].argmax()))
    return toks, last


@torch.no_grad()
def hf_timing(model, vocab: int) -> dict:
    prompt = torch.randint(0, vocab, (1, 520), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    for _ in range(2):
        model(input_ids=prompt, use_cache=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    pp = 520 / (sum(times) / len(times))
    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(128):
        out = model(input_ids=tok, past_key_values=cache, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    tg = 128 / (time.perf_counter() - t)
    return {"pp520_tok_s": round(pp, 1), "tg128_tok_s": round(tg, 1)}


def main() -> None:
    arch = sys.argv[1] if len(sys.argv) > 1 else "90"
    exe = build(arch)
    shape = dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                 linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                 tie_word_embeddings=True, max_position_embeddings=8192,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    t = time.time()
    model = synth.make_model(seed=0, **shape)
    ckpt = Path("/tmp/qwen35-0.8b-synth")
    synth.save(model, ckpt, torch.bfloat16)
    log(f"synthesised checkpoint in {time.time() - t:.0f} s")
    model = model.to(torch.bfloat16).to("cuda").eval()  # transformers in BF16 (what the HF baseline runs)
    ref32 = None
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 248320, (n,), generator=gen).tolist() for n in (1, 5, 17, 64, 100, 130, 257, 400)]

    # --- correctness: ar (bf16 weights, fp32 activations, f32 KV) vs transformers fp32 (bf16-rounded weights) and bf16
    eng = Engine(exe, ckpt, "--max-ctx", "1024", "--kv-k", "f32", "--kv-v", "f32")
    results["ready"] = eng.ready
    log(json.dumps(eng.ready))
    ar_out = [eng.gen(p, 128, return_logits=True) for p in prompts]
    eng.close()
    hf16 = [hf_greedy(model, p, 128) for p in prompts]
    ref32 = model.float()
    hf32 = [hf_greedy(ref32, p, 128) for p in prompts]

    def agree(a: list[list[int]], b: list[list[int]]) -> float:
        return sum(x == y for u, v in zip(a, b) for x, y in zip(u, v)) / sum(len(u) for u in a)

    def prefix(a: list[list[int]], b: list[list[int]]) -> float:
        tot = 0
        for u, v in zip(a, b):
            k = 0
            while k < len(u) and u[k] == v[k]:
                k += 1
            tot += k
        return tot / len(a)

    def rel(a, b) -> float:
        return float((a - b).norm() / b.norm())

    ar_toks = [r["output_ids"] for r in ar_out]
    results["correctness"] = {
        "prompts": [len(p) for p in prompts], "n_gen": 128,
        "agree_vs_hf_fp32": agree(ar_toks, [t for t, _ in hf32]),
        "agree_vs_hf_bf16": agree(ar_toks, [t for t, _ in hf16]),
        "agree_hf_bf16_vs_hf_fp32": agree([t for t, _ in hf16], [t for t, _ in hf32]),
        "mean_matching_prefix_vs_hf_fp32": prefix(ar_toks, [t for t, _ in hf32]),
        "first_token_agree_vs_hf_fp32": sum(a[0] == b[0] for a, (b, _) in zip(ar_toks, hf32)) / len(prompts),
        "logits_rel_err_vs_hf_fp32": [rel(torch.tensor(r["last_logits"]), l.cpu()) for r, (_, l) in zip(ar_out, hf32)],
        "logits_rel_err_hf_bf16_vs_fp32": [rel(a.cpu(), b.cpu()) for (_, a), (_, b) in zip(hf16, hf32)],
    }
    log(json.dumps(results["correctness"], indent=1))
    del ref32
    model = model.to(torch.bfloat16)

    # --- timing: pp520 (mean of 10 after 3 warm-ups) and tg128, bf16 KV cache
    eng = Engine(exe, ckpt, "--max-ctx", "1024")
    p520 = torch.randint(0, 248320, (520,), generator=gen).tolist()
    for _ in range(3):
        eng.gen(p520, 1)
    pre = [eng.gen(p520, 1)["timing"]["prefill_ms"] for _ in range(10)]
    tg = [eng.gen(p520[:16], 129) for _ in range(3)]
    eng.close()
    dec_ms = min(r["timing"]["decode_ms"] for r in tg)
    bpt = tg[0]["bytes_per_token"]
    ar = {"pp520_tok_s": round(520 / (sum(pre) / len(pre) / 1e3), 1), "tg128_tok_s": round(128 / (dec_ms / 1e3), 1),
          "bytes_per_token": bpt, "roofline_tok_s": round(H200_BW / bpt, 1)}
    ar["roofline_fraction"] = round(ar["tg128_tok_s"] / ar["roofline_tok_s"], 3)
    results["ar"] = ar
    results["hf_eager_bf16"] = hf_timing(model, 248320)
    results["speedup_decode_vs_hf"] = round(ar["tg128_tok_s"] / results["hf_eager_bf16"]["tg128_tok_s"], 2)
    results["speedup_prefill_vs_hf"] = round(ar["pp520_tok_s"] / results["hf_eager_bf16"]["pp520_tok_s"], 2)
    log("\n| engine | pp520 tok/s | tg128 tok/s |\n|---|---|---|")
    log(f"| ar (cuda sm_{arch}) | {ar['pp520_tok_s']} | {ar['tg128_tok_s']} |")
    log(f"| transformers eager bf16 | {results['hf_eager_bf16']['pp520_tok_s']} | {results['hf_eager_bf16']['tg128_tok_s']} |")
    log(f"decode roofline fraction {ar['roofline_fraction']} (bytes/token {bpt / 1e9:.3f} GB at {H200_BW / 1e12} TB/s)")
    (OUT / "check_ar.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    try:
        main()
    finally:
        (OUT / "check_ar.json").write_text(json.dumps(results, indent=2, default=str))
