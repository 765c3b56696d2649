"""`lucebench datasets list` and `lucebench datasets show SUITE`: suites and their prompts as a run uses them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from lucebench.cli import app
from lucebench.suites.datasource import hub_cache_folders, local_file, read_jsonl
from lucebench.suites.formats import format_name
from lucebench.suites.identity import workload_identity
from lucebench.suites.loader import prepare_workload, resolve_spec, select_dataset_rows
from lucebench.suites.registry import list_suites
from lucebench.suites.spec import SuiteSpec

datasets_app = typer.Typer(help="Suites and their prompts, as a run would use them.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")
console = Console()
if not console.is_terminal:  # piped or captured: rich would assume 80 columns and fold every cell
    console = Console(width=160)


def _source_cell(spec: SuiteSpec) -> tuple[str, str, str]:
    """(source, rows, where) for the list table, without touching the network."""
    if spec.dataset is None:
        if spec.synthetic is not None:
            return "-", "-", "generated"
        lengths = spec.needle.lengths if spec.needle else []
        return "-", f"{spec.needle.cases_per_length}x{len(lengths)}" if spec.needle else "-", "generated"
    src = spec.dataset
    source = src.hub_id + (f" ({src.config})" if src.config else "") + f" {src.split}"
    places = []
    rows = "?"
    path = local_file(src)
    if path is not None:
        n = len(read_jsonl(path))
        rows = str(n) if n == src.rows else f"{n} (expected {src.rows})"
        places.append("local")
    if hub_cache_folders(src):
        places.append("hub cache")
    return source, rows, ", ".join(places) or "hub only"


@datasets_app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Every suite: kind, version, source, row count (where a copy is at hand), format, n_gen, stop policy."""
    refs = list_suites()
    rows: list[dict[str, Any]] = []
    for ref in refs:
        spec = ref.spec
        source, n_rows, where = _source_cell(spec)
        sample = spec.selection.sample_size if spec.kind == "dataset" else None
        rows.append({"suite": ref.name, "version": spec.version, "kind": spec.kind, "source": source,
                     "rows": n_rows, "available": where, "local_file": str(local_file(spec.dataset) or "") or None
                     if spec.dataset else None,
                     "sample": sample, "format": format_name(spec.prompt) if spec.kind != "synthetic" else "synthetic",
                     "n_gen": spec.n_gen, "stop": spec.stop, "phase": spec.phase, "file": str(ref.path)})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="lucebench suites", title_justify="left")
    for col in ("suite", "ver", "kind", "source", "rows", "copy", "n", "format", "n_gen", "stop", "phase"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("source", "copy"))
    for r in rows:
        table.add_row(*(str(r[c]) if r[c] is not None else "-" for c in
                        ("suite", "version", "kind", "source", "rows", "available", "sample", "format", "n_gen", "stop", "phase")))
    console.print(table)
    console.print("pp{N} and tg{N} (any N) are the pp / tg families; a tgN suite's n_gen is N + 1: the first token "
                  "comes from the prefill, the N after it are the timed decode steps; sources: hub through "
                  "`datasets`, else LUCEBENCH_DATA_DIR, else ../shared/datasets.", highlight=False)


def _preview(text: str | None, width: int = 90) -> str:
    if text is None:
        return "(token ids only)"
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@datasets_app.command("show")
def show_cmd(
    suite: str = typer.Argument(..., help="suite name (see `datasets list`), pp{N}/tg{N}, or a suite YAML path"),
    model: Path | None = typer.Option(None, "--model", help="model folder: tokenise with its tokenizer"),
    n: int | None = typer.Option(None, "--n", min=1, help="show only the first K prompts"),
    sample_size: int | None = typer.Option(None, "--sample-size", min=1, help="dataset rows to select"),
    prompt_format: str | None = typer.Option(None, "--format", help="raw | chat | chat-thinking | chat-nothinking"),
    n_gen: int | None = typer.Option(None, "--n-gen", min=1),
    stop: str | None = typer.Option(None, "--stop", help="fixed | natural"),
    context: int | None = typer.Option(None, "--context", min=1, help="synthetic: prompt tokens / depth; needle: length"),
    max_prompt_tokens: int | None = typer.Option(None, "--max-prompt-tokens", min=1,
                                                    help="e.g. the engine's context minus n_gen"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """The prompts of SUITE as a run would use them: ids, format, token counts (with --model), skipped ones."""
    if model is not None:
        w = prepare_workload(suite, tokenizer_dir=model, n_gen=n_gen, context=context, max_prompt_tokens=max_prompt_tokens,
                             sample_size=sample_size, stop=stop, prompt_format=prompt_format)
        info = {"suite": w.suite, "version": w.suite_version, "kind": w.kind, "dataset": w.dataset,
                "source": w.dataset_source, "revision": w.dataset_revision, "selection": w.selection,
                "format": w.prompt_format, "n_gen": w.n_gen, "stop": w.stop, "phase": w.phase, "depth": w.depth,
                "max_prompt_tokens": w.max_prompt_tokens, "eos_ids": w.eos_ids,
                "tokenizer": f"sha256:{w.tokenizer_sha256}", "identity": workload_identity(w)}
        prompts = [{"id": p.id, "tokens": len(p.token_ids), "text": p.text} for p in w.prompts]
        skipped = w.skipped
    else:
        info, prompts, skipped = _show_without_tokenizer(suite, sample_size=sample_size, prompt_format=prompt_format,
                                                          n_gen=n_gen, stop=stop, context=context)
    shown = prompts[:n] if n else prompts
    if as_json:
        print(json.dumps({**info, "prompts": shown, "skipped": skipped}, indent=2, default=str))
        return
    head = Table(show_header=False, title=f"suite {info['suite']}", title_justify="left")
    head.add_column("key", style="bold")
    head.add_column("value", overflow="fold")
    for key, value in info.items():
        if value is not None:
            head.add_row(key, _n_gen_text(value, info.get("phase")) if key == "n_gen" else str(value))
    console.print(head)
    table = Table(title=f"prompts ({len(shown)} of {len(prompts)})", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("id")
    table.add_column("tokens", justify="right")
    table.add_column("text", overflow="fold")
    for i, p in enumerate(shown):
        table.add_row(str(i), p["id"], str(p["tokens"]) if p["tokens"] is not None else "-", _preview(p["text"]))
    console.print(table)
    if skipped:
        st = Table(title=f"skipped ({len(skipped)})", title_justify="left", style="yellow")
        st.add_column("id")
        st.add_column("reason", overflow="fold")
        for s in skipped:
            st.add_row(str(s["id"]), str(s["reason"]))
        console.print(st)
    elif model is None:
        console.print("token counts and length skips need the model's tokenizer: add --model DIR", highlight=False)


def _n_gen_text(n_gen: Any, phase: Any) -> str:
    """n_gen of a decode suite in words: tgN generates N + 1 tokens, the first from the prefill, N timed decode steps."""
    if phase == "decode" and isinstance(n_gen, int) and n_gen > 1:
        return f"{n_gen} (1 token from the prefill + {n_gen - 1} timed decode steps)"
    return str(n_gen)


def _show_without_tokenizer(suite: str, *, sample_size: int | None, prompt_format: str | None, n_gen: int | None,
                            stop: str | None, context: int | None) -> tuple[dict[str, Any], list[dict[str, Any]], list]:
    """Dataset rows and templates without a tokenizer (no token counts; chat wrapping needs the model)."""
    spec = resolve_spec(suite, n_gen=n_gen, stop=stop, prompt_format=prompt_format, sample_size=sample_size)
    info: dict[str, Any] = {"suite": spec.name, "version": spec.version, "kind": spec.kind, "n_gen": spec.n_gen,
                            "stop": spec.stop, "phase": spec.phase, "max_prompt_tokens": spec.max_prompt_tokens}
    if spec.kind == "dataset":
        picked = select_dataset_rows(spec)
        fmt = format_name(spec.prompt)
        info.update({"dataset": spec.dataset.hub_id if spec.dataset else None, "source": picked.loaded.source,
                     "revision": picked.loaded.revision, "location": picked.loaded.location,
                     "selection": f"{spec.selection.method} seed {spec.selection.seed}, "
                                  f"{len(picked.row_ids)} of {picked.n_rows} rows",
                     "format": fmt + (" (user message shown; the chat template needs --model)" if fmt != "raw" else "")})
        return info, [{"id": i, "tokens": None, "text": c} for i, c in zip(picked.row_ids, picked.contents)], []
    if spec.kind == "synthetic" and spec.synthetic is not None:
        syn = spec.synthetic
        tokens = (context or syn.length) if syn.mode == "pp" else (context or syn.context)
        info.update({"format": "synthetic", "mode": syn.mode, "sentence": syn.text})
        return info, [{"id": spec.name, "tokens": tokens, "text": None}], []
    assert spec.needle is not None
    lengths = [context] if context else spec.needle.lengths
    info.update({"format": format_name(spec.prompt), "lengths": lengths, "depths": spec.needle.depths,
                 "seed": spec.needle.seed})
    from lucebench.suites.needle import make_case

    prompts = []
    for length in lengths:
        for i in range(spec.needle.cases_per_length):
            case = make_case(spec.needle, length, i)
            prompts.append({"id": f"{spec.name}/{length}/{i}", "tokens": length,
                            "text": "; ".join(f"needle at depth {d}: {t}" for d, t in zip(case.depths, case.needles))})
    return info, prompts, []


