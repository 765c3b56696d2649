"""Training of the DFlash draft with the block-diffusion objective (speculative.md §1, "Training").

Data: the target's own greedy continuations of corpus prefixes. Acceptance is measured against the target's
argmax, so the labels must be the target's argmax given a context the target itself produced; a greedy
continuation is exactly that (every continuation token is the argmax after the tokens before it), whereas
argmax labels over corpus text would condition on text the target would not have written. The target runs in
float32 with its bf16-rounded weights, as the reference loop runs it.

Prefixes are of two kinds: windows at seeded positions of the token stream, and *function-body prefixes*,
the text up to the end of a function's docstring (`def ...:` then a triple-quoted string), which is where a HumanEval
prompt ends; the target's continuation of those is a function body, the text the loop is measured on.

Features: the continuations are generated with the target's cache, and the hooks of `FeatureTarget` keep the
outputs of the draft's target layers at every step, so each position's context features are computed once,
during generation, and stored (bf16) next to the tokens; training then never runs the target. A draft step
costs only the draft, so the draft can see many more sequences in the same time.

Objective: in each sequence, anchors are drawn in the continuation; an anchor `a` makes a block
`[token_a, MASK x (B-1)]` at positions `a .. a+B-1` that sees the context features of positions `< a` and
its own block (bidirectionally), never another block. Block position k predicts the token at `a + k`
through the target's (frozen) LM head; the cross-entropy is weighted by `exp(-(k-1)/gamma)`.
"""

from __future__ import annotations

import math
import re
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
    max_seconds: float  # guard on the training loop
    gen_max_seconds: float = math.inf  # guard on generating the training continuations
    function_body_share: float = 0.5  # share of the prefixes that end after a function's docstring
    n_heldout: int = 512  # held-out continuations of each kind (random windows, function bodies)
    gamma: float = 7.0
    warmup_frac: float = 0.04


# ---------------------------------------------------------------------------------------------------------
# Prefixes

_DOC_OPEN = re.compile(r'^[ \t]+[rRuU]?("""|\'\'\')')
_DEF = re.compile(r"^[ \t]*(async[ \t]+)?def[ \t]")
_OTHER_HEADER = re.compile(r"^[ \t]*(class|if|elif|else|for|while|with|try|except|finally)\b")


def _after_def(lines: list[str], i: int) -> bool:
    """Line i follows a `def` header (which may span a few lines) directly."""
    for k in range(i - 1, max(-1, i - 7), -1):
        if _DEF.match(lines[k]):
            return True
        if _OTHER_HEADER.match(lines[k]):
            return False
    return False


def function_body_starts(text: str) -> list[int]:
    """Character offsets just after the closing line of each function docstring (`def f(...):` on one or a few
    lines, then an indented docstring), when an indented body line follows: where a HumanEval prompt ends."""
    lines = text.splitlines(keepends=True)
    offs = np.cumsum([0] + [len(x) for x in lines]).tolist()
    out = []
    i = 0
    while i < len(lines):
        m = _DOC_OPEN.match(lines[i])
        if not m or i == 0 or not lines[i - 1].rstrip().endswith(":") or not _after_def(lines, i):
            i += 1
            continue
        q = m.group(1)
        rest = lines[i][m.end():]
        j = i if q in rest else next((k for k in range(i + 1, min(len(lines), i + 80)) if q in lines[k]), -1)
        if j < 0:
            i += 1
            continue
        nxt = lines[j + 1] if j + 1 < len(lines) else ""
        if lines[j].rstrip().endswith(q) and nxt.strip() and nxt[:1] in " \t":
            out.append(offs[j + 1])
        i = j + 1
    return out


def function_body_prefixes(tok, texts: list[str], *, n: int, prefix_len: int, eos_id: int, seed: int) -> np.ndarray:
    """[m, prefix_len] token ids (m <= n): the last prefix_len tokens of text ending just after a function's
    docstring, at n seeded choices among every such place in `texts`. A place near the start of its file is
    preceded by the end of the previous file and the end-of-text token, as in the training stream."""
    cands = [(d, pos) for d, t in enumerate(texts) if "def" in t for pos in function_body_starts(t)]
    if not cands or n <= 0:
        return np.zeros((0, prefix_len), dtype=np.int64)
    gen = np.random.default_rng(seed)
    pick = gen.choice(len(cands), size=min(n, len(cands)), replace=False)
    window = 16 * prefix_len  # characters: code averages about 3-4 per token
    heads, tails = [], []
    for c in pick:
        d, pos = cands[c]
        lo = max(0, pos - window)
        heads.append(texts[d - 1][-window:] if lo == 0 and d > 0 else "")
        tails.append(texts[d][lo:pos])
    enc_h = tok.encode_batch(heads, add_special_tokens=False)
    enc_t = tok.encode_batch(tails, add_special_tokens=False)
    rows = []
    for h, t, head in zip(enc_h, enc_t, heads):
        ids = (list(h.ids) + [eos_id] if head else []) + list(t.ids)
        if len(ids) >= prefix_len:
            rows.append(ids[-prefix_len:])
    return np.asarray(rows, dtype=np.int64).reshape(-1, prefix_len)


def stream_prefixes(stream: np.ndarray, *, n: int, prefix_len: int, seed: int) -> np.ndarray:
    """[n, prefix_len] windows of the token stream at seeded positions."""
    gen = np.random.default_rng(seed)
    starts = gen.integers(0, len(stream) - prefix_len, size=n)
    return np.stack([stream[s:s + prefix_len] for s in starts]).astype(np.int64).reshape(n, prefix_len)


# ---------------------------------------------------------------------------------------------------------
# Continuations and their features

@torch.no_grad()
def greedy_continuations(target: FeatureTarget, prefixes: np.ndarray, *, gen_len: int, batch: int, device: str,
                         max_seconds: float = math.inf) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The target's greedy continuation of each prefix (batched, with the model's cache) and the features of
    the draft's target layers at every position but the last, kept as they are computed.

    Returns (seqs [m, prefix_len + gen_len] int64 on the CPU, feats [m, T - 1, n_layers * hidden] bf16,
    stopped_by_guard); m < len(prefixes) only when the time guard ended generation early. The features stay
    on `device` when they take under half of its free memory (a training step then gathers its batch there),
    else in the CPU's memory."""
    from transformers import DynamicCache

    model = target.model.eval()
    n, p = prefixes.shape
    t = p + gen_len
    width = model.config.hidden_size * len(target.layer_ids)
    seqs = torch.empty(n, t, dtype=torch.long)
    store = device
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # what the target's training left cached counts as free here
        if 2 * n * (t - 1) * width > 0.5 * torch.cuda.mem_get_info(device)[0]:
            store = "cpu"
    feats = torch.empty(n, t - 1, width, dtype=torch.bfloat16, device=store)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        if time.perf_counter() - t0 > max_seconds:
            return seqs[:done], feats[:done], True
        x = torch.from_numpy(prefixes[done:done + batch]).to(device)
        b = x.shape[0]
        f = feats[done:done + b]
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        f[:, :p] = target.features().to(torch.bfloat16).to(store)
        steps = []
        toks = [logits[:, -1].argmax(-1)]
        for _ in range(gen_len - 1):
            logits = model(input_ids=toks[-1][:, None], past_key_values=cache, use_cache=True).logits
            steps.append(target.features()[:, 0].to(torch.bfloat16))
            toks.append(logits[:, -1].argmax(-1))
        if steps:
            f[:, p:] = torch.stack(steps, dim=1).to(store)
        seqs[done:done + b] = torch.cat([x, torch.stack(toks, dim=1)], dim=1).cpu()
        done += b
    return seqs, feats, False


def block_batch(seqs: torch.Tensor, *, prefix_len: int, block_size: int, anchors: int, mask_id: int,
                gen: torch.Generator, ctx_len: int | None = None) -> dict[str, torch.Tensor]:
    """Anchors, block inputs, positions, labels and the attention mask for a batch of sequences [B, T] whose
    context features cover positions 0 .. ctx_len - 1 (default T)."""
    b, t = seqs.shape
    c = t if ctx_len is None else ctx_len
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
    # Mask [B, 1, k*bs, C + k*bs]: context keys before the anchor, and the own block.
    ctx_ok = torch.arange(c, device=dev)[None, None, :] < anchor[:, :, None]  # [B, k, C]
    ctx_ok = ctx_ok[:, :, None, :].expand(b, k, block_size, c).reshape(b, k * block_size, c)
    blk = torch.arange(k, device=dev).repeat_interleave(block_size)
    own = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_ok, own], dim=2)[:, None]
    return {"inputs": inputs.view(b, -1), "pos": pos.view(b, -1), "labels": labels, "mask": mask}


def _block_logits(target: FeatureTarget, draft: DFlashDraft, feats: torch.Tensor,
                  bb: dict[str, torch.Tensor]) -> torch.Tensor:
    """Draft logits [B, k, bs-1, V] at block positions 1..bs-1 from stored context features [B, C, F]."""
    bs = draft.config.block_size
    b, c = feats.shape[:2]
    with torch.no_grad():
        emb = target.embed(bb["inputs"])
    ctx = draft.context_features(feats.float())
    ctx_pos = torch.arange(c, device=feats.device).expand(b, c)
    h = draft(emb, bb["pos"], ctx, ctx_pos, mask=bb["mask"])
    h = h.view(b, -1, bs, h.shape[-1])[:, :, 1:]  # position 0 (the given token) predicts nothing
    return target.lm_head(h).float()


def draft_loss(target: FeatureTarget, draft: DFlashDraft, feats: torch.Tensor, bb: dict[str, torch.Tensor],
               gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted block-diffusion loss and per-position hits [bs-1] (argmax == label counts)."""
    bs = draft.config.block_size
    logits = _block_logits(target, draft, feats, bb)
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


def train_draft(target: FeatureTarget, draft: DFlashDraft, seqs: torch.Tensor, feats: torch.Tensor,
                recipe: DraftRecipe, *, device: str, seed: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Trains in place on the continuations `seqs` [N, T] and their stored features `feats` [N, T-1, F]."""
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
    # Each pass visits every sequence once in a seeded order; a step takes the next `batch` of them.
    order = torch.randperm(len(seqs), generator=gen)
    cursor = 0
    for step in range(recipe.steps):
        if cursor + recipe.batch > len(order):
            order, cursor = torch.randperm(len(seqs), generator=gen), 0
        idx = order[cursor:cursor + recipe.batch]
        cursor += recipe.batch
        batch = seqs[idx].to(device)
        f = feats[idx.to(feats.device)].to(device)
        bb = block_batch(batch, prefix_len=recipe.prefix_len, block_size=recipe.block_size, anchors=recipe.anchors,
                         mask_id=draft.config.mask_token_id, gen=gen, ctx_len=f.shape[1])
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, recipe.steps, warmup, recipe.lr)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            loss, hits = draft_loss(target, draft, f, bb, recipe.gamma)
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
    steps = step + 1
    return {"steps": steps, "steps_planned": recipe.steps, "stopped_by_guard": stopped,
            "sequences": len(seqs), "passes": round(steps * recipe.batch / max(1, len(seqs)), 2),
            "seconds": round(time.perf_counter() - t0, 1), "loss_curve": curve,
            "loss_curve_columns": ["step", "loss", "acc@1 (training batch)", "seconds"]}


@torch.no_grad()
def evaluate_draft(target: FeatureTarget, draft: DFlashDraft, seqs: torch.Tensor, feats: torch.Tensor,
                   recipe: DraftRecipe, *, device: str, seed: int) -> dict[str, Any]:
    """Accuracy per block position (draft argmax == the target's greedy token) on held-out continuations,
    contexts teacher-forced as in training, and the i.i.d. chain AL those rates imply."""
    draft.to(device).eval()
    gen = torch.Generator().manual_seed(seed)
    bs = recipe.block_size
    hits = torch.zeros(bs - 1)
    chain = torch.zeros(bs - 1)  # blocks whose first d positions are all right
    n_blocks = 0
    for i in range(0, len(seqs), recipe.batch):
        batch = seqs[i:i + recipe.batch].to(device)
        f = feats[i:i + recipe.batch].to(device)
        bb = block_batch(batch, prefix_len=recipe.prefix_len, block_size=bs, anchors=recipe.anchors,
                         mask_id=draft.config.mask_token_id, gen=gen, ctx_len=f.shape[1])
        ok = (_block_logits(target, draft, f, bb).argmax(-1) == bb["labels"][:, :, 1:]).float().cpu()  # [B, k, bs-1]
        hits += ok.sum(dim=(0, 1))
        chain += ok.cumprod(-1).sum(dim=(0, 1))
        n_blocks += ok.shape[0] * ok.shape[1]
    acc = (hits / max(1, n_blocks)).tolist()
    prefix_ok = (chain / max(1, n_blocks)).tolist()
    return {"sequences": len(seqs), "blocks": n_blocks, "accuracy_per_position": [round(a, 4) for a in acc],
            "teacher_forced_chain_al": round(1 + sum(prefix_ok), 4),
            "note": "position k = 1 .. block_size-1; chain AL = 1 + sum_k P(positions 1..k all right)"}
