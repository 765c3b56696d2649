"""Needle-in-a-haystack prompts: exact lengths, needle placement, determinism, speed."""

from __future__ import annotations

import time
from pathlib import Path

from lucebench.suites import prepare_workload, workload_identity
from lucebench.suites.tokenization import load_tokenizer


def test_default_lengths_cases_and_depths(model_dir: Path) -> None:
    w = prepare_workload("needle", tokenizer_dir=model_dir)
    assert w.kind == "needle" and w.scorer == "needle" and not w.ignore_eos
    lengths = [8192, 16384, 32768, 65536, 131072]
    assert [len(p.token_ids) for p in w.prompts] == [n for n in lengths for _ in range(5)]
    assert {p.reference["depth"] for p in w.prompts} == {0.1, 0.3, 0.5, 0.7, 0.9}
    assert len({p.id for p in w.prompts}) == 25


def test_needle_is_in_the_prompt_near_its_depth_and_the_question_ends_it(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    w = prepare_workload("needle", tokenizer_dir=model_dir, context=8192)
    for p in w.prompts:
        ref = p.reference
        text = tok.decode(p.token_ids)
        sentence = f"The secret passcode for {ref['needle_key']} is {ref['needle_value']}."
        assert text.count(sentence) == 1 and len(ref["needle_value"]) == 7
        assert text.endswith(f"What is the secret passcode for {ref['needle_key']}? Reply with the number only.\nAnswer:")
        assert abs(ref["needle_token_offset"] / 8192 - ref["depth"]) < 0.01
        assert tok.decode(p.token_ids[ref["needle_token_offset"]:]).startswith(" The secret passcode")


def test_deterministic_by_seed(model_dir: Path) -> None:
    a = prepare_workload("needle", tokenizer_dir=model_dir, context=4096)
    b = prepare_workload("needle", tokenizer_dir=model_dir, context=4096)
    assert workload_identity(a) == workload_identity(b)
    assert [p.reference for p in a.prompts] == [p.reference for p in b.prompts]
    assert len({p.reference["needle_value"] for p in a.prompts}) == 5


def test_chat_format_keeps_the_exact_length(model_dir: Path) -> None:
    w = prepare_workload("needle", tokenizer_dir=model_dir, context=16384, prompt_format="chat")
    tok = load_tokenizer(model_dir)
    assert all(len(p.token_ids) == 16384 for p in w.prompts)
    text = tok.decode(w.prompts[0].token_ids)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_128k_prompts_build_in_seconds(model_dir: Path) -> None:
    start = time.perf_counter()
    w = prepare_workload("needle", tokenizer_dir=model_dir, context=131072)
    assert time.perf_counter() - start < 5.0
    assert all(len(p.token_ids) == 131072 for p in w.prompts)


def test_longer_than_the_engine_context_is_skipped(model_dir: Path) -> None:
    w = prepare_workload("needle", tokenizer_dir=model_dir, max_prompt_tokens=20000)
    assert len(w.prompts) == 10 and len(w.skipped) == 15
