"""The reference DFlash speculative loop (greedy, chain): a transformers target and the PyTorch draft.

This is the loop of speculative.md §1, written for one sequence so that an engine can be checked against it
round by round:

1. prefill the target over the prompt, keeping the features (outputs of `target_layer_ids`) of every prompt
   position; the first token is the argmax of the last logit;
2. each round: the draft projects the context features committed since the last round (its cache keeps each
   layer's context K/V), runs the block `[bonus, MASK x (B-1)]` at positions `start .. start+B-1` and
   proposes the argmax of the target's LM head at block positions 1..B-1;
3. one target forward verifies `[bonus, d_1 .. d_{B-1}]`; the longest prefix with `d_i == argmax after the
   previous position` is accepted and the target's argmax after it is the next bonus;
4. the target's cache is brought back to the committed tokens: the full-attention K/V and the DeltaNet
   conv/recurrent states cannot be cut, so the cache taken before the verify is restored and the accepted
   tokens `[bonus, d_1 .. d_a]` are run again ("replay", speculative.md §3 design 3); their features are the
   next round's new context.

AL (acceptance length) = tokens committed per round, bonus included (at most B). Generation stops after
`n_gen` tokens or at a stop token (kept in the output, as the autoregressive baseline keeps it). The loop is
lossless: its tokens equal the target's own greedy decoding (`greedy_reference`), up to floating-point ties
between the batched verify and the one-token steps; `first_divergence` says where they differ.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lucebench.models.dflash_torch import DFlashDraft, DraftCache


class FeatureTarget:
    """A transformers causal LM plus hooks that keep the outputs of the draft's target layers."""

    def __init__(self, model, layer_ids: list[int]):
        self.model = model
        self.layer_ids = list(layer_ids)
        self._out: dict[int, torch.Tensor] = {}
        layers = model.model.layers
        for i in self.layer_ids:
            layers[i].register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def keep(_module, _inputs, output):
            self._out[i] = output[0] if isinstance(output, tuple) else output
        return keep

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    @torch.no_grad()
    def forward(self, ids: list[int] | torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [T, V] (float32) and concatenated features [T, n*H] (None without target layers) of `ids`
        appended to `cache`."""
        x = torch.as_tensor(ids, dtype=torch.long, device=self.model.device).view(1, -1)
        out = self.model(input_ids=x, past_key_values=cache, use_cache=True)
        feats = torch.cat([self._out[i] for i in self.layer_ids], dim=-1)[0] if self.layer_ids else None
        return out.logits[0].float(), feats

    @torch.no_grad()
    def forward_batch(self, ids: torch.Tensor) -> None:
        """A cache-less forward of the decoder stack over [B, T] ids (training): fills `features()`."""
        self.model.model(input_ids=ids, use_cache=False)

    def features(self) -> torch.Tensor:
        """[B, T, n*H] outputs of the target layers from the last forward."""
        return torch.cat([self._out[i] for i in self.layer_ids], dim=-1)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)


def greedy_reference(target: FeatureTarget, prompt: list[int], n_gen: int, stop_ids: set[int]) -> list[int]:
    """Plain autoregressive greedy decoding: prefill, then one forward per token."""
    cache = target.new_cache()
    logits, _ = target.forward(prompt, cache)
    out: list[int] = []
    tok = int(logits[-1].argmax())
    while True:
        out.append(tok)
        if len(out) >= n_gen or tok in stop_ids:
            return out
        logits, _ = target.forward([tok], cache)
        tok = int(logits[-1].argmax())


@dataclass
class SpecResult:
    tokens: list[int]
    committed_per_round: list[int] = field(default_factory=list)  # bonus included

    @property
    def rounds(self) -> int:
        return len(self.committed_per_round)

    @property
    def acceptance_length(self) -> float:
        return sum(self.committed_per_round) / max(1, self.rounds)


@torch.no_grad()
def speculative_greedy(target: FeatureTarget, draft: DFlashDraft, prompt: list[int], n_gen: int,
                       stop_ids: set[int]) -> SpecResult:
    """The real chain loop (see the module docstring)."""
    cfg = draft.config
    bs, mask_id = cfg.block_size, cfg.mask_token_id
    dev = target.model.device
    cache = target.new_cache()
    logits, feats = target.forward(prompt, cache)
    tokens = [int(logits[-1].argmax())]
    result = SpecResult(tokens)
    if tokens[0] in stop_ids or n_gen <= 1:
        return result
    dcache = DraftCache(len(draft.layers))
    new_ctx, new_pos = feats, torch.arange(len(prompt), device=dev)
    start = len(prompt)  # position of the bonus token
    while True:
        bonus = tokens[-1]
        block = torch.tensor([[bonus] + [mask_id] * (bs - 1)], device=dev)
        block_pos = torch.arange(start, start + bs, device=dev).view(1, -1)
        ctx = draft.context_features(new_ctx.unsqueeze(0).to(next(draft.parameters()).dtype))
        hidden = draft(target.embed(block).to(ctx.dtype), block_pos, ctx, new_pos.view(1, -1), cache=dcache)
        proposal = target.lm_head(hidden[0, 1:].to(target.model.dtype)).float().argmax(-1).tolist()
        snapshot = copy.deepcopy(cache)
        v_logits, v_feats = target.forward([bonus] + proposal, cache)
        best = v_logits.argmax(-1).tolist()
        a = 0
        while a < bs - 1 and proposal[a] == best[a]:
            a += 1
        new = proposal[:a] + [best[a]]
        if a < bs - 1:
            cache = snapshot
            _, v_feats = target.forward([bonus] + proposal[:a], cache)
        new_ctx, new_pos = v_feats[: a + 1], torch.arange(start, start + a + 1, device=dev)
        start += a + 1
        done = False
        committed = 0
        for t in new:
            tokens.append(t)
            committed += 1
            if len(tokens) >= n_gen or t in stop_ids:
                done = True
                break
        result.committed_per_round.append(committed)
        if done:
            return result


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------------------------------------------------
# Loading and the acceptance measurement

def load_target(path: Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def load_pair(target_dir: Path, draft_dir: Path, *, device: str = "cpu") -> tuple[FeatureTarget, DFlashDraft]:
    draft = DFlashDraft.load(Path(draft_dir)).to(device)
    target = FeatureTarget(load_target(target_dir, device=device), draft.config.target_layer_ids)
    return target, draft


# Prompt formats of the DFlash benchmark (upstream.md; suites/*.yaml).
PROMPT_FORMATS = {
    "humaneval": ("humaneval/HumanEval.jsonl.gz", "prompt", "{prompt}"),
    "gsm8k": ("gsm8k/test.jsonl", "question", "Question: {question}\nAnswer: "),
    "math500": ("math500/test.jsonl", "problem", "Problem: {problem}\nSolution: Put your final answer in \\boxed{{}}.\n"),
}


def eval_prompts(datasets_dir: Path, name: str, n: int, seed: int = 42) -> list[str]:
    """The first n prompts of a set after the suites' shuffle (numpy PCG64 permutation with `seed`)."""
    from lucebench.models.train.text_corpus import read_jsonl
    from lucebench.suites.selection import select_indices

    rel, key, template = PROMPT_FORMATS[name]
    rows = read_jsonl(Path(datasets_dir) / rel)
    idx = select_indices([str(i) for i in range(len(rows))], method="shuffle", seed=seed, sample_size=n)
    return [template.format(**{key: rows[i][key]}) for i in idx]


def measure_acceptance(target_dir: Path, draft_dir: Path, datasets_dir: Path, *, n_prompts: int = 20,
                       n_gen: int = 128, datasets: tuple[str, ...] = ("humaneval", "gsm8k", "math500"),
                       device: str = "cpu", progress=None, max_seconds: float | None = None) -> dict[str, Any]:
    """Chain AL of the reference loop per dataset, its histogram and per-depth acceptance, and losslessness
    against the target's greedy decoding (token by token, first divergence). With `max_seconds`, no prompt is
    started after that time; each set records how many prompts it measured (`prompts_measured`)."""
    import time

    t0 = time.perf_counter()
    from tokenizers import Tokenizer

    target, draft = load_pair(target_dir, draft_dir, device=device)
    tok = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    gen_cfg = json.loads((Path(target_dir) / "generation_config.json").read_text(encoding="utf-8"))
    eos = gen_cfg.get("eos_token_id")
    stop_ids = set(eos if isinstance(eos, list) else [eos])
    bs = draft.config.block_size
    report: dict[str, Any] = {"n_prompts": n_prompts, "n_gen": n_gen, "block_size": bs,
                              "stop_ids": sorted(stop_ids), "dtype": "float32",
                              "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
                              "datasets": {}}
    for name in datasets:
        prompts = eval_prompts(Path(datasets_dir), name, n_prompts)
        per_prompt = []
        hist = [0] * (bs + 1)
        for j, text in enumerate(prompts):
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                break
            ids = tok.encode(text, add_special_tokens=False).ids
            spec = speculative_greedy(target, draft, ids, n_gen, stop_ids)
            ar = greedy_reference(target, ids, n_gen, stop_ids)
            for c in spec.committed_per_round:
                hist[c] += 1
            per_prompt.append({"prompt_tokens": len(ids), "generated": len(spec.tokens), "rounds": spec.rounds,
                               "al": round(spec.acceptance_length, 4),
                               "first_divergence": first_divergence(spec.tokens, ar)})
            if progress:
                progress(name, j + 1, len(prompts), spec.acceptance_length)
        rounds = sum(hist)
        committed = sum(c * n for c, n in enumerate(hist))
        # Depth d (1 .. B-1) accepted in a round <=> committed >= d + 1 (the bonus is always committed).
        depth = [round(sum(hist[d + 1:]) / max(1, rounds), 4) for d in range(1, bs)]
        report["datasets"][name] = {
            "al": round(committed / max(1, rounds), 4),
            "rounds": rounds,
            "tokens_after_first": committed,
            "histogram": hist,
            "accepted_at_depth": depth,
            "prompts_measured": len(per_prompt),
            "lossless_prompts": sum(p["first_divergence"] is None for p in per_prompt),
            "prompts": per_prompt,
        }
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m lucebench.models.dflash_reference --models DIR --datasets DIR [--sets humaneval ...]
    [--device cuda] --out FILE`: `measure_acceptance` without the CLI's dependencies (the GPU machine runs
    one process per set; scripts/device/train_reference.sh)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lucebench.models.dflash_reference", description=main.__doc__)
    ap.add_argument("--models", type=Path, required=True, help="folder holding target/ and draft/")
    ap.add_argument("--datasets", type=Path, required=True)
    ap.add_argument("--sets", nargs="+", default=list(PROMPT_FORMATS), choices=list(PROMPT_FORMATS))
    ap.add_argument("--n-prompts", type=int, default=20)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-seconds", type=float, default=None, help="start no prompt after this time")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda"):
        # float32 as on the CPU: no TF32 in matmuls or in the DeltaNet's convolution.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(1)
    report = measure_acceptance(args.models / "target", args.models / "draft", args.datasets,
                                n_prompts=args.n_prompts, n_gen=args.n_gen, datasets=tuple(args.sets),
                                device=args.device, max_seconds=args.max_seconds)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name, r in report["datasets"].items():
        print(f"{name}: AL {r['al']:.3f} over {r['rounds']} rounds, accepted at depth 1/2/3 "
              f"{r['accepted_at_depth'][:3]}, lossless {r['lossless_prompts']}/{r['prompts_measured']} "
              f"({r['prompts_measured']} of {args.n_prompts} prompts measured)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
