"""Training of the DFlash draft with the block-diffusion objective (speculative.md §1, "Training").

Data: the target's own greedy continuations of corpus prefixes. Acceptance is measured against the target's
argmax, so the labels must be the target's argmax given a context the target itself produced; a greedy
continuation is exactly that (every continuation token is the argmax after the tokens before it), whereas
argmax labels over corpus text would condition on text the target would not have written. The target runs in
float32 with its bf16-rounded weights, as the reference loop runs it.

Objective: in each sequence, anchors are drawn in the continuation; an anchor `a` makes a block
`[token_a, MASK x (B-1)]` at positions `a .. a+B-1` that sees the context features of positions `< a` and
its own block (bidirectionally), never another block. Block position k predicts the token at `a + k`
through the target's (frozen) LM head; the cross-entropy is weighted by `exp(-(k-1)/gamma)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lucebench.models.dflash_reference import FeatureTarget
from lucebench.models.dflash_torch import DFlashConfig, DFlashDraft
from lucebench.models.train.lm import _lr_at, make_optimizer


@dataclass(frozen=True)
class DraftRecipe:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    n_target_layers: int  # how many target layers feed the draft
    block_size: int
    n_sequences: int  # greedy continuations generated for training
    prefix_len: int
    gen_len: int
    gen_batch: int
    anchors: int  # blocks per sequence per step
    batch: int
    steps: int
    lr: float
    max_seconds: float
    gamma: float = 7.0
    warmup_frac: float = 0.04


@torch.no_grad()
def greedy_continuations(target_model, stream: np.ndarray, *, n: int, prefix_len: int, gen_len: int,
                         batch: int, seed: int, device: str) -> torch.Tensor:
    """[n, prefix_len + gen_len] token ids: corpus prefixes at seeded positions and the target's greedy
    continuation of each (batched, with the model's cache)."""
    from transformers import DynamicCache

    gen = np.random.default_rng(seed)
    starts = gen.integers(0, len(stream) - prefix_len, size=n)
    prefixes = torch.from_numpy(np.stack([stream[s:s + prefix_len] for s in starts]).astype(np.int64))
    out = []
    target_model.eval()
    for i in range(0, n, batch):
        x = prefixes[i:i + batch].to(device)
        cache = DynamicCache(config=target_model.config)
        logits = target_model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        toks = [logits[:, -1].argmax(-1)]
        for _ in range(gen_len - 1):
            logits = target_model(input_ids=toks[-1][:, None], past_key_values=cache, use_cache=True).logits
            toks.append(logits[:, -1].argmax(-1))
        out.append(torch.cat([x, torch.stack(toks, dim=1)], dim=1).cpu())
    return torch.cat(out)


def block_batch(seqs: torch.Tensor, *, prefix_len: int, block_size: int, anchors: int, mask_id: int,
                gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Anchors, block inputs, positions, labels and the attention mask for a batch of sequences [B, T]."""
    b, t = seqs.shape
    dev = seqs.device
    lo, hi = prefix_len, t - block_size  # anchors in the continuation, whole block inside the sequence
    n_cand = hi - lo + 1
    k = min(anchors, n_cand)
    scores = torch.rand(b, n_cand, generator=gen, device="cpu").to(dev)
    anchor = scores.topk(k, dim=1).indices.sort(dim=1).values + lo  # [B, k]
    offs = torch.arange(block_size, device=dev)
    pos = anchor[:, :, None] + offs  # [B, k, bs]
    labels = torch.gather(seqs, 1, pos.reshape(b, -1)).view(b, k, block_size)
    inputs = torch.full_like(labels, mask_id)
    inputs[:, :, 0] = labels[:, :, 0]
    # Mask [B, 1, k*bs, T + k*bs]: context keys before the anchor, and the own block.
    ctx_ok = torch.arange(t, device=dev)[None, None, :] < anchor[:, :, None]  # [B, k, T]
    ctx_ok = ctx_ok[:, :, None, :].expand(b, k, block_size, t).reshape(b, k * block_size, t)
    blk = torch.arange(k, device=dev).repeat_interleave(block_size)
    own = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_ok, own], dim=2)[:, None]
    return {"inputs": inputs.view(b, -1), "pos": pos.view(b, -1), "labels": labels, "mask": mask}


def draft_loss(target: FeatureTarget, draft: DFlashDraft, seqs: torch.Tensor, bb: dict[str, torch.Tensor],
               gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted block-diffusion loss and per-position hits [bs-1] (argmax == label counts)."""
    bs = draft.config.block_size
    with torch.no_grad(), torch.autocast(seqs.device.type, enabled=False):
        # The target runs in float32 here as in the reference loop; only the draft uses autocast.
        target.forward_batch(seqs)
        feats = target.features()
        emb = target.embed(bb["inputs"])
    b, t = seqs.shape
    ctx_pos = torch.arange(t, device=seqs.device).expand(b, t)
    ctx = draft.context_features(feats)
    h = draft(emb, bb["pos"], ctx, ctx_pos, mask=bb["mask"])
    h = h.view(b, -1, bs, h.shape[-1])[:, :, 1:]  # position 0 (the given token) predicts nothing
    logits = target.lm_head(h).float()  # [B, k, bs-1, V]
    labels = bb["labels"][:, :, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(labels.shape)
    w = torch.exp(-(torch.arange(bs - 1, device=ce.device, dtype=torch.float32)) / gamma)
    loss = (ce * w).sum(-1).mean() / w.sum()
    hits = (logits.argmax(-1) == labels).float().sum(dim=(0, 1))
    return loss, hits


def make_draft(recipe: DraftRecipe, target_config, mask_id: int) -> DFlashDraft:
    from lucebench.models.dflash_draft import default_target_layer_ids

    n_layers = target_config.num_hidden_layers
    cfg = DFlashConfig(
        hidden_size=target_config.hidden_size, num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim, intermediate_size=recipe.intermediate,
        vocab_size=target_config.vocab_size, num_target_layers=n_layers,
        target_layer_ids=default_target_layer_ids(n_layers, recipe.n_target_layers), mask_token_id=mask_id,
        block_size=recipe.block_size, rms_norm_eps=1e-6, rope_theta=1e6,
        max_position_embeddings=target_config.max_position_embeddings)
    return DFlashDraft(cfg)


def train_draft(target: FeatureTarget, draft: DFlashDraft, seqs: torch.Tensor, recipe: DraftRecipe, *, device: str,
                seed: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    draft.to(device).train()
    for p in target.model.parameters():
        p.requires_grad_(False)
    opt = make_optimizer(draft, recipe.lr, device)
    gen = torch.Generator().manual_seed(seed)
    warmup = max(1, int(recipe.warmup_frac * recipe.steps))
    use_amp = device.startswith("cuda")
    curve = []
    t0 = time.perf_counter()
    stopped = False
    step = 0
    for step in range(recipe.steps):
        idx = torch.randint(0, len(seqs), (recipe.batch,), generator=gen)
        batch = seqs[idx].to(device)
        bb = block_batch(batch, prefix_len=recipe.prefix_len, block_size=recipe.block_size, anchors=recipe.anchors,
                         mask_id=draft.config.mask_token_id, gen=gen)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, recipe.steps, warmup, recipe.lr)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            loss, hits = draft_loss(target, draft, batch, bb, recipe.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == recipe.steps - 1:
            n = recipe.batch * bb["labels"].shape[1]
            acc1 = float(hits[0]) / n
            curve.append([step, round(float(loss.detach()), 4), round(acc1, 4), round(time.perf_counter() - t0, 1)])
            log(f"  step {step:5d}/{recipe.steps}  loss {float(loss.detach()):.3f}  acc@1 {acc1:.3f}")
        if time.perf_counter() - t0 > recipe.max_seconds:
            stopped = True
            log(f"  time guard {recipe.max_seconds:.0f} s reached at step {step}")
            break
    return {"steps": step + 1, "steps_planned": recipe.steps, "stopped_by_guard": stopped,
            "seconds": round(time.perf_counter() - t0, 1), "loss_curve": curve}


@torch.no_grad()
def evaluate_draft(target: FeatureTarget, draft: DFlashDraft, seqs: torch.Tensor, recipe: DraftRecipe, *,
                   device: str, seed: int) -> dict[str, Any]:
    """Accuracy per block position (draft argmax == the target's greedy token) on held-out continuations,
    contexts teacher-forced as in training, and the i.i.d. chain AL those rates imply."""
    draft.to(device).eval()
    gen = torch.Generator().manual_seed(seed)
    bs = recipe.block_size
    hits = torch.zeros(bs - 1)
    total = 0
    chain = torch.zeros(bs - 1)  # blocks whose first d positions are all right
    n_blocks = 0
    for i in range(0, len(seqs), recipe.batch):
        batch = seqs[i:i + recipe.batch].to(device)
        bb = block_batch(batch, prefix_len=recipe.prefix_len, block_size=bs, anchors=recipe.anchors,
                         mask_id=draft.config.mask_token_id, gen=gen)
        b, t = batch.shape
        target.forward_batch(batch)
        ctx = draft.context_features(target.features())
        h = draft(target.embed(bb["inputs"]), bb["pos"], ctx, torch.arange(t, device=device).expand(b, t),
                  mask=bb["mask"])
        h = h.view(b, -1, bs, h.shape[-1])[:, :, 1:]
        ok = (target.lm_head(h).argmax(-1) == bb["labels"][:, :, 1:]).float().cpu()  # [B, k, bs-1]
        hits += ok.sum(dim=(0, 1))
        total += ok.shape[0] * ok.shape[1]
        chain += ok.cumprod(-1).sum(dim=(0, 1))
        n_blocks += ok.shape[0] * ok.shape[1]
    acc = (hits / total).tolist()
    prefix_ok = (chain / n_blocks).tolist()
    return {"blocks": n_blocks, "accuracy_per_position": [round(a, 4) for a in acc],
            "teacher_forced_chain_al": round(1 + sum(prefix_ok), 4),
            "note": "position k = 1 .. block_size-1; chain AL = 1 + sum_k P(positions 1..k all right)"}

