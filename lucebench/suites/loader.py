"""`prepare_workload`: a suite resolved against one model's tokenizer and one cell's parameters.

Everything an engine must do identically is decided here (rows, text, token ids, n_gen, stop policy),
so every engine of a comparison receives the same PreparedWorkload.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebench.errors import UserError
from lucebench.suites.base import PreparedWorkload, Prompt
from lucebench.suites.datasource import LoadedRows, load_rows
from lucebench.suites.formats import build_prompt, format_name, parse_format_override, render_template
from lucebench.suites.needle import needle_prompts
from lucebench.suites.registry import resolve_suite
from lucebench.suites.selection import select_indices
from lucebench.suites.spec import DatasetSource, SuiteSpec
from lucebench.suites.synthetic import pp_prompt, tg_prompt
from lucebench.suites.tokenization import ModelTokenizer, load_tokenizer


def prepare_workload(suite: str, *, tokenizer_dir: Path, n_gen: int | None = None, context: int | None = None,
                     max_prompt_tokens: int | None = None, sample_size: int | None = None,
                     stop: str | None = None, prompt_format: str | None = None) -> PreparedWorkload:
    """Resolve `suite` (a name from suites/ or a path to a suite YAML) for the model in `tokenizer_dir`.

    Overrides, all optional: `n_gen` (tokens per request, first included), `context` (synthetic: prompt
    tokens / tg depth; needle: the one length to build), `max_prompt_tokens` (the tighter of this and the
    suite's limit applies; longer prompts are skipped and listed), `sample_size` (dataset rows; needle: cases per length),
    `stop` ("fixed" | "natural"), `prompt_format` ("raw" | "chat" | "chat-thinking" | "chat-nothinking").
    """
    spec = resolve_spec(suite, n_gen=n_gen, stop=stop, prompt_format=prompt_format, sample_size=sample_size)
    tok = load_tokenizer(tokenizer_dir)
    limits = [v for v in (spec.max_prompt_tokens, max_prompt_tokens) if v is not None]
    limit = min(limits) if limits else None
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise UserError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}")
    if context is not None and context < 1:
        raise UserError(f"context must be at least 1 token, got {context}", where=f"suite {spec.name}")
    common: dict[str, Any] = {
        "suite": spec.name, "suite_version": spec.version, "kind": spec.kind, "n_gen": spec.n_gen,
        "ignore_eos": spec.stop == "fixed", "phase": spec.phase, "eos_ids": list(tok.eos_ids),
        "scorer": spec.scoring.method if spec.scoring else None,
        "scoring": spec.scoring.model_dump() if spec.scoring else {}, "tokenizer_sha256": tok.sha256,
        "max_prompt_tokens": limit}
    if spec.kind == "dataset":
        if context is not None:
            raise UserError("the context parameter applies to synthetic and needle suites only",
                            where=f"suite {spec.name}", hint="leave context unset for dataset suites")
        w = _dataset_workload(spec, tok, common)
    elif spec.kind == "synthetic":
        w = _synthetic_workload(spec, tok, common, context)
    else:
        w = _needle_workload(spec, tok, common, context)
    _skip_long(w, limit)
    return w


def resolve_spec(suite: str, *, n_gen: int | None = None, stop: str | None = None, prompt_format: str | None = None,
                 sample_size: int | None = None) -> SuiteSpec:
    """The suite's definition with the cell's overrides applied (validated like prepare_workload's)."""
    spec = resolve_suite(suite).spec
    update: dict[str, Any] = {}
    if n_gen is not None:
        if n_gen < 1:
            raise UserError(f"n_gen must be at least 1, got {n_gen}", where=f"suite {spec.name}")
        update["n_gen"] = n_gen
    if stop is not None:
        if stop not in ("fixed", "natural"):
            raise UserError(f"unknown stop policy {stop!r}", where=f"suite {spec.name}",
                            hint="fixed (ignore EOS, exactly n_gen: speed parity) or natural (stop at EOS: accuracy)")
        update["stop"] = stop
    if prompt_format is not None:
        if spec.kind == "synthetic":
            raise UserError("synthetic suites have no prompt format", where=f"suite {spec.name}")
        update["prompt"] = parse_format_override(prompt_format, spec.prompt)
    if sample_size is not None:
        if spec.kind == "synthetic":
            raise UserError("sample_size applies to dataset and needle suites only", where=f"suite {spec.name}")
        if sample_size < 1:
            raise UserError(f"sample_size must be at least 1, got {sample_size}", where=f"suite {spec.name}")
        if spec.kind == "needle":  # the cases per length: case i is seeded by (seed, length, i), so the first
            assert spec.needle is not None  # N cases are the same whatever N is
            update["needle"] = spec.needle.model_copy(update={"cases_per_length": sample_size})
        else:
            update["selection"] = spec.selection.model_copy(update={"sample_size": sample_size})
    return spec.model_copy(update=update) if update else spec


def _row_id(src: DatasetSource, row: dict[str, Any], index: int) -> str:
    if src.id_field is not None:
        return str(row[src.id_field])
    return f"{src.id_prefix}{index}"


@dataclass(frozen=True)
class DatasetSelection:
    """The selected rows of a dataset suite, filled into the template but not yet tokenised."""

    loaded: LoadedRows
    row_ids: list[str]  # ids of the selected rows, in run order
    contents: list[str]  # the filled templates (raw text, or the chat user message)
    references: list[dict[str, Any]]
    n_rows: int


def select_dataset_rows(spec: SuiteSpec) -> DatasetSelection:
    """Load the suite's rows, select them, fill the template; field errors name the file and row."""
    src = spec.dataset
    if src is None:
        raise UserError(f"suite {spec.name} is not a dataset suite")
    loaded = load_rows(src, suite=spec.name)
    if src.id_field is not None:
        missing = next((i for i, r in enumerate(loaded.rows) if src.id_field not in r), None)
        if missing is not None:
            raise UserError(f"row has no id field {src.id_field!r}", where=_row_where(loaded, missing))
    ids = [_row_id(src, r, i) for i, r in enumerate(loaded.rows)]
    sel = spec.selection
    chosen = select_indices(ids, method=sel.method, seed=sel.seed, sample_size=sel.sample_size)
    contents, references = [], []
    for i in chosen:
        row = loaded.rows[i]
        values = {}
        for role, column in src.fields.items():
            if column not in row or row[column] is None:
                raise UserError(f"row {ids[i]} has no field {column!r} (role {role!r})", where=_row_where(loaded, i),
                                hint=f"the suite maps roles to columns in dataset.fields; columns here: {', '.join(row)}")
            values[role] = row[column]
        contents.append(render_template(spec.prompt.template, values, where=f"suite {spec.name}: prompt.template"))
        references.append({role: values[role] for role in src.reference})
    return DatasetSelection(loaded=loaded, row_ids=[ids[i] for i in chosen], contents=contents,
                            references=references, n_rows=len(ids))


def _dataset_workload(spec: SuiteSpec, tok: ModelTokenizer, common: dict[str, Any]) -> PreparedWorkload:
    src = spec.dataset
    assert src is not None  # guaranteed by SuiteSpec's kind check
    picked = select_dataset_rows(spec)
    prompts = []
    for row_id, content, reference in zip(picked.row_ids, picked.contents, picked.references):
        text, token_ids = build_prompt(content, spec.prompt, tok)
        prompts.append(Prompt(id=row_id, token_ids=token_ids, text=text, reference=reference))
    sel = spec.selection
    return PreparedWorkload(
        **common, prompts=prompts, dataset=src.hub_id, dataset_revision=picked.loaded.revision,
        dataset_source=picked.loaded.source, dataset_config=src.config, dataset_split=src.split,
        row_ids=list(picked.row_ids), prompt_format=format_name(spec.prompt),
        selection={"method": sel.method, "seed": sel.seed, "sample_size": sel.sample_size, "rows": picked.n_rows},
        params={"location": picked.loaded.location,
                "thinking": spec.prompt.thinking if spec.prompt.format == "chat" else None})


def _row_where(loaded: Any, index: int) -> str:
    # Local JSONL rows are lines (blank lines aside); hub rows are indices into the split.
    return f"{loaded.location}:{index + 1}" if loaded.source == "local" else f"{loaded.location} row {index}"


def _synthetic_workload(spec: SuiteSpec, tok: ModelTokenizer, common: dict[str, Any],
                        context: int | None) -> PreparedWorkload:
    syn = spec.synthetic
    assert syn is not None
    if syn.mode == "pp":
        length = context if context is not None else syn.length
        name = spec.name if context is None else f"{spec.name}@{length}"
        prompt = pp_prompt(tok, name=name, sentence=syn.text, length=length)
        depth = None
        params = {"mode": "pp", "length": length, "context": context}
    else:
        depth = context if context is not None else syn.context
        name = spec.name if context is None else f"{spec.name}@d{depth}"
        prompt = tg_prompt(tok, name=name, sentence=syn.text, context=depth)
        params = {"mode": "tg", "length": spec.n_gen - 1, "context": depth}
    return PreparedWorkload(**common, prompts=[prompt], depth=depth, prompt_format="synthetic",
                            row_ids=[prompt.id], params=params)


def _needle_workload(spec: SuiteSpec, tok: ModelTokenizer, common: dict[str, Any],
                     context: int | None) -> PreparedWorkload:
    nd = spec.needle
    assert nd is not None
    lengths = [context] if context is not None else list(nd.lengths)
    prompts = needle_prompts(tok, nd, spec.prompt, suite=spec.name, lengths=lengths, cases=nd.cases_per_length)
    return PreparedWorkload(**common, prompts=prompts, prompt_format=format_name(spec.prompt),
                            row_ids=[p.id for p in prompts],
                            selection={"method": "generated", "seed": nd.seed, "cases_per_length": nd.cases_per_length},
                            params={"lengths": lengths, "depths": list(nd.depths), "context": context})


def _skip_long(w: PreparedWorkload, limit: int | None) -> None:
    """Move prompts over the limit to `skipped`, each with its reason (never dropped silently)."""
    if limit is None:
        return
    kept = []
    for p in w.prompts:
        if len(p.token_ids) > limit:
            w.skipped.append({"id": p.id, "reason": f"prompt has {len(p.token_ids)} tokens, over the limit of {limit}",
                              "n_tokens": len(p.token_ids)})
        else:
            kept.append(p)
    w.prompts = kept
