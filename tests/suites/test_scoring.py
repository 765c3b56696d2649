"""Scoring: extraction and equivalence rules, gold answers score 100%, corrupted ones do not."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites import prepare_workload, score
from lucebench.suites.base import PreparedWorkload, Prompt
from lucebench.suites.datasource import read_jsonl
from lucebench.suites.mathnorm import gsm8k_predicted, last_boxed, math_equal
from lucebench.suites.scoring import aggregate, humaneval_program, score_all

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets is not beside the repository")


@pytest.mark.parametrize("output,expected", [
    ("She pays 5 + 7 = 12 dollars.\n#### 12", "12"),
    ("so the answer is \\boxed{1,234}. Then 99", "1234"),
    ("#### 3,600\nQuestion: next 77", "3600"),
    ("He ends with 18 eggs.", "18"),
    ("Total: -4.5", "-4.5"),
    ("no digits here", None),
])
def test_gsm8k_extraction(output: str, expected: str | None) -> None:
    assert gsm8k_predicted(output) == expected


@pytest.mark.parametrize("pred,gold", [
    ("\\dfrac{1}{2}", "\\frac12"), ("0.5", "\\frac{1}{2}"), ("1/2", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"), ("90^\\circ", "90"), ("5.0", "5"),
    ("\\text{(C)}", "(C)"), ("x = 7", "7"), ("10\\%", "10"), ("\\$18.90", "18.9"), ("4 \\text{ cm}", "4"),
    ("[-2, 7)", "[-2,7)"), ("3, 5", "3,5"),
])
def test_math_equivalences(pred: str, gold: str) -> None:
    assert math_equal(pred, gold)


@pytest.mark.parametrize("pred,gold", [("\\frac{1}{3}", "\\frac12"), ("(3,4)", "(4,3)"), ("x^2", "x^3"), (None, "1")])
def test_math_non_equivalences(pred: str | None, gold: str) -> None:
    assert not math_equal(pred, gold)


def test_last_boxed_respects_nesting() -> None:
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{2}} end") == "\\frac{\\sqrt{3}}{2}"
    assert last_boxed("nothing") is None


def test_fixture_sets_gold_and_corrupted(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    he = prepare_workload("humaneval", tokenizer_dir=model_dir)
    gold = score_all(he, {p.id: p.reference["canonical_solution"] for p in he.prompts})
    assert aggregate(gold)["accuracy"] == 1.0
    broken = score_all(he, {p.id: "    return x - 1\n" for p in he.prompts})
    assert aggregate(broken)["correct"] == 0
    g = prepare_workload("gsm8k", tokenizer_dir=model_dir)
    assert all(score(g, p, p.reference["answer"])["correct"] for p in g.prompts)
    assert not any(score(g, p, p.reference["answer"] + "1")["correct"] for p in g.prompts)
    m = prepare_workload("math500", tokenizer_dir=model_dir)
    assert all(score(m, p, f"so \\boxed{{{p.reference['answer']}}}")["correct"] for p in m.prompts)
    assert not any(score(m, p, "so \\boxed{-1}")["correct"] for p in m.prompts)


def test_truncation_keeps_only_the_first_answer(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    g = prepare_workload("gsm8k", tokenizer_dir=model_dir, sample_size=1)
    p = g.prompts[0]
    gold = p.reference["answer"].split("####")[-1].strip().replace(",", "")
    assert score(g, p, f" It is {gold}.\nQuestion: A boy has 3 cats.\nAnswer: 3")["correct"]


def test_humaneval_program_from_chat_code_block(data_dir: Path, small_suites: Path, model_dir: Path) -> None:
    he = prepare_workload("humaneval", tokenizer_dir=model_dir, sample_size=1)
    p = he.prompts[0]
    n = int(p.id.split("/")[1])
    answer = f"Here you go:\n```python\ndef f{n}(x):\n    return x + {n}\n```\nDone."
    assert score(he, p, answer)["correct"]
    assert "check(f" in humaneval_program(p, answer, [])


def test_needle_and_scoreless_suites(model_dir: Path) -> None:
    w = prepare_workload("needle", tokenizer_dir=model_dir, context=1024)
    p = w.prompts[0]
    value = p.reference["needle_value"]
    assert score(w, p, f" {value}")["correct"] and score(w, p, f"It is {value[:3]},{value[3:]}.")["correct"]
    assert not score(w, p, f"{value}9")["correct"]
    pp = prepare_workload("pp520", tokenizer_dir=model_dir)
    with pytest.raises(UserError, match="no scoring"):
        score(pp, pp.prompts[0], "x")


def _real(suite: str, model_dir: Path) -> PreparedWorkload:
    rows = {"humaneval": 164, "gsm8k": 1319, "math500": 500}[suite]
    return prepare_workload(suite, tokenizer_dir=model_dir, sample_size=rows)


@needs_shared
def test_real_gsm8k_and_math500_gold_score_100(model_dir: Path) -> None:
    g = _real("gsm8k", model_dir)
    assert aggregate(score_all(g, {p.id: p.reference["answer"] for p in g.prompts}))["accuracy"] == 1.0
    m = _real("math500", model_dir)
    solutions = read_jsonl(SHARED / "math500" / "test.jsonl")
    outs = {p.id: solutions[int(p.id.rsplit("/", 1)[1])]["solution"] for p in m.prompts}
    assert aggregate(score_all(m, outs))["accuracy"] == 1.0  # the worked solutions' last \boxed{} is the answer
    wrong = {p.id: f"\\boxed{{{p.reference['answer']}+1}}" for p in m.prompts}
    assert aggregate(score_all(m, wrong))["correct"] == 0


def _humaneval_sample(model_dir: Path, k: int | None) -> list[Prompt]:
    prompts = _real("humaneval", model_dir).prompts
    return prompts if k is None else random.Random(0).sample(prompts, k)


@needs_shared
def test_real_humaneval_canonical_solutions_pass_sample(model_dir: Path) -> None:
    w = _real("humaneval", model_dir)
    sample = _humaneval_sample(model_dir, 24)
    assert aggregate(score_all(w, {p.id: p.reference["canonical_solution"] for p in sample}))["accuracy"] == 1.0
    # corrupted: the body replaced by a wrong constant return
    bad = score_all(w, {p.id: "    return None\n" for p in sample})
    assert aggregate(bad)["correct"] == 0


@needs_shared
@pytest.mark.slow
def test_real_humaneval_all_164_canonical_solutions_pass(model_dir: Path) -> None:
    w = _real("humaneval", model_dir)
    result = score_all(w, {p.id: p.reference["canonical_solution"] for p in w.prompts})
    failed = {k: v["error"] for k, v in result.items() if not v["correct"]}
    assert not failed
