"""One command for the three reference models: corpus -> tokenizers -> target -> DFlash draft -> drafter.

Output folder:
  target/    Qwen3_5ForCausalLM (config.json, model.safetensors bf16, generation_config.json, tokenizer.json,
             tokenizer_config.json); its tokenizer reserves `<|mask|>`, the draft's mask token
  draft/     the DFlash draft in the z-lab layout (config.json, model.safetensors bf16); it reads the target's
             embeddings and LM head
  drafter/   Qwen3ForCausalLM with its own tokenizer (different vocabulary size and merges) for PFlash
  train_report.json   recipe, versions, device, timings, corpus hashes and every quality figure
  corpus_manifest.json  the corpus's roots, counts, hashes and the files decontamination removed

Recipes: `reference` (one H100/H200, about 6 minutes) and `tiny` (CPU, seconds; used by the tests).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lucebench.models.train.bpe import (
    CHATML_SPECIALS,
    EOS_TOKEN,
    MASK_TOKEN,
    encode_documents,
    save_tokenizer,
    train_bpe,
)
from lucebench.models.train.draft_train import (
    DraftRecipe,
    evaluate_draft,
    function_body_prefixes,
    greedy_continuations,
    make_draft,
    stream_prefixes,
    train_draft,
)
from lucebench.models.train.lm import LMRecipe, build_model, evaluate_lm, n_params, train_lm
from lucebench.models.train.text_corpus import build_corpus


@dataclass(frozen=True)
class Recipe:
    name: str
    corpus_bytes: int
    tokenizer_bytes: int  # BPE training text (a deterministic subset of the training split)
    heldout_eval_tokens: int
    target: LMRecipe
    draft: DraftRecipe
    drafter: LMRecipe
    seed: int = 1234


RECIPES: dict[str, Recipe] = {
    "reference": Recipe(
        name="reference", corpus_bytes=100_000_000, tokenizer_bytes=10_000_000, heldout_eval_tokens=262_144,
        target=LMRecipe(arch="qwen3_5", vocab_size=8192, hidden=256, layers=8, heads=4, kv_heads=2, head_dim=64,
                        intermediate=640, lin_heads=4, lin_head_dim=64, seq_len=512, batch=64, steps=700,
                        lr=2e-3, max_seconds=145),
        draft=DraftRecipe(layers=3, heads=4, kv_heads=2, head_dim=64, intermediate=512, n_target_layers=3,
                          block_size=16, n_sequences=65536, prefix_len=128, gen_len=192, gen_batch=8192,
                          anchors=32, batch=64, steps=1800, lr=1e-3, max_seconds=105, gen_max_seconds=110,
                          function_body_share=0.5, n_heldout=512),
        drafter=LMRecipe(arch="qwen3", vocab_size=6144, hidden=192, layers=4, heads=4, kv_heads=2, head_dim=48,
                         intermediate=512, seq_len=2048, batch=8, steps=1000, lr=2e-3, max_seconds=50),
    ),
    "tiny": Recipe(
        name="tiny", corpus_bytes=2_000_000, tokenizer_bytes=600_000, heldout_eval_tokens=4096,
        target=LMRecipe(arch="qwen3_5", vocab_size=1024, hidden=64, layers=4, heads=2, kv_heads=1, head_dim=32,
                        intermediate=128, lin_heads=2, lin_head_dim=32, seq_len=64, batch=4, steps=20,
                        lr=3e-3, max_seconds=60),
        draft=DraftRecipe(layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=128, n_target_layers=1,
                          block_size=8, n_sequences=16, prefix_len=16, gen_len=24, gen_batch=8, anchors=4,
                          batch=4, steps=10, lr=1e-3, max_seconds=60, n_heldout=8),
        drafter=LMRecipe(arch="qwen3", vocab_size=768, hidden=48, layers=2, heads=2, kv_heads=1, head_dim=24,
                         intermediate=96, seq_len=128, batch=2, steps=10, lr=3e-3, max_seconds=60),
    ),
}

TARGET_SPECIALS = CHATML_SPECIALS + [MASK_TOKEN]
DRAFTER_SPECIALS = CHATML_SPECIALS


def _subset(texts: list[str], max_bytes: int, *, parity: int) -> list[str]:
    """Every other document (even or odd index) until max_bytes: the two tokenizers see different text."""
    out, total = [], 0
    for t in texts[parity::2]:
        if total >= max_bytes:
            break
        out.append(t)
        total += len(t)
    return out


def _save_hf(model, out: Path, tok, *, eos_id: int, max_len: int) -> None:
    model.to(torch.bfloat16).save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": None, "eos_token_id": [eos_id], "pad_token_id": eos_id, "do_sample": False}, indent=2) + "\n")
    save_tokenizer(tok, out, model_max_length=max_len)


def train_reference(out: Path, *, recipe: Recipe, datasets_dir: Path, device: str,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs every step; writes the output folder (module docstring) and returns the report."""
    import tokenizers
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    if device.startswith("cuda"):
        # Reproducible float32: no TF32 in matmuls or convolutions (the DeltaNet conv runs through cuDNN).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    report: dict[str, Any] = {
        "recipe": asdict(recipe),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "python": platform.python_version()},
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu",
        "timings_s": {},
    }
    t_all = time.perf_counter()

    def phase(name: str, t0: float) -> None:
        report["timings_s"][name] = round(time.perf_counter() - t0, 1)
        log(f"[{time.perf_counter() - t_all:6.1f} s] {name} done in {report['timings_s'][name]} s")

    # 1. corpus
    t0 = time.perf_counter()
    corpus = build_corpus(datasets_dir, max_bytes=recipe.corpus_bytes)
    (out / "corpus_manifest.json").write_text(json.dumps(corpus.manifest, indent=2) + "\n")
    report["corpus"] = {k: v for k, v in corpus.manifest.items() if k != "decontamination"}
    report["corpus"]["files_excluded_by_decontamination"] = len(corpus.manifest["decontamination"]["files_excluded"])
    train_texts = [d.text for d in corpus.train]
    held_texts = [d.text for d in corpus.heldout]
    phase("corpus", t0)

    # 2. tokenizers and token streams
    t0 = time.perf_counter()
    tok_t = train_bpe(_subset(train_texts, recipe.tokenizer_bytes, parity=0), vocab_size=recipe.target.vocab_size,
                      specials=TARGET_SPECIALS)
    tok_d = train_bpe(_subset(train_texts, recipe.tokenizer_bytes, parity=1), vocab_size=recipe.drafter.vocab_size,
                      specials=DRAFTER_SPECIALS)
    eos_t, eos_d, mask_id = tok_t.token_to_id(EOS_TOKEN), tok_d.token_to_id(EOS_TOKEN), tok_t.token_to_id(MASK_TOKEN)
    stream_t, held_t = encode_documents(tok_t, train_texts, eos_t), encode_documents(tok_t, held_texts, eos_t)
    stream_d, held_d = encode_documents(tok_d, train_texts, eos_d), encode_documents(tok_d, held_texts, eos_d)
    report["tokens"] = {"target_train": int(len(stream_t)), "target_heldout": int(len(held_t)),
                        "drafter_train": int(len(stream_d)), "drafter_heldout": int(len(held_d)),
                        "mask_token_id": mask_id, "eos_token_id_target": eos_t, "eos_token_id_drafter": eos_d}
    phase("tokenizers", t0)

    # 3. target
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    target_cfg = recipe.target.hf_config(eos_id=eos_t, max_position_embeddings=32768)
    target = build_model(target_cfg)
    report["target"] = {"n_params": n_params(target), "config": target_cfg}
    log(f"target: {report['target']['n_params']:,} parameters")
    report["target"]["train"] = train_lm(target, stream_t, recipe.target, device=device, seed=recipe.seed, log=log)
    _save_hf(target, out / "target", tok_t, eos_id=eos_t, max_len=32768)
    del target
    phase("target", t0)

    # 4. the draft, on the bf16 target's greedy continuations (the target reloaded from its files)
    t0 = time.perf_counter()
    from lucebench.models.dflash_draft import default_target_layer_ids
    from lucebench.models.dflash_reference import FeatureTarget, load_target

    tmodel = load_target(out / "target", dtype=torch.float32, device=device)
    report["target"]["heldout"] = evaluate_lm(tmodel, held_t, seq_len=recipe.target.seq_len,
                                              max_tokens=recipe.heldout_eval_tokens, device=device)
    log(f"target held-out: {report['target']['heldout']}")
    dr = recipe.draft
    ft = FeatureTarget(tmodel, default_target_layer_ids(tmodel.config.num_hidden_layers, dr.n_target_layers))
    n_body = int(round(dr.function_body_share * dr.n_sequences))
    body = function_body_prefixes(tok_t, train_texts, n=n_body, prefix_len=dr.prefix_len, eos_id=eos_t,
                                  seed=recipe.seed + 8)
    rand = stream_prefixes(stream_t, n=dr.n_sequences - len(body), prefix_len=dr.prefix_len, seed=recipe.seed + 1)
    # Interleaved in a seeded order, so that a generation stopped by its guard keeps both kinds.
    prefixes = np.concatenate([body, rand])[np.random.default_rng(recipe.seed + 9).permutation(dr.n_sequences)]
    seqs, feats, gen_stopped = greedy_continuations(ft, prefixes, gen_len=dr.gen_len, batch=dr.gen_batch,
                                                    device=device, max_seconds=dr.gen_max_seconds)
    t_gen = time.perf_counter() - t0
    log(f"draft data: {len(seqs):,} continuations ({len(body):,} of function-body prefixes) in {t_gen:.1f} s"
        + (" (stopped by the time guard)" if gen_stopped else ""))
    held = {
        "heldout": stream_prefixes(held_t, n=dr.n_heldout, prefix_len=dr.prefix_len, seed=recipe.seed + 2),
        "heldout_function_bodies": function_body_prefixes(tok_t, held_texts, n=dr.n_heldout,
                                                          prefix_len=dr.prefix_len, eos_id=eos_t,
                                                          seed=recipe.seed + 10),
    }
    held_data = {k: greedy_continuations(ft, v, gen_len=dr.gen_len, batch=dr.gen_batch, device=device)[:2]
                 for k, v in held.items() if len(v)}
    report["timings_s"]["draft_data"] = round(time.perf_counter() - t0, 1)
    torch.manual_seed(recipe.seed + 3)
    draft = make_draft(dr, tmodel.config, mask_id)
    assert draft.config.target_layer_ids == ft.layer_ids
    report["draft"] = {
        "n_params": n_params(draft), "config": draft.config.to_json(),
        "labels": "the target's greedy continuations (float32, bf16 weights) of corpus prefixes",
        "data": {"continuations": len(seqs), "function_body_prefixes": len(body),
                 "stream_prefixes": len(rand), "tokens_per_continuation": dr.prefix_len + dr.gen_len,
                 "stopped_by_guard": gen_stopped, "seconds": round(t_gen, 1),
                 "features": "stored bf16 from the generation forwards (target layers "
                             f"{ft.layer_ids}), {feats.numel() * 2 / 2**30:.1f} GiB on {feats.device.type}"},
    }
    log(f"draft: {report['draft']['n_params']:,} parameters, target layers {draft.config.target_layer_ids}")
    report["draft"]["train"] = train_draft(ft, draft, seqs, feats, dr, device=device, seed=recipe.seed + 4, log=log)
    del feats
    draft.save(out / "draft")
    draft = type(draft).load(out / "draft").to(device)
    for k, (hs, hf) in held_data.items():
        report["draft"][k] = evaluate_draft(ft, draft, hs, hf, dr, device=device, seed=recipe.seed + 5)
        log(f"draft {k}: {report['draft'][k]}")
    del tmodel, ft, draft, seqs, held_data
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    phase("draft", t0)

    # 5. drafter (Qwen3 dense, its own tokenizer)
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed + 6)
    drafter_cfg = recipe.drafter.hf_config(eos_id=eos_d, max_position_embeddings=40960)
    drafter = build_model(drafter_cfg)
    report["drafter"] = {"n_params": n_params(drafter), "config": drafter_cfg,
                         "trained_context_tokens": recipe.drafter.seq_len}
    log(f"drafter: {report['drafter']['n_params']:,} parameters")
    report["drafter"]["train"] = train_lm(drafter, stream_d, recipe.drafter, device=device, seed=recipe.seed + 7, log=log)
    _save_hf(drafter, out / "drafter", tok_d, eos_id=eos_d, max_len=40960)
    del drafter
    dmodel = load_target(out / "drafter", dtype=torch.float32, device=device)
    report["drafter"]["heldout"] = evaluate_lm(dmodel, held_d, seq_len=min(512, recipe.drafter.seq_len),
                                               max_tokens=recipe.heldout_eval_tokens, device=device)
    log(f"drafter held-out: {report['drafter']['heldout']}")
    phase("drafter", t0)

    report["timings_s"]["total"] = round(time.perf_counter() - t_all, 1)
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report

