"""lucebench-pflash on the CPU (docs/engines.md, "PFlash"): the drafter's importance scores against a plain
PyTorch computation of the same rule on a synthetic Qwen3, the C++ selection and bridge checks, the
character-offset bridge on two real tokenizers of different vocabularies, the target prefilling exactly
the kept tokens, keep ratio 1.0 giving the `ar` engine's tokens, and `lucebench generate --engine pflash`.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Engine

from lucebench.engines.bridge import PFlashBridge, kept_text_ids, target_offsets
from lucebench.models.shapes import get_shape
from lucebench.models.synth import synthesize

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Qwen3.5 target and a tiny Qwen3 drafter with different trained BPE vocabularies (1024, 777)."""
    root = tmp_path_factory.mktemp("pflash-models")
    synthesize(get_shape("tiny"), root / "target", seed=0, dtype="fp32")
    synthesize(get_shape("tiny-qwen3-odd"), root / "drafter", seed=1, dtype="fp32")
    return root / "target", root / "drafter"


@pytest.fixture
def start(pflash_exe):
    started: list[Engine] = []

    def go(target: Path, drafter: Path, *flags: str) -> Engine:
        e = Engine(pflash_exe, target, "--drafter", str(drafter), *flags)
        started.append(e)
        return e

    yield go
    for e in started:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()


def long_text(n_sentences: int, seed: int = 0) -> str:
    """Sentences of random letter strings: few 4-grams repeat, so the anchors do not force every chunk."""
    rng = random.Random(seed)
    word = lambda: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))  # noqa: E731
    return " ".join(" ".join(word() for _ in range(rng.randint(5, 12))).capitalize() + "."
                    for _ in range(n_sentences))


# ---------------------------------------------------------------------------------------------- scores
def reference_importance(model_dir: Path, ids: list[int], n_tail: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule in PyTorch from transformers' Qwen3: q and k after the per-head norms and before RoPE, the last
    rows' causal softmax(q k^T / sqrt(d)), max over heads and layers, mean over the rows; then the pool."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    caught: dict[tuple[str, int], torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name in ("q_norm", "k_norm"):
            hooks.append(getattr(layer.self_attn, name).register_forward_hook(
                lambda mod, args, out, key=(name, i): caught.__setitem__(key, out.detach())))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    n, t = len(ids), min(n_tail, len(ids))
    best = None
    for i in range(len(model.model.layers)):
        q = caught["q_norm", i][0, n - t:]  # [t, heads, d]
        k = caught["k_norm", i][0]  # [n, kv heads, d]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = torch.einsum("thd,shd->ths", q, k) / math.sqrt(q.shape[-1])
        after = torch.arange(n)[None, :] > torch.arange(n - t, n)[:, None]
        p = s.masked_fill(after[:, None, :], float("-inf")).softmax(-1).amax(1)  # [t, n]
        best = p if best is None else torch.maximum(best, p)
    raw = best.mean(0)
    smooth = torch.nn.functional.avg_pool1d(raw[None, None], 13, stride=1, padding=6)[0, 0]
    return raw, smooth


def synthetic_request(nd: int, nt: int, seed: int, vocab_d: int, vocab_t: int) -> dict:
    """Random ids for both models over a text of nd characters: drafter token i is character i, the target's
    tokens split the same characters into nt pieces."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, nd), nt - 1)) if nt > 1 else []
    bounds = [0, *cuts, nd]
    return {"prompt_ids": [rng.randrange(vocab_t) for _ in range(nt)],
            "drafter_ids": [rng.randrange(vocab_d) for _ in range(nd)],
            "drafter_offsets": [[i, i + 1] for i in range(nd)],
            "target_offsets": [[a, b] for a, b in zip(bounds, bounds[1:])]}


@pytest.mark.parametrize("nd", [5, 150, 2071])  # fewer rows than the tail; one forward; several forwards
def test_importance_matches_reference(start, models, nd):
    target, drafter = models
    e = start(target, drafter, "--drafter-kv", "f32", "--keep-ratio", "0.5", "--max-ctx", "256",
              "--min-prompt-tokens", "0")
    assert e.ready["engine"]["options"]["drafter_kv"] == "f32"
    req = synthetic_request(nd, min(nd, 40), seed=nd, vocab_d=777, vocab_t=1024)
    r = e.generate(req.pop("prompt_ids"), 2, return_importance=True, **req)
    assert r["type"] == "result", r
    raw, smooth = reference_importance(drafter, req["drafter_ids"])
    got_raw, got_smooth = torch.tensor(r["importance"]), torch.tensor(r["importance_smoothed"])
    assert got_raw.shape == raw.shape
    err = float((got_raw - raw).abs().max() / raw.abs().max())
    print(f"nd={nd} importance max rel error {err:.2e}")
    assert err < 1e-4
    assert (got_smooth - smooth).abs().max() / smooth.abs().max() < 1e-4
    # the selection's counts follow the rule: max(1, floor(n_chunks * keep)) chunks, never fewer than forced
    pf = r["prefill"]
    n_chunks = -(-nd // 32)
    assert pf["n_chunks"] == n_chunks and pf["drafter_prompt_tokens"] == nd
    assert pf["kept_chunks"] == max(max(1, math.floor(n_chunks * 0.5)), pf["forced_chunks"])
    assert pf["forced_chunks"] >= min(n_chunks, 32)


def test_cpp_selection_and_bridge_checks(pflash_exe):
    build = pflash_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-pflash-tests", "-j", "2"], check=True,
                   capture_output=True)
    proc = subprocess.run([str(build / "lucebench-pflash-tests")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------- bridge
def test_target_offsets_describe_the_ids_sent(models):
    target, drafter = models
    bridge = PFlashBridge(target, drafter)
    text = "<|im_start|>user\nThe café in Tromsø — 日本語 — opens at 7:45.<|im_end|>\n" + long_text(3)
    ids = bridge.target.encode(text, add_special_tokens=False).ids
    decoded, spans = target_offsets(bridge.target, ids)
    assert decoded == bridge.target.decode(ids, skip_special_tokens=False) == text
    assert len(spans) == len(ids) and spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a <= b for a, b in spans) and all(p[1] <= q[0] or p == q for p, q in zip(spans, spans[1:]))
    # a token that is a whole piece of text spans exactly its own text; the pieces of one character share it
    for i, (a, b) in zip(ids, spans):
        piece = bridge.target.decode([i], skip_special_tokens=False)
        if "\ufffd" not in piece:
            assert text[a:b] == piece
    fields = bridge.fields(ids)
    assert len(fields["drafter_ids"]) == len(fields["drafter_offsets"]) and fields["target_offsets"] == spans
    assert fields["drafter_ids"] != ids  # two vocabularies


def kept_from_chars(char_ranges: list[list[int]], spans: list[list[int]]) -> list[int]:
    """The bridge's rule, independently: a target token is kept when any of its characters is in a kept
    range; a token of no text when its position lies in one or at its end."""
    out = []
    for pos, (s, e) in enumerate(spans):
        if any((s < b and e > a) if e > s else (a <= s <= b) for a, b in char_ranges):
            out.append(pos)
    return out


def test_compressed_prefill_is_the_kept_prompt(start, engine, models):
    """keep 0.2 on a prompt of about 2K tokens: kept ranges follow the kept text, the target's output equals
    `ar` run on exactly the kept ids, and the counts are consistent."""
    target, drafter = models
    bridge = PFlashBridge(target, drafter)
    ids = bridge.target.encode(long_text(70), add_special_tokens=False).ids
    fields = bridge.fields(ids)
    e = start(target, drafter, "--keep-ratio", "0.2", "--max-ctx", str(len(ids) + 16), "--min-prompt-tokens", "0")
    r = e.generate(ids, 12, **fields)
    assert r["type"] == "result", r
    pf = r["prefill"]
    kept = [p for a, b in pf["kept_ranges"] for p in range(a, b)]
    assert pf["prompt_tokens"] == len(ids) and pf["kept_tokens_target"] == len(kept) < 0.6 * len(ids)
    assert kept == kept_from_chars(pf["kept_char_ranges"], fields["target_offsets"])
    assert pf["kept_tokens_drafter"] <= pf["drafter_prompt_tokens"] == len(fields["drafter_ids"])
    assert pf["kept_chunks"] == max(math.floor(pf["n_chunks"] * 0.2), pf["forced_chunks"]) < pf["n_chunks"]
    assert set(pf["time_ms"]) == {"score", "select", "bridge", "target_prefill"}
    assert 0 < pf["drafter_forward_ms"] <= pf["time_ms"]["score"]
    assert pf["memory_bytes"]["target"] > 0 and pf["memory_bytes"]["drafter"] > 0
    assert r["timing"]["prefill_ms"] >= sum(pf["time_ms"].values()) * 0.99
    ar = engine(target, "--max-ctx", str(len(ids) + 16))
    ref = ar.generate([ids[p] for p in kept], 12)
    assert r["output_ids"] == ref["output_ids"]
    # the bridge through text (re-tokenising the kept text) keeps about as many target tokens: it differs
    # only at the seams, where the offset bridge keeps a straddling token whole
    via_text = kept_text_ids(bridge.target, ids, pf["kept_char_ranges"])
    print(f"kept {len(kept)} of {len(ids)} target tokens by offsets, {len(via_text)} via text, "
          f"{len(pf['kept_char_ranges'])} spans")
    assert abs(len(via_text) - len(kept)) <= 2 * len(pf["kept_char_ranges"])


def test_keep_ratio_one_is_ar(start, engine, models):
    """Nothing is dropped at keep 1.0: every target token kept and the `ar` engine's tokens exactly."""
    target, drafter = models
    bridge = PFlashBridge(target, drafter)
    ids = bridge.target.encode("<|im_start|>user\n" + long_text(40, seed=3) + " Tromsø 日本", add_special_tokens=False).ids
    e = start(target, drafter, "--keep-ratio", "1.0", "--max-ctx", str(len(ids) + 40))
    r = e.generate(ids, 24, **bridge.fields(ids))
    assert r["prefill"]["kept_ranges"] == [[0, len(ids)]] and r["prefill"]["kept_tokens_target"] == len(ids)
    ref = engine(target, "--max-ctx", str(len(ids) + 40)).generate(ids, 24)
    assert r["output_ids"] == ref["output_ids"]


def test_prompts_below_min_prompt_tokens_are_not_compressed(start, engine, models):
    """--min-prompt-tokens N: a prompt of N - 1 target tokens is prefilled whole (kept = all, the `ar`
    engine's tokens, no drafter phase, `compressed: false`); one of N tokens is compressed."""
    target, drafter = models
    bridge = PFlashBridge(target, drafter)
    ids = bridge.target.encode(long_text(50, seed=5), add_special_tokens=False).ids
    fields = bridge.fields(ids)
    below = start(target, drafter, "--keep-ratio", "0.1", "--max-ctx", str(len(ids) + 16),
                  "--min-prompt-tokens", str(len(ids) + 1))
    assert below.ready["engine"]["options"]["min_prompt_tokens"] == len(ids) + 1
    r = below.generate(ids, 12, **fields)
    pf = r["prefill"]
    assert pf["compressed"] is False and pf["kept_ranges"] == [[0, len(ids)]]
    assert pf["kept_tokens_target"] == pf["prompt_tokens"] == len(ids)
    assert pf["kept_tokens_drafter"] == pf["drafter_prompt_tokens"] and pf["kept_chunks"] == pf["n_chunks"]
    assert pf["time_ms"]["score"] == pf["time_ms"]["select"] == pf["time_ms"]["bridge"] == 0
    assert kept_from_chars(pf["kept_char_ranges"], fields["target_offsets"]) == list(range(len(ids)))
    assert r["output_ids"] == engine(target, "--max-ctx", str(len(ids) + 16)).generate(ids, 12)["output_ids"]
    at = start(target, drafter, "--keep-ratio", "0.1", "--max-ctx", str(len(ids) + 16),
               "--min-prompt-tokens", str(len(ids)))
    pf = at.generate(ids, 12, **fields)["prefill"]
    assert pf["compressed"] is True and pf["kept_tokens_target"] < 0.7 * len(ids) and pf["time_ms"]["score"] > 0


def test_requests_without_drafter_fields_or_bad_flags(start, models, pflash_exe):
    target, drafter = models
    e = start(target, drafter)
    options = e.ready["engine"]["options"]
    assert options["keep_ratio"] == 0.05 and options["bridge"] == "character offsets"
    assert options["min_prompt_tokens"] == 32000  # upstream's threshold
    # upstream's drafter attention: block-sparse from about 32K tokens, alpha 0.85; the measured 10% budget
    assert (options["drafter_sparse_from"], options["drafter_sparse_alpha"], options["drafter_sparse_budget"]) == (
        32768, 0.85, 0.1)
    assert "alpha 85%, at most 10%" in options["drafter_attention"]
    assert options["drafter_kv"] == "bf16" and options["kv_k"] == options["kv_v"] == "bf16"
    assert options["drafter_model"]["arch"] == "qwen3" and e.ready["engine"]["backend"] == "cpu"
    r = e.generate([1, 2, 3], 2)
    assert r["type"] == "error" and r["kind"] == "bad_request" and "drafter_ids" in r["message"]
    r = e.generate([1, 2, 3], 2, drafter_ids=[1, 5000], drafter_offsets=[[0, 1], [1, 2]],
                   target_offsets=[[0, 1], [1, 1], [1, 2]])
    assert r["type"] == "error" and "outside the drafter's vocabulary" in r["message"]
    r = e.generate([1, 2, 3], 2, drafter_ids=[1], drafter_offsets=[[0, 1], [1, 2]], target_offsets=[[0, 1]] * 3)
    assert r["type"] == "error" and "one [start, end] pair per token" in r["message"]
    r = e.generate([1, 2, 3], 2, drafter_ids=[1, 2], drafter_offsets=[[0, 1], [1, 2]],
                   target_offsets=[[1, 2], [0, 1], [2, 2]])
    assert r["type"] == "error" and "text order" in r["message"]
    assert e.close() == 0
    for flags, what in ((["--drafter", str(target)], "dense Qwen3 drafter"), ([], "needs --drafter"),
                        (["--drafter", str(drafter), "--budget", "3"], "does not take --budget"),
                        (["--drafter", str(drafter), "--min-prompt-tokens", "-5"], "--min-prompt-tokens must be"),
                        (["--drafter", str(drafter), "--drafter-sparse-alpha", "85"], "a fraction: 0.85, not 85"),
                        (["--drafter", str(drafter), "--drafter-sparse-budget=0"], "--drafter-sparse-budget must be"),
                        (["--drafter", str(drafter), "--drafter-sparse-from", "1e4"], "--drafter-sparse-from must be"),
                        (["--drafter", str(drafter), "--drafter-sparse-from"], "--drafter-sparse-from needs a value"),
                        (["--drafter", str(drafter), "--drafter-kv", "q5"], "KV cache type 'q5' for --drafter-kv"),
                        # the flag reaches the drafter: this one's head_dim (24) has no whole q8_0 blocks
                        (["--drafter", str(drafter), "--drafter-kv=q8_0"], "head_dim a multiple of 32"),
                        (["--drafter", str(drafter), "--backend", "cuda"], "built for the cpu backend only")):
        proc = subprocess.run([str(pflash_exe), "--model", str(target), *flags], capture_output=True, text=True,
                              input="", timeout=60)
        line = json.loads(proc.stdout.splitlines()[0])
        assert proc.returncode != 0 and line["type"] == "error" and what in line["message"], line


def test_drafter_kv_is_its_own(start, models):
    """--kv-k/--kv-v are the target's cache types, --drafter-kv the drafter's: a quantised target cache leaves
    the drafter's importance bit for bit as it was (the drafter here could not even hold a q8_0 cache: head_dim
    24), while the drafter's own type changes it; both are in the ready line."""
    target, drafter = models
    req = synthetic_request(700, 40, seed=11, vocab_d=777, vocab_t=1024)
    prompt = req.pop("prompt_ids")
    imp, ready = {}, {}
    for name, flags in (("default", []), ("target q8_0", ["--kv-k", "q8_0", "--kv-v", "q8_0"]),
                        ("drafter f16", ["--drafter-kv", "f16"])):
        e = start(target, drafter, "--keep-ratio", "0.2", "--max-ctx", "800", "--min-prompt-tokens", "0", *flags)
        ready[name] = e.ready["engine"]["options"]
        r = e.generate(prompt, 2, return_importance=True, **req)
        assert r["type"] == "result", r
        imp[name] = r["importance"]
        assert e.close() == 0
    assert ready["target q8_0"]["kv_k"] == ready["target q8_0"]["kv_v"] == "q8_0"
    assert ready["target q8_0"]["drafter_kv"] == ready["default"]["drafter_kv"] == "bf16"
    assert ready["drafter f16"]["drafter_kv"] == "f16" and ready["drafter f16"]["kv_k"] == "bf16"
    assert imp["target q8_0"] == imp["default"]
    diff = max(abs(a - b) for a, b in zip(imp["drafter f16"], imp["default"])) / max(imp["default"])
    assert 0 < diff < 0.05, diff  # another rounding of the same keys and values


def test_block_sparse_drafter(start, models):
    """--drafter-sparse-*: the drafter's attention reads only the kept key tiles (the reply says which share of
    the causal ones), at most the budget's; the options are in the ready line; a dense drafter reports no share,
    and the default (block-sparse from 32,768 tokens) leaves a shorter prompt dense, selection included."""
    target, drafter = models
    req = synthetic_request(3000, 60, seed=3, vocab_d=777, vocab_t=1024)
    prompt = req.pop("prompt_ids")
    read, kept = {}, {}
    for name, flags in (("dense", ["--drafter-sparse-from", "0"]), ("default", []),
                        ("b100", ["--drafter-sparse-from=1024", "--drafter-sparse-budget", "1"]),
                        ("b5", ["--drafter-sparse-from", "1024", "--drafter-sparse-budget", "0.05"])):
        e = start(target, drafter, "--keep-ratio", "0.2", "--max-ctx", "3100", "--min-prompt-tokens", "0", *flags)
        options = e.ready["engine"]["options"]
        assert "pflash_sparse_from" not in e.ready["engine"]["tuning"]  # an engine option, no longer a knob
        if name == "dense":
            assert options["drafter_sparse_from"] == 0 and options["drafter_attention"] == "dense"
        elif name == "default":
            assert options["drafter_sparse_from"] == 32768 and "from 32768 tokens" in options["drafter_attention"]
        else:
            budget = 100 if name == "b100" else 5
            assert options["drafter_sparse_from"] == 1024 and options["drafter_sparse_budget"] == budget / 100
            assert f"alpha 85%, at most {budget}%" in options["drafter_attention"]
        r = e.generate(prompt, 2, **req)
        assert r["type"] == "result", r
        read[name] = r["prefill"].get("drafter_attention_read")
        kept[name] = r["prefill"]["kept_ranges"]
        assert e.close() == 0
    assert read["dense"] is None and read["default"] is None and kept["default"] == kept["dense"]
    # 3000 rows: query tiles see up to 24 key blocks, 6 of them forced (sinks, recent), at most ceil(5% x 24) = 2
    # more; the last 256 rows dense: about half the causal key tiles at most
    assert 0 < read["b5"] <= read["b100"] <= 1 and read["b5"] < 0.7, read


# ---------------------------------------------------------------------------------------------- CLI
def test_generate_cli(models):
    """`lucebench generate --engine pflash --drafter DIR --keep-ratio R` sends the drafter's fields."""
    target, drafter = models
    base = [sys.executable, "-m", "lucebench", "generate", "--model", str(target), "--backend", "cpu",
            "--prompt", long_text(30, seed=5), "--n-gen", "6", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = {}
    for name, extra in (("pflash", ["--engine", "pflash", "--drafter", str(drafter), "--keep-ratio", "1"]),
                        ("ar", ["--engine", "ar"])):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        out[name] = json.loads(proc.stdout)
    assert out["pflash"]["output_ids"] == out["ar"]["output_ids"]
    pf = out["pflash"]["prefill"]
    assert pf["kept_tokens_target"] == pf["prompt_tokens"] == out["ar"]["n_prompt"]
    # the drafter's attention options: checked before the engine starts, one error line, no traceback
    proc = subprocess.run(base + ["--engine", "pflash", "--drafter", str(drafter), "--drafter-sparse-alpha", "85"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "--drafter-sparse-alpha must be in (0, 1]" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(base + ["--engine", "pflash", "--drafter", str(drafter), "--drafter-kv", "q5"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "--drafter-kv is one of" in proc.stderr and "Traceback" not in proc.stderr


def test_retention_script_reproduces_the_engine_selection(start, models):
    """scripts/pflash_retention.py re-applies the selection and the bridge in Python for its controls: on the
    engine's own importance they give the engine's kept ranges, and needle chunks map through the offsets."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pflash_retention", ROOT / "scripts" / "pflash_retention.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    target, drafter = models
    bridge = PFlashBridge(target, drafter)
    text = long_text(90, seed=7)
    # the prompt's end quotes a passage from its middle: anchors force chunks there
    ids = bridge.target.encode(text + " " + text[len(text) // 2:len(text) // 2 + 200], add_special_tokens=False).ids
    fields = bridge.fields(ids)
    for keep in (0.1, 0.3):
        e = start(target, drafter, "--keep-ratio", str(keep), "--max-ctx", str(len(ids) + 8), "--min-prompt-tokens", "0")
        r = e.generate(ids, 2, return_importance=True, **fields)
        means = script.chunk_means(r["importance_smoothed"], len(fields["drafter_ids"]))
        kept = script.select(means, fields["drafter_ids"], keep)
        assert len(kept) == r["prefill"]["kept_chunks"]
        assert script.bridge(kept, fields["drafter_offsets"], fields["target_offsets"]) == r["prefill"]["kept_ranges"]
        assert r["prefill"]["forced_chunks"] > 8 + 24  # the quoted passage's chunks are anchors
        no_anchors = script.select(means, fields["drafter_ids"], keep, anchors=False)
        n = len(means)
        assert len(no_anchors) == max(min(32, n), max(1, int(n * keep)))
    span = {"needles": [{"token_span": [10, 20]}]}
    chunks = script.needle_chunks(span, fields["drafter_offsets"], fields["target_offsets"])[0]
    a, b = fields["target_offsets"][10][0], fields["target_offsets"][19][1]
    assert chunks == sorted({i // 32 for i, (s, t) in enumerate(fields["drafter_offsets"]) if s < b and t > a})
