"""prepare_workload: formats, lengths, overrides, skips, identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites import prepare_workload, workload_identity
from lucebench.suites.tokenization import load_tokenizer


def test_gsm8k_raw_format_and_record(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    w = prepare_workload("gsm8k", tokenizer_dir=model_dir)
    tok = load_tokenizer(model_dir)
    assert w.kind == "dataset" and w.n_gen == 256 and w.stop == "fixed" and w.ignore_eos
    assert w.prompt_format == "raw" and len(w.prompts) == 10 and w.row_ids == w.prompt_ids
    first = w.prompts[0]
    i = int(first.id.rsplit("/", 1)[1])
    question = f"Tom has {i} apples and buys {i + 2} more. How many apples does he have?"
    assert first.text == f"Question: {question}\nAnswer: "
    assert first.token_ids == tok.encode(first.text)
    assert first.reference["answer"].endswith(f"#### {2 * i + 2:,}")
    assert w.selection == {"method": "shuffle", "seed": 42, "sample_size": 10, "rows": 30}
    assert w.eos_ids and w.tokenizer_sha256 and w.dataset == "openai/gsm8k" and w.dataset_config == "main"


def test_math500_and_humaneval_raw_formats(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    m = prepare_workload("math500", tokenizer_dir=model_dir, sample_size=1)
    assert m.prompts[0].text.startswith("Problem: Compute $\\frac{")
    assert m.prompts[0].text.endswith("$.\nSolution: Put your final answer in \\boxed{}.\n")
    h = prepare_workload("humaneval", tokenizer_dir=model_dir)
    assert all(p.text == p.reference["prompt"] for p in h.prompts)
    assert all(p.id.startswith("HumanEval/") for p in h.prompts)


def test_chat_format_with_thinking_on_and_off(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    off = prepare_workload("gsm8k", tokenizer_dir=model_dir, prompt_format="chat", sample_size=2)
    on = prepare_workload("gsm8k", tokenizer_dir=model_dir, prompt_format="chat-thinking", sample_size=2)
    assert off.prompt_format == "chat" and on.prompt_format == "chat-thinking"
    assert off.prompts[0].text.startswith("<|im_start|>user\nQuestion: ")
    assert off.prompts[0].text.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.prompts[0].text.endswith("<|im_start|>assistant\n")
    tok = load_tokenizer(model_dir)
    assert on.prompts[0].token_ids == tok.encode(on.prompts[0].text, add_special_tokens=False)
    assert tok.tokenizer.token_to_id("<|im_start|>") == on.prompts[0].token_ids[0]
    assert workload_identity(on) != workload_identity(off)


def test_overrides_and_identity(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    base = prepare_workload("gsm8k", tokenizer_dir=model_dir)
    same = prepare_workload("gsm8k", tokenizer_dir=model_dir)
    assert workload_identity(base) == workload_identity(same)
    natural = prepare_workload("gsm8k", tokenizer_dir=model_dir, stop="natural", n_gen=1024)
    assert natural.stop == "natural" and not natural.ignore_eos and natural.n_gen == 1024
    assert workload_identity(natural) != workload_identity(base)
    assert workload_identity(prepare_workload("gsm8k", tokenizer_dir=model_dir, n_gen=255)) != workload_identity(base)
    three = prepare_workload("gsm8k", tokenizer_dir=model_dir, sample_size=3)
    assert three.row_ids == base.row_ids[:3]
    with pytest.raises(UserError, match="unknown stop policy"):
        prepare_workload("gsm8k", tokenizer_dir=model_dir, stop="eos")
    with pytest.raises(UserError, match="unknown prompt format"):
        prepare_workload("gsm8k", tokenizer_dir=model_dir, prompt_format="markdown")
    with pytest.raises(UserError, match="context parameter applies to synthetic and needle"):
        prepare_workload("gsm8k", tokenizer_dir=model_dir, context=4096)


def test_prompts_over_the_limit_are_skipped_and_listed(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    full = prepare_workload("humaneval", tokenizer_dir=model_dir)
    lengths = sorted(len(p.token_ids) for p in full.prompts)
    limit = lengths[len(lengths) // 2]
    w = prepare_workload("humaneval", tokenizer_dir=model_dir, max_prompt_tokens=limit)
    assert w.max_prompt_tokens == limit
    assert len(w.prompts) + len(w.skipped) == 10 and w.skipped
    assert all(len(p.token_ids) <= limit for p in w.prompts)
    for s in w.skipped:
        assert s["n_tokens"] > limit and f"over the limit of {limit}" in s["reason"]
    assert w.row_ids == full.row_ids  # the selection itself does not change


def test_pp520_is_exactly_520_tokens_prefill_only(model_dir: Path) -> None:
    w = prepare_workload("pp520", tokenizer_dir=model_dir)
    assert w.kind == "synthetic" and w.phase == "prefill" and w.n_gen == 1 and w.ignore_eos
    assert len(w.prompts) == 1 and len(w.prompts[0].token_ids) == 520 and w.depth is None
    text = load_tokenizer(model_dir).decode(w.prompts[0].token_ids)
    assert text.startswith(" The quick brown fox jumps over the lazy dog")


def test_tg128_times_128_decode_steps(model_dir: Path) -> None:
    w = prepare_workload("tg128", tokenizer_dir=model_dir)
    assert w.n_gen == 129 and w.phase == "decode" and w.ignore_eos and w.depth == 1
    assert len(w.prompts[0].token_ids) == 1


@pytest.mark.parametrize("suite,context,n_prompt,n_gen,depth", [
    ("pp2048", None, 2048, 1, None), ("pp", 4096, 4096, 1, None), ("tg64", None, 1, 65, 1),
    ("tg128", 8192, 8192, 129, 8192), ("tg", 300, 300, 129, 300)])
def test_parameterised_lengths_and_depth(model_dir: Path, suite: str, context: int | None, n_prompt: int,
                                         n_gen: int, depth: int | None) -> None:
    w = prepare_workload(suite, tokenizer_dir=model_dir, context=context)
    assert len(w.prompts[0].token_ids) == n_prompt and w.n_gen == n_gen and w.depth == depth


def test_synthetic_prompt_longer_than_the_engine_context_is_skipped(model_dir: Path) -> None:
    w = prepare_workload("pp2048", tokenizer_dir=model_dir, max_prompt_tokens=1024)
    assert w.prompts == [] and w.skipped[0]["id"] == "pp2048"


def test_missing_tokenizer_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no tokenizer.json"):
        prepare_workload("pp520", tokenizer_dir=tmp_path)


def test_bos_tokenizers_get_their_bos_in_raw_prompts(tmp_path: Path, helpers) -> None:
    folder = helpers.make_model_dir(tmp_path / "bos", bos=True)
    tok = load_tokenizer(folder)
    w = prepare_workload("needle", tokenizer_dir=folder, context=1024)
    assert all(p.token_ids[0] == tok.tokenizer.token_to_id("<s>") and len(p.token_ids) == 1024 for p in w.prompts)


def test_needle_sample_size_takes_the_first_cases_per_length(model_dir: Path) -> None:
    """sample_size on a needle suite: the first N cases (seeded per case, so the same prompts as in the full
    suite); a synthetic suite has no cases to sample."""
    full = prepare_workload("needle", tokenizer_dir=model_dir, context=1024)
    two = prepare_workload("needle", tokenizer_dir=model_dir, context=1024, sample_size=2)
    assert len(full.prompts) == 5 and len(two.prompts) == 2
    assert [p.token_ids for p in two.prompts] == [p.token_ids for p in full.prompts[:2]]
    assert workload_identity(two) != workload_identity(full)
    with pytest.raises(UserError, match="dataset and needle suites only"):
        prepare_workload("pp520", tokenizer_dir=model_dir, sample_size=1)
