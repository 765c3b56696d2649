"""Losslessness: are a candidate's tokens exactly the reference's (e.g. DFlash vs autoregressive greedy)?"""

from __future__ import annotations

from typing import Any


def _compare_one(ref: list[int], cand: list[int]) -> dict[str, Any]:
    n = min(len(ref), len(cand))
    first = next((i for i in range(n) if ref[i] != cand[i]), None)
    if first is None and len(ref) != len(cand):
        first = n  # one is a prefix of the other: they diverge where the shorter one stops
    matched = len(ref) if first is None else first
    return {"exact": first is None, "first_divergence": first, "matched_tokens": matched,
            "reference_len": len(ref), "candidate_len": len(cand),
            "matched_prefix_fraction": matched / len(ref) if ref else 1.0}


def compare_outputs(reference: dict[str, list[int]], candidate: dict[str, list[int]],
                    control: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Token-exact comparison per prompt id, plus aggregates.

    `reference`: prompt id -> output ids of the reference run (autoregressive greedy); `candidate`: the
    same for the engine under test; `control` (optional): a second reference run, compared with the first
    to show the reference itself is deterministic (if it is not, candidate mismatches prove little).
    Returns {"per_prompt": {id: {...}}, "exact_match_rate", "mean_matched_prefix_fraction", "n_prompts",
    "missing": ids absent from the candidate, "extra": ids only in the candidate, "control": {...} | None}.
    A prompt missing from the candidate counts as not matching.
    """
    per_prompt = {}
    for pid, ref in reference.items():
        if pid in candidate:
            per_prompt[pid] = _compare_one(list(ref), list(candidate[pid]))
        else:
            per_prompt[pid] = {"exact": False, "first_divergence": 0, "matched_tokens": 0,
                               "reference_len": len(ref), "candidate_len": None,
                               "matched_prefix_fraction": 0.0, "missing": True}
    n = len(per_prompt)
    result: dict[str, Any] = {
        "n_prompts": n,
        "exact_match_rate": sum(r["exact"] for r in per_prompt.values()) / n if n else None,
        "mean_matched_prefix_fraction": sum(r["matched_prefix_fraction"] for r in per_prompt.values()) / n if n else None,
        "per_prompt": per_prompt,
        "missing": sorted(pid for pid in reference if pid not in candidate),
        "extra": sorted(pid for pid in candidate if pid not in reference),
        "control": None,
    }
    if control is not None:
        ctl = compare_outputs(reference, control)
        result["control"] = {"deterministic": ctl["exact_match_rate"] == 1.0 and not ctl["extra"],
                             "exact_match_rate": ctl["exact_match_rate"],
                             "diverging": sorted(p for p, r in ctl["per_prompt"].items() if not r["exact"])}
    return result
