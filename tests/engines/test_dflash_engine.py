"""`lucebench-dflash` on the protocol: lossless against `lucebench-ar` (greedy tokens identical, token for
token, on a random Qwen3.5 target with a random z-lab-layout draft), chain and tree at budgets 8/22/40, KV
bf16 and q8_0; stop tokens; the `spec` reply's counts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dflash_synth
import pytest
import qwen3_synth
import qwen35_synth as synth
import torch
from conftest import Engine

# A small vocabulary so that a random draft's top-8 often holds the target's token: the walk then
# accepts and commits deep paths, not only bonus tokens.
VOCAB = 48
DRAFT_SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=96, n_feat=2, vocab=VOCAB, block=16,
                   target_layers=4)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A random Qwen3.5 target (3 DeltaNet + 1 attention layers) and a random draft fed by its layers 1 and 2."""
    root = tmp_path_factory.mktemp("dflash")
    target = synth.save(synth.make_model(seed=6, vocab_size=VOCAB), root / "target")
    dflash_synth.make_draft(root / "draft", seed=7, shape=DRAFT_SHAPE, target_layer_ids=[1, 2],
                            mask_token_id=VOCAB - 1)
    return target, root / "draft"


PROMPTS = [[int(t) for t in torch.randint(0, VOCAB - 1, (n,), generator=torch.Generator().manual_seed(n))]
           for n in (5, 12, 30)]
N_GEN = 48


@pytest.fixture(scope="module")
def ar_tokens(ar_exe, pair) -> dict[str, list[list[int]]]:
    out = {}
    for kv in ("bf16", "q8_0"):
        e = Engine(ar_exe, pair[0], "--kv-k", kv, "--kv-v", kv)
        out[kv] = [e.generate(p, N_GEN)["output_ids"] for p in PROMPTS]
        e.close()
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def check_spec(spec: dict, n_out: int, block: int) -> None:
    """The three views of the rounds agree (docs/protocol.md)."""
    hist, per_depth = spec["al_histogram"], spec["accepted_per_depth"]
    assert len(hist) == block + 1 and hist[0] == 0 and len(per_depth) == block - 1
    assert sum(hist) == spec["draft_steps"]
    assert sum(k * c for k, c in enumerate(hist)) == spec["accepted_tokens"] == n_out - 1
    for d in range(1, block):
        assert per_depth[d - 1] == sum(hist[d + 1:])
    assert set(spec["time_ms"]) == {"draft", "tree", "verify", "commit"}


# mode -> (flags, expected ready options)
MODES = {
    "chain": (["--chain"], {"chain": True, "budget": 15, "top_k": 1}),
    "tree8": (["--budget", "8"], {"chain": False, "budget": 8, "top_k": 8, "chain_seed": True}),
    "tree22": (["--budget", "22"], {"chain": False, "budget": 22, "top_k": 8, "chain_seed": True}),
    "tree40": (["--budget", "40"], {"chain": False, "budget": 40, "top_k": 8, "chain_seed": True}),
    "tree22-unseeded-k3": (["--budget", "22", "--chain-seed", "off", "--top-k", "3"],
                           {"chain": False, "budget": 22, "top_k": 3, "chain_seed": False}),
}


@pytest.mark.parametrize("kv", ["bf16", "q8_0"])
@pytest.mark.parametrize("mode", list(MODES))
def test_lossless_against_ar(dflash_exe, pair, ar_tokens, kv, mode):
    flags, options = MODES[mode]
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]), "--kv-k", kv, "--kv-v", kv, *flags)
    assert options.items() <= e.ready["engine"]["options"].items()
    hist = [0] * (DRAFT_SHAPE["block"] + 1)
    for prompt, want in zip(PROMPTS, ar_tokens[kv]):
        r = e.generate(prompt, N_GEN)
        assert r["type"] == "result", r
        got = r["output_ids"]
        assert got == want, f"{mode} kv {kv}: first divergence at token {first_divergence(got, want)}"
        check_spec(r["spec"], len(got), DRAFT_SHAPE["block"])
        assert r["decode_steps"] == r["spec"]["draft_steps"] < N_GEN - 1
        hist = [a + b for a, b in zip(hist, r["spec"]["al_histogram"])]
    # Random weights accept little, but enough that the walk descends: some round committed a draft
    # token in every mode, and at budget 40 some round went two deep (AL 3).
    assert sum(hist[2:]) > 0, hist
    if mode == "tree40":
        assert sum(hist[3:]) > 0, hist
    assert e.close() == 0


@pytest.mark.parametrize("flag,value", [("--top-k", "0"), ("--top-k", "x"), ("--chain-seed", "maybe"),
                                        ("--chain-seed", None), ("--force-accept-length", "0.5"),
                                        ("--force-accept-length", "nan"), ("--force-accept-length", "x"),
                                        ("--prefill-chunk", "0")])
def test_bad_tree_flags(dflash_exe, pair, flag, value):
    proc = subprocess.run([str(dflash_exe), "--model", str(pair[0]), "--draft", str(pair[1]), flag,
                           *([value] if value is not None else [])], capture_output=True, text=True, timeout=60)
    [line] = [json.loads(s) for s in proc.stdout.splitlines()]
    assert proc.returncode == 2 and line["kind"] == "load" and flag in line["message"]


def test_gpu_backend_on_a_cpu_build(dflash_exe, pair):
    """The cpu build refuses --backend cuda with one `unsupported` line before loading anything."""
    proc = subprocess.run([str(dflash_exe), "--model", str(pair[0]), "--draft", str(pair[1]), "--backend", "cuda"],
                          capture_output=True, text=True, input="", timeout=60)
    [line] = [json.loads(s) for s in proc.stdout.splitlines()]
    assert proc.returncode == 1 and line["type"] == "error" and line["kind"] == "unsupported", line
    assert "built for the cpu backend only; rebuild with --backend cuda" in line["message"], line


@pytest.mark.parametrize("flags,forced,schedule", [
    (["--budget", "22"], 8.31, None),
    (["--chain"], 3.5, [3, 4, 3, 4]),       # floor((r + 1) 3.5) - floor(r 3.5)
    (["--budget", "8"], 9.0, [9, 9, 9]),    # the deepest a budget of 8 reaches: 8 draft tokens + the bonus
])
def test_forced_acceptance(dflash_exe, pair, flags, forced, schedule):
    """--force-accept-length: the rounds commit the forced schedule whatever the draft proposes (benchmark only):
    recorded in the ready line and in the reply's spec, with consistent counts."""
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]), "--force-accept-length", str(forced), *flags)
    assert e.ready["engine"]["options"]["force_accept_length"] == forced
    r = e.generate(PROMPTS[1], 1 + 200)
    spec = r["spec"]
    assert spec["forced_acceptance_length"] == forced
    check_spec(spec, len(r["output_ids"]), DRAFT_SHAPE["block"])
    # every round but the last (cut at n_gen) follows the schedule: the AL is the forced one to 1/rounds
    assert abs(spec["acceptance_length"] - forced) <= forced / spec["draft_steps"] + 1e-6
    if schedule:
        hist = spec["al_histogram"]
        assert sum(hist[k] for k in set(schedule)) >= spec["draft_steps"] - 1
    assert e.close() == 0


def test_forced_acceptance_beyond_the_tree_is_refused(dflash_exe, pair):
    proc = subprocess.run([str(dflash_exe), "--model", str(pair[0]), "--draft", str(pair[1]), "--budget", "4",
                           "--force-accept-length", "6"], capture_output=True, text=True, timeout=60)
    [line] = [json.loads(s) for s in proc.stdout.splitlines()]
    assert proc.returncode == 1 and "exceeds what a round can commit here: 5" in line["message"]


@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_is_lossless(dflash_exe, pair, ar_tokens, chunk):
    """--prefill-chunk N (a GPU's default is 256): the prompt in verifies of N rows, features of every row kept;
    the output equals ar's, with return_logits too (the last token's own verify)."""
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]), "--prefill-chunk", str(chunk))
    assert e.ready["engine"]["options"]["prefill_chunk"] == chunk
    for prompt, want in zip(PROMPTS, ar_tokens["bf16"]):
        assert e.generate(prompt, N_GEN)["output_ids"] == want
    assert e.generate(PROMPTS[2], 9, return_logits=True)["output_ids"] == ar_tokens["bf16"][2][:9]
    assert e.close() == 0


def test_ready_line_of_the_real_walk(dflash_exe, pair):
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]))
    opts = e.ready["engine"]["options"]
    assert opts["force_accept_length"] is None and opts["prefill_chunk"] == 0 and opts["draft_dtype"] == "f32"
    assert e.close() == 0


def test_ready_line_reports_the_drafts_memory(dflash_exe, pair):
    """model.memory.draft: the draft's weights (fp32 on the CPU) and its K/V context cache for max_ctx rows."""
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]), "--max-ctx", "200")
    d = e.ready["model"]["memory"]["draft"]
    s = DRAFT_SHAPE
    assert d["context_cache_dtype"] == "f32" and d["buffer_bytes"] == 0
    # block_size rows past max_ctx: the block's own K/V follow the context rows
    assert d["context_cache_bytes"] == 2 * s["layers"] * (200 + s["block"]) * s["kv_heads"] * s["head_dim"] * 4
    assert d["weights_bytes"] > 4 * s["layers"] * s["hidden"] * (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    assert e.close() == 0


def test_stop_token_cuts_the_round(dflash_exe, pair, ar_tokens):
    """With a stop token, the output ends at its first occurrence, even inside a round's accepted tokens."""
    want = ar_tokens["bf16"][2]
    stop = want[20]
    cut = want.index(stop) + 1
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]), "--budget", "40")
    r = e.generate(PROMPTS[2], N_GEN, ignore_eos=False, eos_ids=[stop])
    assert r["output_ids"] == want[:cut] and r["stop"] == "eos"
    check_spec(r["spec"], cut, DRAFT_SHAPE["block"])
    r = e.generate(PROMPTS[2], 7)  # n_gen cuts the last round too
    assert r["output_ids"] == want[:7] and r["stop"] == "length"
    assert e.generate(PROMPTS[0], 1)["output_ids"] == ar_tokens["bf16"][0][:1]
    assert e.close() == 0


def test_return_logits(ar_exe, dflash_exe, pair):
    """return_logits: the prefill's last-position logits, as the AR engine gives them; generation unchanged."""
    ar = Engine(ar_exe, pair[0])
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]))
    for prompt in (PROMPTS[1], PROMPTS[1][:1]):
        want = ar.generate(prompt, 16, return_logits=True)
        got = e.generate(prompt, 16, return_logits=True)
        assert got["output_ids"] == want["output_ids"]
        a, b = torch.tensor(got["last_logits"]), torch.tensor(want["last_logits"])
        assert a.shape == (VOCAB,) and float((a - b).norm() / b.norm()) < 1e-5  # measured 2.7e-7, 4.7e-7
    ar.close()
    assert e.close() == 0


def test_draft_must_fit_the_target(dflash_exe, pair, tmp_path):
    """A draft for another target is one load error naming the mismatch."""
    dflash_synth.make_draft(tmp_path / "d", seed=1, shape={**DRAFT_SHAPE, "hidden": 32}, target_layer_ids=[1, 2])
    proc = subprocess.run([str(dflash_exe), "--model", str(pair[0]), "--draft", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=60)
    [line] = [json.loads(s) for s in proc.stdout.splitlines()]
    assert proc.returncode != 0 and line["kind"] == "load" and "does not match the target" in line["message"]
    proc = subprocess.run([str(dflash_exe), "--model", str(pair[0])], capture_output=True, text=True, timeout=60)
    [line] = [json.loads(s) for s in proc.stdout.splitlines()]
    assert proc.returncode == 2 and "--draft" in line["message"]


@torch.no_grad()
def reference_chain_rounds(target: Path, draft_w: dict, prompt: list[int], out: list[int]) -> list[dict]:
    """The reference DFlash loop in chain mode (speculative.md §1), given the greedy output: the target's
    features from transformers (hidden_states[id + 1] of layers 1 and 2), the draft from the float64
    reference; a round accepts the draft's leading tokens that equal the greedy continuation. Per round:
    the bonus position, the draft's top-1 per depth, the tokens accepted, and the depths whose top-1 is a
    near-tie (where fp32 may rank differently)."""
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    seq = prompt + out
    hs = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i + 1][0] for i in (1, 2)], -1).double()  # causal: same as computed incrementally
    embed, lm_head = model.model.embed_tokens.weight.double(), model.lm_head.weight.double()
    bs = DRAFT_SHAPE["block"]
    rounds = []
    start, n_out = len(prompt), 1  # start: the bonus token's position
    while n_out < len(out):
        block = embed[[seq[start]] + [VOCAB - 1] * (bs - 1)]
        logits = dflash_synth.reference_block(draft_w, feats[:start], block, shape=DRAFT_SHAPE) @ lm_head.T
        proposal = logits.argmax(-1).tolist()
        top2 = logits.topk(2, -1).values
        ties = [d for d in range(bs - 1) if float(top2[d, 0] - top2[d, 1]) < 1e-4]
        a = 0
        while a < bs - 1 and start + 1 + a < len(seq) and proposal[a] == seq[start + 1 + a]:
            a += 1
        rounds.append({"start": start, "proposal": proposal, "accepted": a, "ties": ties})
        committed = min(a + 1, len(out) - n_out)
        n_out += committed
        start += committed
    return rounds


def test_chain_rounds_match_reference_loop(dflash_exe, pair, ar_tokens, tmp_path, monkeypatch):
    """Round by round, the engine's draft sees the same features at the same positions as the reference
    loop: the same bonus positions, the same top-1 proposal at every depth, the same acceptance (a wrong
    feature layer, position or cache row changes the proposals while the output stays lossless)."""
    draft_w = dflash_synth.make_draft(tmp_path / "same", seed=7, shape=DRAFT_SHAPE, target_layer_ids=[1, 2],
                                      mask_token_id=VOCAB - 1)  # the pair's draft again, for its weights
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("LB_DFLASH_TRACE", str(trace))
    e = Engine(dflash_exe, pair[0], "--draft", str(pair[1]), "--chain")
    compared = total = 0
    for prompt, want in zip(PROMPTS, ar_tokens["bf16"]):
        trace.write_text("")
        r = e.generate(prompt, N_GEN)
        assert r["output_ids"] == want
        got = [json.loads(line) for line in trace.read_text().splitlines()]
        ref = reference_chain_rounds(pair[0], draft_w, prompt, want)
        assert [g["start"] for g in got] == [x["start"] for x in ref]
        for i, (g, x) in enumerate(zip(got, ref)):
            for d in range(DRAFT_SHAPE["block"] - 1):
                total += 1
                if d not in x["ties"]:
                    assert g["proposal"][d] == x["proposal"][d], (prompt, i, d + 1)
                    compared += 1
            assert g["accepted"] == x["accepted"], (prompt, i)
    assert compared >= 0.9 * total  # near-ties of the random draft are rare
    assert e.close() == 0


def test_generate_cli_dflash_equals_ar(cli, pair):
    """`lucebench generate --engine dflash` gives `--engine ar`'s tokens, with the spec counts."""
    args = ["generate", "--model", str(pair[0]), "--prompt-ids", ",".join(map(str, PROMPTS[1])), "--n-gen", "32",
            "--backend", "cpu", "--json"]
    code, out, err = cli([*args, "--engine", "ar"])
    assert code == 0, err
    want = json.loads(out)["output_ids"]
    for extra in (["--budget", "22"], ["--chain"]):
        code, out, err = cli([*args, "--engine", "dflash", "--draft", str(pair[1]), *extra])
        assert code == 0, err
        reply = json.loads(out)
        assert reply["output_ids"] == want, extra
        assert reply["spec"]["accepted_tokens"] == len(want) - 1



@pytest.mark.parametrize("flags", [["--chain"], ["--budget", "22"]])
def test_lossless_on_a_qwen3_target(ar_exe, dflash_exe, tmp_path, flags):
    """A dense Qwen3 target (the Qwen3-8B draft's kind): attention-only verify and commit."""
    target = synth.save(qwen3_synth.make_model(seed=8, vocab_size=VOCAB), tmp_path / "target")
    dflash_synth.make_draft(tmp_path / "draft", seed=9, shape={**DRAFT_SHAPE, "target_layers": 3},
                            target_layer_ids=[0, 2], mask_token_id=VOCAB - 1)
    ar = Engine(ar_exe, target)
    want = [ar.generate(p, N_GEN)["output_ids"] for p in PROMPTS]
    ar.close()
    e = Engine(dflash_exe, target, "--draft", str(tmp_path / "draft"), *flags)
    assert e.ready["model"]["arch"] == "qwen3"
    for prompt, w in zip(PROMPTS, want):
        r = e.generate(prompt, N_GEN)
        assert r["output_ids"] == w, f"{flags}: first divergence at token {first_divergence(r['output_ids'], w)}"
        check_spec(r["spec"], len(w), DRAFT_SHAPE["block"])
    assert e.close() == 0
