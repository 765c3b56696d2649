"""Qwen3 dense on the CUDA backend against transformers' Qwen3ForCausalLM (run on the device machine from the
repository root, PYTHONPATH=.:scripts/device).

    python3 scripts/device/check_qwen3_gpu.py BUILD_DIR OUT_JSON

Models: the odd tiny shapes of tests/engines/qwen3_synth.py (TINY_CONFIGS, which
tests/engines/test_qwen3_vs_transformers.py checks on the CPU) and one of head_dim 128, the qwen3-0.6b shape
(synthetic, what `lucebench models synth --shape qwen3-0.6b` writes) and the trained reference drafter
(tests/fixtures/reference-models/drafter). Every checkpoint is saved in bf16, so that transformers (fp32 on
the GPU) and lucebench-ar (bf16 weights, fp32 activations, tensor-core GEMMs that round activations to bf16)
read the same weights. Per prompt: the prefill logits' relative error (L2) against transformers, and the
greedy tokens compared up to the first position where they differ; there the reference's relative top-1 /
top-2 margin must be a near-tie (below NEAR_TIE, the bf16 activation rounding's level), else the check
fails. Prefill runs through the chunked path (LB_GPU_PREFILL_CHUNK=16 for one prompt of 40 tokens), decode
through the captured graph. KV f32 and bf16. Then the chunked prefill of a hybrid Qwen3.5 (the synthetic
Qwen3.5-0.8B and the trained reference target): one pass and two chunkings, each against transformers'
Qwen3_5ForCausalLM in fp32 (chunked_qwen35 says what must hold).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engines"))
import qwen3_synth  # noqa: E402
from engine_client import Engine  # noqa: E402
from transformers import Qwen3ForCausalLM  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of this script (with CHECK_QWEN3_FLAGS)
FLAGS = os.environ.get("CHECK_QWEN3_FLAGS", "").split()  # e.g. "--backend cpu" with a CPU build
N_GEN = 32
NEAR_TIE = 2e-2  # relative top-1 - top-2 margin of the reference logits under which a flip is a near-tie
LOGITS_TOL = 5e-2  # prefill logits' relative error: the GPU GEMMs round activations to bf16 (Qwen3.5-0.8B: 1.2e-2..1.8e-2)
TINY = {
    **qwen3_synth.TINY_CONFIGS,
    "hd128-gqa": dict(vocab_size=2000, hidden_size=256, intermediate_size=384, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128),
}


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor, list[float]]:
    """Greedy tokens, the prompt's last logits, and each chosen token's relative margin (full forward)."""
    out = model(input_ids=torch.tensor([prompt], device=DEV), use_cache=True)
    last = out.logits[0, -1].float().cpu()
    cache, toks = out.past_key_values, [int(out.logits[0, -1].argmax())]
    for _ in range(n - 1):
        out = model(input_ids=torch.tensor([[toks[-1]]], device=DEV), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        toks.append(int(out.logits[0, -1].argmax()))
    logits = model(input_ids=torch.tensor([prompt + toks[:-1]], device=DEV)).logits[0, len(prompt) - 1:].float()
    top = logits.topk(2, dim=-1).values
    margins = ((top[:, 0] - top[:, 1]) / logits.abs().max(dim=-1).values).tolist()
    return toks, last, margins


def compare(res: dict, ref: tuple) -> dict:
    toks, last, margins = ref
    got = res["output_ids"]
    err = float((torch.tensor(res["last_logits"]) - last).norm() / last.norm())
    first = next((i for i, (a, b) in enumerate(zip(got, toks)) if a != b), None)
    ok = err < LOGITS_TOL and (first is None or margins[first] < NEAR_TIE)
    return {"logits_rel_err": err, "first_diff": first, "margin_at_diff": None if first is None else margins[first],
            "tokens_equal": first is None, "ok": ok}


def check_model(exe: Path, ckpt: Path, name: str, prompts: list[list[int]]) -> dict:
    model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(DEV).eval()
    refs = [hf_greedy(model, p, N_GEN) for p in prompts]
    del model
    if DEV == "cuda":
        torch.cuda.empty_cache()
    out: dict = {"prompts": [len(p) for p in prompts], "kv": {}}
    for kv in ("f32", "bf16"):
        rows = []
        eng = Engine(exe, ckpt, "--max-ctx", "512", "--kv-k", kv, "--kv-v", kv, *FLAGS)
        try:
            assert eng.ready["model"]["arch"] == "qwen3", eng.ready["model"]
            for p, ref in zip(prompts, refs):
                rows.append(compare(eng.gen(p, N_GEN, return_logits=True), ref))
        finally:
            eng.close()
        # the chunked prefill: 16-token chunks for the longest prompt
        eng = Engine(exe, ckpt, "--max-ctx", "512", "--kv-k", kv, "--kv-v", kv, *FLAGS,
                     env={"LB_GPU_PREFILL_CHUNK": "16"})
        try:
            r = compare(eng.gen(prompts[-1], N_GEN, return_logits=True), refs[-1])
            r["chunked_prefill"] = 16
            rows.append(r)
        finally:
            eng.close()
        out["kv"][kv] = rows
    out["ok"] = all(r["ok"] for rows in out["kv"].values() for r in rows)
    out["max_logits_rel_err"] = max(r["logits_rel_err"] for rows in out["kv"].values() for r in rows)
    out["tokens_equal"] = sum(r["tokens_equal"] for rows in out["kv"].values() for r in rows)
    out["runs"] = sum(len(rows) for rows in out["kv"].values())
    print(f"{name}: {'ok' if out['ok'] else 'FAIL'}; logits rel err max {out['max_logits_rel_err']:.2e}; "
          f"all {N_GEN} tokens equal in {out['tokens_equal']}/{out['runs']} runs; first diffs "
          f"{[(r['first_diff'], None if r['margin_at_diff'] is None else round(r['margin_at_diff'], 5)) for rows in out['kv'].values() for r in rows if r['first_diff'] is not None]}",
          flush=True)
    return out


CHUNK_ERR_FACTOR = 1.5  # chunked prefill's error against fp32 over the one pass's: chunking adds no error of its own
ERR_FLOOR = 1e-4  # errors below this count as this (the fp32 CPU backend's own bound against transformers)


def chunked_qwen35(exe: Path, ckpt: Path, name: str, need_sensitive: bool) -> dict:
    """The chunked prefill on a hybrid model (DeltaNet and conv state carried from chunk to chunk): a 3,000-token
    prompt in one pass and in chunks of 1,000 and 448 tokens (f32 KV), each against transformers'
    Qwen3_5ForCausalLM in fp32 on the same (bf16-stored) weights. Both paths run the same kernels, which round
    K, V and the attention probabilities to bf16 (flash attention) and the GEMM inputs to bf16, so neither is
    exact; what chunking must not do is add error of its own (a lost or stale state at a chunk boundary, a
    wrong position offset). So, per chunk size:
      - the last logits' relative error against fp32 at most CHUNK_ERR_FACTOR times the one pass's (two
        roundings of one computation land at about the same distance from the exact result; a boundary bug
        moves them by far more: `sensitivity` is the reference's own change when the last 1,000 tokens see
        nothing before them (all state lost at the last boundary of the 1,000-token chunking). With
        need_sensitive it must exceed the bound twice over: random weights barely use distant context (a
        synthetic model's sensitivity is about the size of the rounding), so the synthetic 0.8B checks the
        full-size kernels (flash attention at head_dim 256) and the trained reference target (head_dim 64:
        the per-row attention kernel), which uses its context, the chunk boundaries where a bug would show);
      - the one pass's and the chunked error under LOGITS_TOL, as every model above;
      - the 16 greedy tokens equal to the reference's up to the first position where they differ, and there
        the reference's top-1 / top-2 margin a near-tie (under NEAR_TIE)."""
    from transformers import Qwen3_5ForCausalLM

    # a true fp32 reference: no TF32 in the GEMMs or in the DeltaNet's causal convolution (cuDNN allows it)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rng = random.Random(7)
    model = Qwen3_5ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(DEV).eval()
    prompt = [rng.randrange(model.config.vocab_size) for _ in range(3000)]
    ref = hf_greedy(model, prompt, 16)
    with torch.no_grad():  # the reference on the prompt's last 1,000 tokens alone
        cut = model(input_ids=torch.tensor([prompt[2000:]], device=DEV)).logits[0, -1].float().cpu()
    del model
    if DEV == "cuda":
        torch.cuda.empty_cache()
    outs = {}
    for chunk in ("0", "1000", "448"):
        eng = Engine(exe, ckpt, "--max-ctx", "3100", "--kv-k", "f32", "--kv-v", "f32", *FLAGS,
                     env={"LB_GPU_PREFILL_CHUNK": chunk})
        try:
            outs[chunk] = eng.gen(prompt, 16, return_logits=True)
        finally:
            eng.close()
    last = ref[1]
    rel = lambda a: float((torch.as_tensor(a) - last).norm() / last.norm())  # noqa: E731
    rows = {c: compare(o, ref) for c, o in outs.items()}
    one = max(rows["0"]["logits_rel_err"], ERR_FLOOR)
    r: dict = {"n_prompt": len(prompt), "n_gen": 16, "chunk_err_factor": CHUNK_ERR_FACTOR, "err_floor": ERR_FLOOR,
               "sensitivity_rel_err_last_chunk_alone": rel(cut), "one_pass": rows["0"]}
    for c in ("1000", "448"):
        row = rows[c]
        row["err_over_one_pass"] = max(row["logits_rel_err"], ERR_FLOOR) / one
        row["logits_rel_err_vs_one_pass"] = float((torch.tensor(outs[c]["last_logits"]) -
                                                   torch.tensor(outs["0"]["last_logits"])).norm() /
                                                  torch.tensor(outs["0"]["last_logits"]).norm())
        row["tokens_equal_one_pass"] = outs[c]["output_ids"] == outs["0"]["output_ids"]
        row["ok"] = row["ok"] and row["err_over_one_pass"] <= CHUNK_ERR_FACTOR
        r[f"chunk_{c}"] = row
    # the check must be able to fail: a lost state moves the logits well past the bound
    r["sensitive"] = r["sensitivity_rel_err_last_chunk_alone"] > 2 * CHUNK_ERR_FACTOR * one
    r["ok"] = rows["0"]["ok"] and all(r[f"chunk_{c}"]["ok"] for c in ("1000", "448")) and \
        (r["sensitive"] or not need_sensitive)
    print(f"{name} chunked prefill vs one pass, both against transformers fp32: "
          f"{'ok' if r['ok'] else 'FAIL'}; last-logits rel err one pass {rows['0']['logits_rel_err']:.2e}, "
          + ", ".join(f"chunks of {c} {r[f'chunk_{c}']['logits_rel_err']:.2e} "
                      f"({r[f'chunk_{c}']['err_over_one_pass']:.2f}x, bound {CHUNK_ERR_FACTOR}x)" for c in ("1000", "448"))
          + f"; reference on the last 1,000 tokens alone {r['sensitivity_rel_err_last_chunk_alone']:.2e} "
          f"({'' if r['sensitive'] else 'not '}above twice the bound{', required' if need_sensitive else ''}); first token "
          f"diffs (position, reference margin; near-tie < {NEAR_TIE}): "
          + ", ".join(f"{k} {(v['first_diff'], None if v['margin_at_diff'] is None else round(v['margin_at_diff'], 5))}"
                      for k, v in (("one pass", rows["0"]), ("1000", rows["1000"]), ("448", rows["448"]))),
          flush=True)
    return r


def main() -> int:
    build, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    exe = build / "lucebench-ar"
    tmp = Path("/tmp/lb-qwen3-check")
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict = {"label": "SYNTHETIC (random weights) and TRAINED REFERENCE (the drafter)", "near_tie": NEAR_TIE,
                     "logits_tol": LOGITS_TOL, "n_gen": N_GEN, "models": {}}
    rng = random.Random(5)
    for name, cfg in TINY.items():
        t = time.time()
        model = qwen3_synth.make_model(seed=len(name), **cfg)
        ckpt = tmp / name
        model.to(torch.bfloat16).save_pretrained(ckpt, safe_serialization=True)
        v = model.config.vocab_size
        prompts = [[rng.randrange(v) for _ in range(n)] for n in (1, 9, 40)]
        results["models"][name] = check_model(exe, ckpt, name, prompts)
        results["models"][name]["seconds"] = round(time.time() - t, 1)
    t = time.time()
    q06 = tmp / "qwen3-0.6b"
    if not (q06 / "config.json").exists():  # what `lucebench models synth --shape qwen3-0.6b` writes
        from lucebench.models.shapes import get_shape
        from lucebench.models.synth import synthesize

        synthesize(get_shape("qwen3-0.6b"), q06, seed=0, dtype="bf16")
    prompts = [[1, 500, 20000, 151000, 7], [rng.randrange(151936) for _ in range(40)]]
    results["models"]["qwen3-0.6b (synthetic)"] = check_model(exe, q06, "qwen3-0.6b (synthetic)", prompts)
    results["models"]["qwen3-0.6b (synthetic)"]["seconds"] = round(time.time() - t, 1)
    drafter = Path("tests/fixtures/reference-models/drafter")
    if (drafter / "model.safetensors").exists():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(drafter)
        text = ("The quick brown fox jumps over the lazy dog. In the beginning the river ran north, and the town "
                "grew along its banks; the mill, the bridge and the market came later.")
        prompts = [tok(text)["input_ids"], [rng.randrange(6144) for _ in range(40)]]
        results["models"]["reference drafter (trained)"] = check_model(exe, drafter, "reference drafter (trained)", prompts)
    q35 = Path(os.environ.get("CHECK_QWEN35_CKPT", "/tmp/qwen35-0.8b-synth"))
    if (q35 / "config.json").exists():
        results["chunked_prefill_qwen35"] = chunked_qwen35(exe, q35, "Qwen3.5-0.8B (synthetic)", need_sensitive=False)
    target = Path("tests/fixtures/reference-models/target")
    if (target / "model.safetensors").exists():
        results["chunked_prefill_reference_target"] = chunked_qwen35(exe, target, "reference Qwen3.5 target (trained)",
                                                                     need_sensitive=True)
    results["ok"] = all(m["ok"] for m in results["models"].values()) and \
        all(results[k]["ok"] for k in ("chunked_prefill_qwen35", "chunked_prefill_reference_target") if k in results)
    out_path.write_text(json.dumps(results, indent=1))
    print("qwen3 vs transformers on CUDA:", "ok" if results["ok"] else "FAIL", flush=True)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
