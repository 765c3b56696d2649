#!/usr/bin/env python3
"""How peaked are a synthetic checkpoint's logits? transformers fp32 against bf16 on the same weights.

    python scripts/check_synth_logits.py DIR [DIR ...] [--n-gen 64] [--threads N] [--json OUT]

For each checkpoint folder (``lucebench models synth`` output, or any Qwen3.5 / Qwen3 HF text checkpoint) this
loads the model with transformers in float32 and in bfloat16, greedy-decodes ``--n-gen`` tokens from each of
four fixed prompts (manual loop, cache passed back, argmax), and prints per folder:

- ``agree``: positions where the bf16 greedy tokens equal the fp32 ones, over all prompts, and the first
  position where each prompt's two runs diverge (``-`` = never);
- ``tf_agree``: the bf16 model teacher-forced on the fp32 tokens: how often its argmax is the fp32 token
  (a per-step measure that one early divergence cannot cascade);
- ``gap``: median over all fp32 steps of top-1 minus top-2 logit; ``gap/sd`` the same divided by that step's
  logit standard deviation (scale free); ``gap_err``: median |fp32 gap - bf16 gap| at the fp32 top-1/top-2
  ids (teacher-forced), i.e. how far bf16 rounding moves that gap;
- ``distinct``, ``self`` and ``no-layer``: distinct tokens in each fp32 output, how often a step predicts its
  own input token (a degenerate model repeats one token), and how often embedding -> final norm -> LM head
  alone, skipping every layer, predicts the step's token (a model whose layers do not matter hides bugs).

CPU is enough (a 0.8B-class model takes a few minutes); ``--device cuda`` runs it on a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

# Fixed prompts, tokenised with each checkpoint's own tokenizer.json (the synthetic BPE).
PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 6 * 7); return 0; }",
)


def load(folder: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval()


def prompt_ids(folder: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], n_gen: int, device: str) -> tuple[list[int], list[torch.Tensor]]:
    """n_gen greedy tokens and the float32 logits each was chosen from (on the CPU)."""
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True, logits_to_keep=1)
    logits = [out.logits[0, -1].float().cpu()]
    tokens = [int(torch.argmax(logits[-1]))]
    cache = out.past_key_values
    for _ in range(n_gen - 1):
        out = model(input_ids=torch.tensor([[tokens[-1]]], device=device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits[0, -1].float().cpu())
        tokens.append(int(torch.argmax(logits[-1])))
    return tokens, logits


@torch.no_grad()
def forced(model: torch.nn.Module, prompt: list[int], tokens: list[int], device: str) -> torch.Tensor:
    """Logits [len(tokens), vocab] of ``model`` predicting each of ``tokens`` given the ones before it."""
    ids = torch.tensor([prompt + tokens[:-1]], device=device)
    out = model(input_ids=ids, use_cache=False, logits_to_keep=len(tokens))
    return out.logits[0].float().cpu()


@torch.no_grad()
def skip_layers(model: torch.nn.Module, inputs: list[int], device: str) -> list[int]:
    """What each input token predicts through embedding, final norm and LM head alone (no layer)."""
    x = model.get_input_embeddings()(torch.tensor(inputs, device=device))
    return torch.argmax(model.get_output_embeddings()(model.model.norm(x)), dim=-1).tolist()


def measure(folder: Path, n_gen: int, device: str) -> dict:
    prompts = prompt_ids(folder)
    t0 = time.perf_counter()
    m32 = load(folder, torch.float32, device)
    runs32 = [greedy(m32, p, n_gen, device) for p in prompts]
    skipped = [skip_layers(m32, [p[-1]] + toks[:-1], device) for p, (toks, _) in zip(prompts, runs32)]
    del m32
    m16 = load(folder, torch.bfloat16, device)
    runs16 = [greedy(m16, p, n_gen, device)[0] for p in prompts]
    forced16 = [forced(m16, p, toks, device) for p, (toks, _) in zip(prompts, runs32)]
    del m16

    agree = 0
    firsts: list[int | None] = []
    tf_agree = 0
    gaps: list[float] = []
    gaps_sd: list[float] = []
    gap_errs: list[float] = []
    distinct: list[int] = []
    self_pred = no_layer = 0
    for p, (toks32, logits32), toks16, f16, skip in zip(prompts, runs32, runs16, forced16, skipped):
        no_layer += sum(a == b for a, b in zip(skip, toks32))
        same = [a == b for a, b in zip(toks32, toks16)]
        agree += sum(same)
        firsts.append(same.index(False) if False in same else None)
        distinct.append(len(set(toks32)))
        inputs = [p[-1]] + toks32[:-1]
        self_pred += sum(a == b for a, b in zip(inputs, toks32))
        for step, l32 in enumerate(logits32):
            top = torch.topk(l32, 2)
            i1, i2 = int(top.indices[0]), int(top.indices[1])
            gap = float(top.values[0] - top.values[1])
            gaps.append(gap)
            gaps_sd.append(gap / float(l32.std()))
            l16 = f16[step]
            tf_agree += int(torch.argmax(l16)) == toks32[step]
            gap_errs.append(abs(gap - float(l16[i1] - l16[i2])))
    n = len(prompts) * n_gen
    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    prov_file = folder / "lucebench_synth.json"
    rule = json.loads(prov_file.read_text()).get("scale_rule") if prov_file.is_file() else None
    return {
        "model": str(folder),
        "scale_rule": rule,
        "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"], "vocab": cfg["vocab_size"],
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "n_prompts": len(prompts), "n_gen": n_gen,
        "agree": agree, "agree_pct": 100.0 * agree / n,
        "first_divergence": firsts,
        "tf_agree_pct": 100.0 * tf_agree / n,
        "gap_median": statistics.median(gaps),
        "gap_over_sd_median": statistics.median(gaps_sd),
        "gap_err_median": statistics.median(gap_errs),
        "distinct": distinct,
        "self_pred_pct": 100.0 * self_pred / n,
        "no_layer_pct": 100.0 * no_layer / n,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def line(r: dict) -> str:
    firsts = ",".join("-" if f is None else str(f) for f in r["first_divergence"])
    return (f"{r['model']}: L{r['layers']} h{r['hidden']} V{r['vocab']} {'tied' if r['tied'] else 'untied'} | "
            f"agree {r['agree']}/{r['n_prompts'] * r['n_gen']} ({r['agree_pct']:.1f}%) first-div [{firsts}] | "
            f"tf_agree {r['tf_agree_pct']:.1f}% | gap {r['gap_median']:.3g} gap/sd {r['gap_over_sd_median']:.3g} "
            f"gap_err {r['gap_err_median']:.3g} | distinct {r['distinct']} self {r['self_pred_pct']:.0f}% "
            f"no-layer {r['no_layer_pct']:.0f}% | "
            f"{r['seconds']}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path, help="checkpoint folders")
    ap.add_argument("--n-gen", type=int, default=64, help="greedy tokens per prompt (default 64)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, help="also write the results here as JSON")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for folder in args.models:
        r = measure(folder, args.n_gen, args.device)
        print(line(r), flush=True)
        if r["scale_rule"]:
            print(f"    scale rule: {r['scale_rule']}", flush=True)
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
