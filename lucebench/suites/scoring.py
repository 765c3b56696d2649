"""Scoring outputs against the suite's gold answers (the runner calls `score` when --score is given).

Every scorer returns a dict with at least `correct` (bool), `predicted` and `gold`; rules per suite are
in docs/suites.md. The suite's `scoring.truncate_at` cuts the output first, because with a fixed n_gen
a model keeps writing after its answer (a new question, another function).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lucebench.errors import UserError
from lucebench.suites.base import PreparedWorkload, Prompt
from lucebench.suites.mathnorm import gsm8k_gold, gsm8k_predicted, last_boxed, math_equal, numbers_equal
from lucebench.suites.sandbox import Isolation, run_program


def truncate(text: str, stops: Sequence[str]) -> str:
    """`text` up to the first occurrence of any stop string."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def score_gsm8k(prompt: Prompt, output: str, opts: dict[str, Any]) -> dict[str, Any]:
    """GSM8K: number after #### in the gold; \\boxed{}, then ####, then the last number in the output."""
    gold = gsm8k_gold(prompt.reference["answer"])
    predicted = gsm8k_predicted(truncate(output, opts.get("truncate_at", [])))
    return {"correct": numbers_equal(predicted, gold), "predicted": predicted, "gold": gold}


def score_math500(prompt: Prompt, output: str, opts: dict[str, Any]) -> dict[str, Any]:
    """MATH-500: the last \\boxed{} of the output, equivalent to the gold answer after normalisation."""
    gold = prompt.reference["answer"]
    predicted = last_boxed(truncate(output, opts.get("truncate_at", [])))
    return {"correct": math_equal(predicted, gold), "predicted": predicted, "gold": gold}


def score_needle(prompt: Prompt, output: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Needles: every answer appears in the output, a number as a whole number (not inside a longer one),
    a name as a whole word."""
    golds = [str(a) for a in prompt.reference.get("answers") or [prompt.reference["needle_value"]]]
    text = output.replace(",", "")
    found = [re.search(rf"(?<!{b}){re.escape(g)}(?!{b})", text) is not None
             for g in golds for b in [r"\d" if g.isdigit() else r"\w"]]
    return {"correct": all(found), "predicted": output.strip()[:200],
            "gold": golds[0] if len(golds) == 1 else golds, "found": found}


_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def humaneval_program(prompt: Prompt, output: str, stops: Sequence[str]) -> str:
    """The program to execute: prompt + completion (+ test + check(entry_point)).

    A chat answer with a fenced code block is used as a whole program after the original prompt (its
    function definition replaces the prompt's stub); a raw completion continues the prompt and is cut at
    the first stop sequence (a new top-level statement), as in the HumanEval paper.
    """
    ref = prompt.reference
    fence = _FENCE.search(output)
    if fence is not None and re.search(rf"def\s+{re.escape(ref['entry_point'])}\s*\(", fence.group(1)):
        body = ref["prompt"] + "\n" + fence.group(1)
    else:
        body = ref["prompt"] + truncate(output, stops)
    return f"{body}\n\n{ref['test']}\n\ncheck({ref['entry_point']})\n"


def score_humaneval(prompt: Prompt, output: str, opts: dict[str, Any], *,
                    isolation: Isolation | None = None) -> dict[str, Any]:
    """HumanEval: the completed function passes the task's tests in the sandbox."""
    program = humaneval_program(prompt, output, opts.get("truncate_at", []))
    run = run_program(program, timeout_s=float(opts.get("timeout_s", 10.0)),
                      memory_mb=int(opts.get("memory_mb", 1024)), isolation=isolation)
    last_error = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else None
    return {"correct": run.passed, "predicted": run.status, "gold": "tests pass",
            "error": None if run.passed else (last_error or run.status)[:300], "isolation": run.isolation}


_SCORERS: dict[str, Callable[..., dict[str, Any]]] = {
    "gsm8k": score_gsm8k, "math500": score_math500, "humaneval": score_humaneval, "needle": score_needle}


def score(workload: PreparedWorkload, prompt: Prompt, output_text: str) -> dict[str, Any]:
    """Score one output of `prompt` (from `workload`) against its gold answer.

    Returns {"correct": bool, "predicted": ..., "gold": ...} (+ "error", "isolation" for HumanEval).
    A suite without a scorer (pp/tg) is a UserError: there is nothing to be correct about.
    """
    if workload.scorer is None:
        raise UserError(f"suite {workload.suite} has no scoring", hint="--score applies to gsm8k, math500, humaneval and needle")
    if workload.scorer not in _SCORERS:
        raise UserError(f"unknown scorer {workload.scorer!r}", where=f"suite {workload.suite}")
    return _SCORERS[workload.scorer](prompt, output_text, workload.scoring)


def score_all(workload: PreparedWorkload, outputs: dict[str, str], *, workers: int = 4) -> dict[str, dict[str, Any]]:
    """Score many outputs (prompt id -> output text) in parallel; HumanEval runs are subprocesses."""
    by_id = {p.id: p for p in workload.prompts}
    unknown = [i for i in outputs if i not in by_id]
    if unknown:
        raise UserError(f"outputs for prompts not in the workload: {', '.join(unknown[:5])}")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pid: pool.submit(score, workload, by_id[pid], text) for pid, text in outputs.items()}
        return {pid: f.result() for pid, f in futures.items()}


def aggregate(scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Accuracy over scored prompts: {"n": ..., "correct": ..., "accuracy": fraction or None}."""
    n = len(scores)
    correct = sum(1 for s in scores.values() if s.get("correct"))
    return {"n": n, "correct": correct, "accuracy": correct / n if n else None}
