"""GPU check of the `ar` engine (run on the device machine from the repository root, PYTHONPATH=.).

One call does everything (the device lease is short):
  * builds the CUDA engine in a background thread while transformers computes the reference;
  * synthesises a Qwen3.5-0.8B-shaped random checkpoint (BF16, re-scaled init);
  * reference: transformers fp32 on cuda (weights rounded to bf16), greedy 128 tokens on 8 prompts and the
    prefill logits; cached in $OUT/hf_ref.json, and read back from $CHECK_AR_HF_REF when that file exists
    (the checkpoint is seeded, so the reference is the same on every run);
  * measures the device-to-device copy bandwidth (bytes read + written) as the roofline's ceiling;
  * correctness of ar (f32 KV and bf16 KV) against the reference;
  * pp520 / tg128 for ar variants (knobs, docs/engines.md: LB_GPU_PDL=0; the decode graph's fused stages off)
    and transformers eager bf16;
  * optionally (CHECK_AR_NCU=1) per-kernel device times of a prefill and decode steps under Nsight Compute.
Prints a table last; writes $OUT/check_ar.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from engine_client import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engines"))
import qwen35_synth as synth  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
H200_BW = 4.8e12  # bytes/s, HBM3e datasheet
results: dict = {}
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save_results() -> None:
    (OUT / "check_ar.json").write_text(json.dumps(results, indent=2, default=str))


def build(arch: str) -> Path:
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
    return exe


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    out = model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
    last = out.logits[0, -1].float().cpu()
    cache, toks = out.past_key_values, [int(out.logits[0, -1].argmax())]
    for _ in range(n - 1):
        out = model(input_ids=torch.tensor([[toks[-1]]], device="cuda"), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        toks.append(int(out.logits[0, -1].argmax()))
    return toks, last.tolist()



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


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written over the median time (lucebench's own measure)."""
    from lucebench.measure.bandwidth import measure_copy_bandwidth

    bw = measure_copy_bandwidth(0, size_bytes=2 << 30, repeats=10)
    if bw is None:
        raise RuntimeError("no CUDA device for the copy-bandwidth measurement")
    return bw


def agree(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for u, v in zip(a, b) for x, y in zip(u, v)) / sum(len(u) for u in a)


def prefix(a: list[list[int]], b: list[list[int]]) -> float:
    tot = 0
    for u, v in zip(a, b):
        k = 0
        while k < len(u) and k < len(v) and u[k] == v[k]:
            k += 1
        tot += k
    return tot / len(a)


def rel(a, b) -> float:
    a, b = torch.tensor(a), torch.tensor(b)
    return float((a - b).norm() / b.norm())


def time_variant(exe: Path, ckpt: Path, env: dict, p520: list[int], prompts: list[list[int]] | None) -> dict:
    eng = Engine(exe, ckpt, "--max-ctx", "1024", env=env)
    try:
        for _ in range(3):
            eng.gen(p520, 1)
        pre = [eng.gen(p520, 1)["timing"]["prefill_ms"] for _ in range(10)]
        tg = [eng.gen(p520[:16], 129) for _ in range(3)]
        toks = [eng.gen(p, 128)["output_ids"] for p in prompts] if prompts else None
    finally:
        eng.close()
    dec = sorted(r["timing"]["decode_ms"] for r in tg)
    r = {"pp520_tok_s": round(520 / (sorted(pre)[len(pre) // 2] / 1e3), 1),
         "tg128_tok_s": round(128 / (dec[0] / 1e3), 1), "tg128_tok_s_worst": round(128 / (dec[-1] / 1e3), 1),
         "bytes_per_token": tg[0]["bytes_per_token"]}
    if toks is not None:
        r["tokens"] = toks
    return r


def ncu_breakdown(exe: Path, ckpt: Path, p520: list[int]) -> dict:
    """Per-kernel device time (Nsight Compute, clocks untouched) of one 520-token prefill and 4 decode steps:
    the prefill's kernels and the last decode step's, grouped by kernel (profile_decode.py's light pass)."""
    from profile_decode import BY_KERNEL_COLUMNS, ar_light, by_kernel

    ks = ar_light(exe, p520, ckpt)
    shutil.copy("/tmp/pf_ar_light.csv", OUT / "ncu_log.csv")
    out: dict = {"n_kernels": len(ks)}
    # the decode graph's kernels start at each embed_decode_kernel launch
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("embed_decode")]
    if starts:
        pre, dec = ks[:starts[0]], ks[starts[-1]:]
        out["prefill_us_total"] = round(sum(k["us"] for k in pre), 1)
        out["decode_step_kernels"] = len(dec)
        out["decode_step_us_total"] = round(sum(k["us"] for k in dec), 1)
        out["by_kernel_columns"] = BY_KERNEL_COLUMNS
        out["prefill_by_kernel"] = by_kernel(pre)[:25]
        out["decode_by_kernel"] = by_kernel(dec)[:25]
    return out


def main() -> None:
    arch = sys.argv[1] if len(sys.argv) > 1 else "90"
    box: dict = {}

    def do_build():
        try:
            box["exe"] = build(arch)
        except BaseException as e:  # noqa: BLE001
            box["err"] = e

    th = threading.Thread(target=do_build)
    th.start()
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
    model = model.to(torch.bfloat16).to("cuda").eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 248320, (n,), generator=gen).tolist() for n in (1, 5, 17, 64, 100, 130, 257, 400)]
    p520 = torch.randint(0, 248320, (520,), generator=gen).tolist()

    ref_path = Path(os.environ.get("CHECK_AR_HF_REF", "/nonexistent"))
    ref = torch.load(ref_path) if ref_path.is_file() else None
    if ref is None or ref.get("prompts") != prompts:
        t = time.time()
        ref32 = model.float()  # transformers fp32 on weights rounded to bf16
        outs = [hf_greedy(ref32, p, 128) for p in prompts]
        ref = {"prompts": prompts, "toks": [o[0] for o in outs], "logits": torch.tensor([o[1] for o in outs])}
        model = ref32.to(torch.bfloat16)
        del ref32
        log(f"transformers fp32 reference in {time.time() - t:.0f} s")
    else:
        log("transformers fp32 reference read from " + str(ref_path))
    torch.save(ref, OUT / "hf_ref.pt")
    ref_toks = ref["toks"]

    results["copy_bandwidth_Bps"] = copy_bandwidth()
    bw = results["copy_bandwidth_Bps"]
    log(f"device copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")

    th.join()
    if "err" in box:
        raise box["err"]
    exe = box["exe"]
    log(f"built {exe} in {results['build_seconds']} s")

    # --- correctness: ar (bf16 weights, fp32 activations, f32 KV) vs transformers fp32
    try:
        eng = Engine(exe, ckpt, "--max-ctx", "1024", "--kv-k", "f32", "--kv-v", "f32")
        results["ready"] = eng.ready
        ar_out = [eng.gen(p, 128, return_logits=True) for p in prompts]
        eng.close()
        ar_toks = [r["output_ids"] for r in ar_out]
        results["correctness"] = {
            "prompts": [len(p) for p in prompts], "n_gen": 128,
            "agree_vs_hf_fp32": agree(ar_toks, ref_toks),
            "mean_matching_prefix_vs_hf_fp32": prefix(ar_toks, ref_toks),
            "first_token_agree_vs_hf_fp32": sum(a[0] == b[0] for a, b in zip(ar_toks, ref_toks)) / len(prompts),
            "logits_rel_err_vs_hf_fp32": [round(rel(r["last_logits"], ref["logits"][i].tolist()), 7)
                                          for i, r in enumerate(ar_out)],
        }
    except Exception as e:  # noqa: BLE001
        results["correctness"] = {"error": repr(e), "agree_vs_hf_fp32": -1, "mean_matching_prefix_vs_hf_fp32": -1}
    log(json.dumps(results["correctness"]))
    save_results()

    # --- timing variants (bf16 KV), each also checked for greedy agreement with a bf16 KV cache
    variants = [("fused+pdl", {}), ("fused, no pdl", {"LB_GPU_PDL": "0"}),
                ("unfused decode stages", {"LB_GPU_FUSED_MLP": "0", "LB_GPU_DELTA_OUT": "0", "LB_GPU_FUSED_DELTA": "0",
                                           "LB_GPU_FUSED_ATTN": "0"})]
    extra = os.environ.get("CHECK_AR_VARIANTS")
    if extra:  # e.g. 'name:K=V,K=V;name2:...'
        for item in extra.split(";"):
            name, kv = item.split(":", 1)
            variants.append((name, dict(x.split("=", 1) for x in kv.split(",") if x)))
    results["variants"] = {}
    for name, env in variants:
        try:
            r = time_variant(exe, ckpt, env, p520, prompts)
        except Exception as e:  # noqa: BLE001
            results["variants"][name] = {"error": str(e)}
            log(f"variant {name} failed: {e}")
            continue
        if "tokens" in r:
            r["agree_bf16kv_vs_hf_fp32"] = agree(r.pop("tokens"), ref_toks)
        r["roofline_tok_s"] = round(bw / r["bytes_per_token"], 1)
        r["roofline_fraction"] = round(r["tg128_tok_s"] / r["roofline_tok_s"], 3)
        results["variants"][name] = r
        log(f"{name}: {json.dumps(r)}")
        save_results()

    results["hf_eager_bf16"] = hf_timing(model, 248320)
    log(f"transformers eager bf16: {results['hf_eager_bf16']}")
    save_results()

    if os.environ.get("CHECK_AR_NCU", "0") != "0":
        try:
            results["ncu"] = ncu_breakdown(exe, ckpt, p520)
            n = results["ncu"]
            log(f"ncu: prefill kernels {n.get('prefill_us_total')} us; decode step {n.get('decode_step_kernels')} kernels, "
                f"{n.get('decode_step_us_total')} us of kernel time")
            for label in ("decode", "prefill"):
                log(f"{label} by kernel (name grid, count, us):")
                for row in n.get(f"{label}_by_kernel", [])[:14]:
                    log(f"   {row}")
        except Exception as e:  # noqa: BLE001
            results["ncu"] = {"error": repr(e)}
            log(f"ncu failed: {e!r}")
        save_results()

    hf = results["hf_eager_bf16"]
    c = results["correctness"]
    log(f"\ncorrectness (f32 KV): agree {c['agree_vs_hf_fp32']:.4f}, prefix {c['mean_matching_prefix_vs_hf_fp32']:.1f}, "
        f"bf16 KV agree {results['variants'].get('fused+pdl', {}).get('agree_bf16kv_vs_hf_fp32')}")
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s\n")
    log("| engine | pp520 tok/s | tg128 tok/s | bytes/token | roofline tok/s | fraction | agree (bf16 KV) |\n"
        "|---|---|---|---|---|---|---|")
    for name, r in results["variants"].items():
        if "error" in r:
            log(f"| ar {name} | error | | | | | |")
            continue
        log(f"| ar {name} | {r['pp520_tok_s']} | {r['tg128_tok_s']} | {r['bytes_per_token'] / 1e9:.3f} GB | "
            f"{r['roofline_tok_s']} | {r['roofline_fraction']} | {r.get('agree_bf16kv_vs_hf_fp32')} |")
    log(f"| transformers eager bf16 | {hf['pp520_tok_s']} | {hf['tg128_tok_s']} | | | | |")
    save_results()


if __name__ == "__main__":
    try:
        main()
    finally:
        save_results()
