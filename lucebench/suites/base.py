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
    # --- extensions (all optional, so older constructors keep working) ---
    dataset_source: Literal["hub", "local"] | None = None  # where the rows came from this time
    dataset_config: str | None = None  # hub config, e.g. "main" for gsm8k
    dataset_split: str | None = None
    row_ids: list[str] = field(default_factory=list)  # the selected rows, in order, skipped ones included
    selection: dict[str, Any] = field(default_factory=dict)  # {"method", "seed", "sample_size", "rows"}
    max_prompt_tokens: int | None = None  # prompts longer than this were skipped (listed in `skipped`)
    eos_ids: list[int] = field(default_factory=list)  # the model's end-of-sequence ids, for natural stop
    scorer: str | None = None  # "gsm8k", "math500", "humaneval", "needle" or None (no accuracy)
    scoring: dict[str, Any] = field(default_factory=dict)  # scorer options, e.g. {"truncate_at": [...]}
    tokenizer_sha256: str | None = None  # of tokenizer.json: same ids need the same tokenizer
    params: dict[str, Any] = field(default_factory=dict)  # resolved parameters: length, context, thinking, ...

    @property
    def stop(self) -> Literal["fixed", "natural"]:
        """The stop policy by name: `fixed` (ignore EOS, exactly n_gen) or `natural` (stop at EOS)."""
        return "fixed" if self.ignore_eos else "natural"

    @property
    def prompt_ids(self) -> list[str]:
        """The ids of the prompts that will run, in order."""
        return [p.id for p in self.prompts]
