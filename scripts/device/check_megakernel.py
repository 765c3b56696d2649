"""GPU check of the `megakernel` engine (run on the device machine from the repository root, PYTHONPATH=.).

Two phases, so that the CPU-heavy build can overlap the GPU-side reference (see check_megakernel.sh):
  synth         synthesises a Qwen3.5-0.8B-shaped random checkpoint (BF16, re-scaled init; SYNTHETIC
                weights), runs transformers' greedy references (fp32 on the bf16-rounded weights, and bf16)
                for 8 prompts x 128 tokens, measures the device copy bandwidth; writes /tmp/mk_refs.json
  run BUILD     correctness of lucebench-megakernel against those references and against lucebench-ar,
                determinism (same tokens twice, and from the run-time build), then tg128 / pp520 timings
                with repetitions after warm-up (median, min, max) for the megakernel variants and ar
                (MK_VARIANTS / AR_VARIANTS: JSON {name: {env}}), plus whether each variant's tokens on a
                520-token prompt equal the default's. MK_CHECK (JSON list of MK_VARIANTS names): those
                variants (their EXE too) also get the full correctness check (8 prompts x 128 tokens,
                teacher-forced).
                A variant whose env sets LB_MK_TRACE=FILE gets its per-stage trace summarised.
Prints a short table; writes $OUT/check_megakernel.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from engine_client import Engine
from mk_trace import layer_types, trace_summary

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engines"))

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
CKPT = Path("/tmp/qwen35-0.8b-synth")
REFS = Path("/tmp/mk_refs.json")
HF_LOGITS = Path("/tmp/mk_hf_logits.pt")
SHAPE = dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
             num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
             linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
             tie_word_embeddings=True, max_position_embeddings=8192,
             rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
PROMPT_LENS = (1, 5, 17, 64, 100, 130, 257, 400)
N_GEN = 128


def log(msg: str) -> None:
    print(msg, flush=True)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 248320, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
    cache, toks = out.past_key_values, [int(out.logits[0, -1].argmax())]
    for _ in range(n - 1):
        out = model(input_ids=torch.tensor([[toks[-1]]], device="cuda"), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        toks.append(int(out.logits[0, -1].argmax()))
    return toks


def copy_bandwidth() -> dict:
    """Device-to-device copy of 2 GiB: bytes read + written over the median time of 20 copies
    (lucebench.measure.bandwidth, the harness's own roofline measurement)."""
    from lucebench.measure.bandwidth import measure_copy_bandwidth

    bw = measure_copy_bandwidth(0, size_bytes=2 << 30, repeats=20)
    if bw is None:
        raise RuntimeError("no CUDA device for the copy-bandwidth measurement")
    return {"bytes": 2 * (2 << 30), "read_plus_write_B_per_s": bw}


def phase_synth() -> None:
    import qwen35_synth as synth

    res: dict = {"gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    res["copy_bandwidth"] = copy_bandwidth()
    log(f"copy bandwidth {res['copy_bandwidth']['read_plus_write_B_per_s'] / 1e12:.3f} TB/s (read+write)")
    t = time.time()
    model = synth.make_model(seed=0, **SHAPE)  # final-norm gain of mixed sign: no input-token repetition
    synth.save(model, CKPT, torch.bfloat16)
    log(f"synthesised checkpoint in {time.time() - t:.0f} s")
    # transformers on the bf16-rounded weights: fp32 compute (reference) and bf16 compute (the HF baseline)
    model = model.to(torch.bfloat16).to(torch.float32).to("cuda").eval()
    t = time.time()
    res["hf_fp32"] = [hf_greedy(model, p, N_GEN) for p in prompts()]
    log(f"hf fp32 references in {time.time() - t:.0f} s")
    # last-position prefill logits of every prompt, for the prefill error of the engines (AR_LOGIT_VARIANTS)
    with torch.no_grad():
        torch.save([model(input_ids=torch.tensor([p], device="cuda")).logits[0, -1].float().cpu() for p in prompts()],
                   HF_LOGITS)
    model = model.to(torch.bfloat16)
    t = time.time()
    res["hf_bf16"] = [hf_greedy(model, p, N_GEN) for p in prompts()]
    log(f"hf bf16 references in {time.time() - t:.0f} s")
    REFS.write_text(json.dumps(res))


@torch.no_grad()
def teacher_forced(runs: dict[str, list[list[int]]], ps: list[list[int]]) -> dict[str, dict]:
    """For each named run (its greedy outputs for the prompts ps; transformers fp32 is loaded once for all):
    per-step agreement with transformers fp32 ALONG THE RUN'S OWN TRAJECTORY: transformers
    reads prompt + the run's tokens in one forward and predicts every step; a step agrees when its argmax
    is the run's token. Free-running agreement on random weights mostly measures where the first near-tie
    falls (transformers bf16 itself leaves fp32 within a few tokens); this measures each step. Also: the
    transformers top-1 - top-2 logit gap at disagreeing steps (near-ties mean rounding, not a bug), and how
    often the run repeats its input token (a degenerate model would make agreement meaningless)."""
    from transformers import Qwen3_5ForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = Qwen3_5ForCausalLM.from_pretrained(CKPT, dtype=torch.float32).to(dev).eval()
    res: dict[str, dict] = {}
    for name, outs in runs.items():
        steps = agree_n = repeats = 0
        gaps: list[float] = []
        for prompt, out in zip(ps, outs):
            seq = torch.tensor([prompt + out[:-1]], device=dev)
            logits = model(input_ids=seq).logits[0, len(prompt) - 1:].float()
            top = logits.topk(2, dim=-1)
            pred = top.indices[:, 0].tolist()
            for i, tok in enumerate(out):
                steps += 1
                agree_n += pred[i] == tok
                if pred[i] != tok:
                    gaps.append(float(top.values[i, 0] - top.values[i, 1]) / float(logits[i].std()))
                prev = prompt[-1] if i == 0 else out[i - 1]
                repeats += tok == prev
        res[name] = {"steps": steps, "agree": agree_n / steps, "repeat_input_token": repeats / steps,
                     "mismatch_gap_over_logit_sd_max": round(max(gaps), 4) if gaps else None}
    del model
    torch.cuda.empty_cache()
    return res


def greedy(exe: Path, ps: list[list[int]], env: dict | None = None, repeat: bool = False):
    """One engine process: N_GEN greedy tokens for each prompt (twice with repeat: (first, second))."""
    eng = Engine(exe, CKPT, "--max-ctx", "1024", env=env)
    try:
        out = [eng.gen(p, N_GEN)["output_ids"] for p in ps]
        return (out, [eng.gen(p, N_GEN)["output_ids"] for p in ps]) if repeat else out
    finally:
        eng.close()


def eos_stop(exe: Path, ps: list[list[int]], ref: list[list[int]]) -> dict:
    """A generation that may stop at EOS, eos_ids = [the token at step 40 of the first prompt's greedy
    output `ref[0]`]: the reply must be ref[0] up to that token's first occurrence, with stop "eos", and the
    next request in the same process (the second prompt) must still give ref[1] (engines that queue steps
    past a stop must leave nothing behind)."""
    eos = ref[0][40]
    cut = ref[0].index(eos) + 1
    eng = Engine(exe, CKPT, "--max-ctx", "1024")
    try:
        r = eng.gen(ps[0], N_GEN, eos_ids=[eos], ignore_eos=False)
        r2 = eng.gen(ps[1], N_GEN)
    finally:
        eng.close()
    return {"eos_id": eos, "expected_tokens": cut, "tokens": len(r["output_ids"]), "stop": r.get("stop"),
            "ok": r["output_ids"] == ref[0][:cut] and r.get("stop") == "eos",
            "next_request_same": r2["output_ids"] == ref[1]}


def agree(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for u, v in zip(a, b) for x, y in zip(u, v)) / sum(len(u) for u in a)


def first_mismatch(a: list[list[int]], b: list[list[int]]) -> list[int]:
    out = []
    for u, v in zip(a, b):
        k = 0
        while k < len(u) and k < len(v) and u[k] == v[k]:
            k += 1
        out.append(k)
    return out


def stats(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 1), "min": round(min(xs), 1), "max": round(max(xs), 1), "n": len(xs)}


def timing(exe: Path, env: dict | None, reps: int, ctx_prompt: list[int], p520: list[int]) -> dict:
    eng = Engine(exe, CKPT, "--max-ctx", "4096", env=env)
    r: dict = {"ready_options": eng.ready["engine"].get("options", {})}
    # tg128: 1-token prompt, 128 decode steps (n_gen 129), as suites/tg128.yaml
    for _ in range(2):
        eng.gen([ctx_prompt[0]], N_GEN + 1)
    tg = [eng.gen([ctx_prompt[0]], N_GEN + 1) for _ in range(reps)]
    r["tg128_tok_s"] = stats([N_GEN / (x["timing"]["decode_ms"] / 1e3) for x in tg])
    r["tg128_ms_per_token"] = round(statistics.median(x["timing"]["decode_ms"] for x in tg) / N_GEN, 4)
    r["bytes_per_token"] = tg[0].get("bytes_per_token")
    # decode at a longer context: 520-token prompt + 128 steps
    tl = [eng.gen(p520, N_GEN + 1) for _ in range(max(2, reps // 2))]
    r["tg128_at_ctx520_tok_s"] = stats([N_GEN / (x["timing"]["decode_ms"] / 1e3) for x in tl])
    r["bytes_per_token_ctx520"] = tl[0].get("bytes_per_token")
    r["ctx520_output_ids"] = tl[0]["output_ids"]  # compared across variants (prefill + decode paths)
    # pp520: 520-token prompt, 1 token
    for _ in range(3):
        eng.gen(p520, 1)
    pre = [eng.gen(p520, 1)["timing"]["prefill_ms"] for _ in range(reps)]
    r["pp520_tok_s"] = stats([520 / (ms / 1e3) for ms in pre])
    eng.close()
    # MK_LONG_CTX=N: decode 64 steps after an N-token prompt (long-context attention), output ids kept
    if long_ctx := int(os.environ.get("MK_LONG_CTX", "0")):
        eng = Engine(exe, CKPT, "--max-ctx", str(long_ctx + 128), env=env)
        prompt = torch.randint(0, 248320, (long_ctx,), generator=torch.Generator().manual_seed(3)).tolist()
        runs = [eng.gen(prompt, 65) for _ in range(3)]  # the first is a warm-up
        r[f"tg64_at_ctx{long_ctx}_tok_s"] = stats([64 / (x["timing"]["decode_ms"] / 1e3) for x in runs[1:]])
        r[f"prefill_ctx{long_ctx}_ms"] = stats([x["timing"]["prefill_ms"] for x in runs[1:]])
        r[f"ctx{long_ctx}_output_ids"] = runs[1]["output_ids"]
        eng.close()
    return r


def phase_run(build: Path) -> None:
    refs = json.loads(REFS.read_text())
    res: dict = {"gpu": refs["gpu"], "date": refs["date"], "copy_bandwidth": refs["copy_bandwidth"],
                 "weights": "SYNTHETIC (random re-scaled Qwen3.5-0.8B shape, bf16)"}
    mk = build / "lucebench-megakernel"
    ar = next((x for x in (build / "lucebench-ar", build / "engines" / "lucebench-ar") if x.exists()), build / "lucebench-ar")
    ps = prompts()
    try:
        # ---- correctness
        eng = Engine(mk, CKPT, "--max-ctx", "1024")
        res["ready"] = eng.ready
        log(json.dumps(eng.ready))
        t = time.time()
        mk_out = [eng.gen(p, N_GEN)["output_ids"] for p in ps]
        log(f"megakernel 8 x {N_GEN} in {time.time() - t:.1f} s")
        mk_again = [eng.gen(p, N_GEN)["output_ids"] for p in ps]
        eng.close()
        mk_generic = greedy(mk, ps[:3], {"LB_MK_GENERIC": "1"})  # the v1 run-time build: same tokens expected
        ar_out = None
        if ar.exists():
            try:  # the ar engine is compared when it loads; its failure must not stop this check
                ar_out = greedy(ar, ps)
                res["eos_stop"] = {"ar": eos_stop(ar, ps, ar_out), "megakernel": eos_stop(mk, ps, mk_out)}
                log(f"EOS stop: {res['eos_stop']}")
            except Exception as e:  # noqa: BLE001
                log(f"ar engine unavailable: {e}")
                res["ar_error"] = str(e)
        # AR_LOGIT_VARIANTS (JSON {name: {env}}; the key "ARGS" adds engine arguments, e.g. "--kv-k f32"):
        # relative error of ar's last prefill logits against transformers fp32, per prompt (PROMPT_LENS)
        if ar.exists() and os.environ.get("AR_LOGIT_VARIANTS"):
            hf_logits = torch.load(HF_LOGITS)
            res["prefill_logits_rel_err_vs_hf_fp32"] = {"prompt_lens": [len(p) for p in ps]}
            for name, env in json.loads(os.environ["AR_LOGIT_VARIANTS"]).items():
                args = env.pop("ARGS", "").split()
                eng = Engine(ar, CKPT, "--max-ctx", "1024", *args, env=env or None)
                try:
                    errs = []
                    for p, ref in zip(ps, hf_logits):
                        got = torch.tensor(eng.gen(p, 1, return_logits=True)["last_logits"])
                        errs.append(round(float((got - ref).norm() / ref.norm()), 7))
                finally:
                    eng.close()
                res["prefill_logits_rel_err_vs_hf_fp32"][name] = errs
                log(f"prefill logits rel. error vs transformers fp32, {name}: {errs}")
        c = {
            "n_prompts": len(ps), "n_gen": N_GEN,
            "agree_vs_hf_fp32": agree(mk_out, refs["hf_fp32"]),
            "agree_vs_hf_bf16": agree(mk_out, refs["hf_bf16"]),
            "agree_hf_bf16_vs_hf_fp32": agree(refs["hf_bf16"], refs["hf_fp32"]),
            "first_mismatch_vs_hf_fp32": first_mismatch(mk_out, refs["hf_fp32"]),
            "deterministic_repeat": mk_out == mk_again,
            "runtime_build_same_tokens": mk_out[:3] == mk_generic,
        }
        if ar_out is not None:
            c["agree_vs_ar"] = agree(mk_out, ar_out)
            c["ar_agree_vs_hf_fp32"] = agree(ar_out, refs["hf_fp32"])
            c["first_mismatch_vs_ar"] = first_mismatch(mk_out, ar_out)
        runs = {"megakernel": mk_out, "hf_bf16": refs["hf_bf16"]}
        if ar_out is not None:
            runs["ar"] = ar_out
        variants_env = json.loads(os.environ.get("MK_VARIANTS", "{}"))
        for name in json.loads(os.environ.get("MK_CHECK", "[]")):  # full correctness for chosen variants
            try:  # a failing variant is recorded, the others still run
                env = dict(variants_env[name])
                v_out, v_again = greedy(Path(env.pop("EXE", str(mk))), ps, env, repeat=True)
            except Exception as e:  # noqa: BLE001
                c[f"variant_{name}"] = {"error": str(e)}
                log(f"variant {name} failed: {e}")
                continue
            runs[f"variant_{name}"] = v_out
            c[f"variant_{name}"] = {"agree_vs_hf_fp32": agree(v_out, refs["hf_fp32"]),
                                    "agree_vs_default": agree(v_out, mk_out),
                                    "deterministic_repeat": v_out == v_again}
        tf = teacher_forced(runs, ps)
        for name, v in tf.items():
            if name.startswith("variant_"):
                c[name]["teacher_forced_vs_hf_fp32"] = v
                log(f"{name}: {json.dumps(c[name])}")
        c["teacher_forced_vs_hf_fp32"] = {k: v for k, v in tf.items() if not k.startswith("variant_")}
        res["correctness"] = c
        res["sample_tokens"] = {"megakernel": mk_out[1][:24], "hf_fp32": refs["hf_fp32"][1][:24],
                                "ar": ar_out[1][:24] if ar_out else None}
        log(json.dumps(c, indent=1))

        # ---- timing
        gen = torch.Generator().manual_seed(2)
        p520 = torch.randint(0, 248320, (520,), generator=gen).tolist()
        reps = int(os.environ.get("MK_REPS", "7"))
        res["timing"] = {}
        # variants: name -> environment (knobs, docs/engines.md)
        variants = {"megakernel": {}, "megakernel_generic": {"LB_MK_GENERIC": "1"}}
        if os.environ.get("MK_VARIANTS"):  # JSON {name: {env}}: replaces the list above
            variants = json.loads(os.environ["MK_VARIANTS"])
        for name, env in variants.items():
            t = time.time()
            exe = Path(env.pop("EXE", str(mk)))  # another megakernel binary (a BASE_SRC build), as for AR_VARIANTS
            try:
                res["timing"][name] = timing(exe, env, reps, p520, p520)
            except Exception as e:  # noqa: BLE001
                res["timing"][name] = {"error": str(e)}
                log(f"{name} failed: {e}")
                continue
            if env.get("LB_MK_TRACE") and Path(env["LB_MK_TRACE"]).exists():
                res["timing"][name]["trace_us"] = trace_summary(Path(env["LB_MK_TRACE"]), 1.98, layer_types(CKPT))
            log(f"{name}: {json.dumps(res['timing'][name])} ({time.time() - t:.0f} s)")
        if ar_out is not None:  # AR_VARIANTS: JSON {name: {env}}, default {"ar": {}}; the key "EXE" runs
            # another ar binary (e.g. the previous commit's build, for a same-card before/after)
            for name, env in json.loads(os.environ.get("AR_VARIANTS", '{"ar": {}}')).items():
                exe = Path(env.pop("EXE", str(ar)))
                res["timing"][name] = timing(exe, env or None, reps, p520, p520)
                log(f"{name}: {json.dumps(res['timing'][name])}")
    finally:
        (OUT / "check_megakernel.json").write_text(json.dumps(res, indent=2, default=str))

    bw = res["copy_bandwidth"]["read_plus_write_B_per_s"]
    log(f"\nH200 {res['gpu']}, {res['date']}, SYNTHETIC weights; copy bandwidth {bw / 1e12:.3f} TB/s (read+write)")
    log("| engine | tg128 tok/s median [min, max] | ms/token | bytes/token | % of copy-BW roofline | tg@ctx520 | pp520 tok/s |")
    log("|---|---|---|---|---|---|---|")
    for name, r in res["timing"].items():
        if "error" in r:
            log(f"| {name} | failed: {r['error'][:200]} |")
            continue
        tg = r["tg128_tok_s"]
        bpt = r["bytes_per_token"] or 0
        roof = bw / bpt if bpt else float("nan")
        log(f"| {name} | {tg['median']} [{tg['min']}, {tg['max']}] | {r['tg128_ms_per_token']} | {bpt / 1e9:.4f} GB | "
            f"{100 * tg['median'] / roof:.1f}% | {r['tg128_at_ctx520_tok_s']['median']} | {r['pp520_tok_s']['median']} |")
    ref_ids = res["timing"].get("megakernel", {}).get("ctx520_output_ids")
    if ref_ids:
        same = {k: r.get("ctx520_output_ids") == ref_ids for k, r in res["timing"].items()}
        log(f"520-token prompt + 128 tokens identical to the default megakernel's: {same}")
    if long_ctx := int(os.environ.get("MK_LONG_CTX", "0")):
        key = f"ctx{long_ctx}_output_ids"
        first = {}
        for name, r in res["timing"].items():
            if key in r:
                engine = "ar" if name.startswith("ar") else "megakernel"
                first.setdefault(engine, r[key])
                log(f"{name}: tg64 at ctx {long_ctx} {r[f'tg64_at_ctx{long_ctx}_tok_s']['median']} tok/s, prefill "
                    f"{r[f'prefill_ctx{long_ctx}_ms']['median']} ms, ids identical to the first {engine} variant's: "
                    f"{r[key] == first[engine]}")
    if "ar" in res["timing"]:  # the default ar variant
        best = max((r["tg128_tok_s"]["median"], k) for k, r in res["timing"].items() if k.startswith("megakernel") and "error" not in r)
        log(f"best megakernel ({best[1]}) / ar decode: {best[0] / res['timing']['ar']['tg128_tok_s']['median']:.2f}x")
    log(f"agreement vs HF fp32 {c['agree_vs_hf_fp32']:.4f}, vs HF bf16 {c['agree_vs_hf_bf16']:.4f}, "
        f"vs ar {c.get('agree_vs_ar', float('nan')):.4f}; deterministic {c['deterministic_repeat']}, "
        f"run-time build identical "
        f"{c['runtime_build_same_tokens']}")


if __name__ == "__main__":
    if sys.argv[1] == "synth":
        phase_synth()
    else:
        phase_run(Path(sys.argv[2]))
