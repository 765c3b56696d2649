"""The data types a suite hands to the runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Prompt:
    """One request's input, tokenised by the target model's own tokenizer."""

    id: str  # stable across machines and runs, e.g. "HumanEval/17", "gsm8k/test/42", "pp520"
    token_ids: list[int]
    text: str | None = None  # the formatted prompt text; None for token-only synthetic prompts
    reference: dict[str, Any] = field(default_factory=dict)  # gold answer, tests, needle value: for scoring


@dataclass
class PreparedWorkload:
    """A suite resolved against one model's tokenizer and one cell's parameters."""

    suite: str
    suite_version: str
    kind: Literal["dataset", "synthetic", "needle"]
    prompts: list[Prompt]
    n_gen: int  # tokens generated per request, the first (from prefill) included
    ignore_eos: bool = True  # True: fixed n_gen (work parity for speed); False: natural stop (accuracy)
    depth: int | None = None  # tokens already in context before the timed phase (tg at depth d)
    dataset: str | None = None  # hub id, e.g. "openai/openai_humaneval"
    dataset_revision: str | None = None  # hub revision or "sha256:<hex>" of the local file
    prompt_format: str | None = None  # "raw", "chat", "chat-thinking", "synthetic", ...
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"id": ..., "reason": ...} per skipped prompt
    phase: Literal["prefill", "decode", "both"] = "both"  # which phase the suite's headline metric measures
