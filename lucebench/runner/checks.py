"""Optional per-cell checks: scoring outputs against gold answers, and losslessness against a baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lucebench.metrics.stats import summarize
from lucebench.results.schema import Cell, MetricSummary
from lucebench.suites.base import PreparedWorkload


def _first_outputs(cell: Cell) -> dict[str, list[int]]:
    """Each prompt's output ids from its first measured repetition."""
    out: dict[str, list[int]] = {}
    for s in sorted(cell.samples, key=lambda s: s.rep):
        if s.output_ids is not None:
            out.setdefault(s.prompt_id, s.output_ids)
    return out


def score_cell(cell: Cell, workload: PreparedWorkload, model_dir: Path) -> None:
    """Score each prompt's first output (decoded by the model's tokenizer); adds the `accuracy` metric."""
    from tokenizers import Tokenizer

    from lucebench.suites.scoring import score

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    outputs = _first_outputs(cell)
    details: dict[str, Any] = {}
    correct = []
    for prompt in workload.prompts:
        if prompt.id not in outputs:
            continue
        verdict = score(workload, prompt, tokenizer.decode(outputs[prompt.id], skip_special_tokens=True))
        details[prompt.id] = verdict
        correct.append(100.0 if verdict.get("correct") else 0.0)
    if correct:
        cell.metrics["accuracy"] = summarize([sum(correct) / len(correct)], "%",
                                             note=f"{int(sum(correct) / 100)} of {len(correct)} prompts correct")
        cell.checks["scores"] = details


def _until_eos(ids: list[int], eos: set[int]) -> int:
    """Length of the reference up to and including its first end-of-sequence token."""
    return next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))


def token_match(cell: Cell, baseline: Cell) -> tuple[MetricSummary, dict[str, Any]] | None:
    """Token-exact agreement of the cell's outputs with the baseline cell's, per prompt.

    Outputs are compared up to the reference's first EOS: with `ignore_eos` some engines generate past
    EOS and others (llama.cpp's server) ban end-of-generation tokens instead, so what follows an EOS is
    not the same work (docs/protocol.md).
    """
    from lucebench.suites.lossless import compare_outputs

    if any(s.spec is not None and s.spec.forced_acceptance_length is not None for s in cell.samples):
        return None  # forced acceptance (benchmark only): the outputs are not the model's, nothing to agree with
    ref, cand = _first_outputs(baseline), _first_outputs(cell)
    common = sorted(set(ref) & set(cand))
    if not common:
        return None
    eos = set(baseline.workload.eos_ids) if baseline.workload else set()
    cut = {k: _until_eos(ref[k], eos) for k in common}
    report = compare_outputs({k: ref[k][:cut[k]] for k in common}, {k: cand[k][:cut[k]] for k in common})
    rate = report.get("exact_match_rate")
    if rate is None:
        return None
    return summarize([100.0 * rate], "%", note=f"vs {baseline.id}, {len(common)} prompts"), report
