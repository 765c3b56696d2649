"""`lucebench generate`: one greedy generation through any engine, for checks and debugging."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Optional, get_args

import typer
from rich.console import Console

from lucebench.cli import app
from lucebench.engines.options import MAX_TOP_K, PFlashOptions
from lucebench.errors import EngineError, UserError


def _prompt_ids(model: Path, prompt: Optional[str], prompt_ids: Optional[str]) -> list[int]:
    if (prompt is None) == (prompt_ids is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if prompt_ids is not None:
        try:
            return [int(x) for x in prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--prompt-ids must be comma-separated integers, got {prompt_ids!r}") from None
    tokenizer_file = model / "tokenizer.json"
    if not tokenizer_file.exists():
        raise UserError("the model has no tokenizer.json to encode --prompt", where=str(model),
                        hint="use --prompt-ids instead")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_file)).encode(prompt, add_special_tokens=False).ids


@app.command()
def generate(
    engine: str = typer.Option(..., "--engine", help="ar, hf, llama.cpp, ..."),
    model: Path = typer.Option(..., "--model", help="model folder (Hugging Face layout)"),
    backend: Optional[str] = typer.Option(None, "--backend", help="cpu, cuda or hip (default: detected)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="prompt text, encoded with the model's tokenizer"),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", help="prompt token ids, e.g. 1,2,3"),
    n_gen: int = typer.Option(32, "--n-gen", min=1, help="tokens to generate"),
    device: int = typer.Option(0, "--device", help="GPU index"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (with output_ids) on stdout"),
    draft: Optional[Path] = typer.Option(None, "--draft", help="dflash: the DFlash draft (folder or GGUF)"),
    drafter: Optional[Path] = typer.Option(None, "--drafter", help="pflash: the drafter (Qwen3 folder)"),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="dflash: DDTree node budget"),
    keep_ratio: Optional[float] = typer.Option(None, "--keep-ratio", help="pflash: share of the prompt kept, in (0, 1]"),
    min_prompt_tokens: Optional[int] = typer.Option(
        None, "--min-prompt-tokens", min=0, help="pflash: compress only prompts of at least N tokens (default 32000)"),
    drafter_sparse_from: Optional[int] = typer.Option(
        None, "--drafter-sparse-from", min=0,
        help="pflash: the drafter's attention block-sparse from N tokens (default 32768; 0: dense)"),
    drafter_sparse_alpha: Optional[float] = typer.Option(
        None, "--drafter-sparse-alpha", help="pflash: the block-sparse threshold alpha, in (0, 1] (default 0.85)"),
    drafter_sparse_budget: Optional[float] = typer.Option(
        None, "--drafter-sparse-budget", help="pflash: the block-sparse budget, a fraction in (0, 1] (default 0.1)"),
    drafter_kv: Optional[str] = typer.Option(
        None, "--drafter-kv", help="pflash: the drafter's KV cache type, bf16 (default), f16, q8_0, q4_0 or f32"),
    chain: bool = typer.Option(False, "--chain", help="dflash: verify the top-1 chain instead of a tree"),
    top_k: Optional[int] = typer.Option(None, "--top-k", min=1, max=MAX_TOP_K, help="dflash: DDTree candidates per depth"),
    chain_seed: Optional[str] = typer.Option(None, "--chain-seed",
                                             help="dflash: on|off, grow the tree from the top-1 chain"),
) -> None:
    """One greedy generation (ignore EOS, exactly --n-gen tokens); speculative engines take a second model."""
    from lucebench.engines.detect import detect_backend
    from lucebench.engines.registry import ENGINE_TYPES, LaunchRequest
    from lucebench.runner.process import EngineProcess

    if engine not in ENGINE_TYPES:
        raise UserError(f"unknown engine {engine!r}", hint=f"engines: {', '.join(sorted(ENGINE_TYPES))}")
    engine_type = ENGINE_TYPES[engine]
    # The speculative flags, as the engine type's typed options (a flag it does not take is refused here).
    if chain_seed is not None and chain_seed not in ("on", "off"):
        raise UserError(f"--chain-seed is on or off, got {chain_seed!r}", where="--chain-seed")
    given = {"draft": draft, "drafter": drafter, "budget": budget, "keep_ratio": keep_ratio,
             "min_prompt_tokens": min_prompt_tokens, "verify": "chain" if chain else None, "top_k": top_k,
             "chain_seed": None if chain_seed is None else chain_seed == "on",
             "drafter_sparse_from": drafter_sparse_from, "drafter_sparse_alpha": drafter_sparse_alpha,
             "drafter_sparse_budget": drafter_sparse_budget, "drafter_kv": drafter_kv}
    for key, value in given.items():
        if value is not None and key not in engine_type.options:
            flag = "--chain" if key == "verify" else "--" + key.replace("_", "-")
            raise UserError(f"engine {engine!r} takes no {flag}", where=flag,
                            hint=f"{flag} is for {', '.join(sorted(n for n, t in ENGINE_TYPES.items() if key in t.options))}")
    for flag, value in (("--keep-ratio", keep_ratio), ("--drafter-sparse-alpha", drafter_sparse_alpha),
                        ("--drafter-sparse-budget", drafter_sparse_budget)):
        if value is not None and not 0 < value <= 1:
            raise UserError(f"{flag} must be in (0, 1], got {value:g}", where=flag)
    kv_types = get_args(PFlashOptions.model_fields["drafter_kv"].annotation)
    if drafter_kv is not None and drafter_kv not in kv_types:
        raise UserError(f"--drafter-kv is one of {', '.join(kv_types)}, got {drafter_kv!r}", where="--drafter-kv")
    second_key = engine_type.second_model_option
    second = given.get(second_key) if second_key else None
    if second_key is not None and second is None:
        raise UserError(f"engine {engine!r} needs --{second_key}", where=f"--{second_key}")
    if second is not None and not Path(second).exists():
        raise UserError(f"--{second_key} {second} does not exist", where=f"--{second_key}")
    reason = engine_type.unavailable()
    if reason is not None:
        raise UserError(reason, where="--engine")
    options = {k: str(v) if isinstance(v, Path) else v for k, v in given.items() if v is not None}
    if not (model / "config.json").exists() and not model.is_file():
        raise UserError("model not found (no config.json)", where=str(model),
                        hint="create one with `lucebench models synth --shape tiny --out DIR`")
    ids = _prompt_ids(model, prompt, prompt_ids)
    if not ids:
        raise UserError("the prompt is empty")
    extra: dict = {}
    if engine_type.name == "pflash" and second is not None:
        from lucebench.engines.bridge import PFlashBridge

        extra = PFlashBridge(model, Path(second)).fields(ids)  # the drafter's tokens and both offset arrays
    backend = backend or detect_backend()
    console = Console(stderr=True)
    launch = engine_type.launch(LaunchRequest(engine=engine, options=options, model_dir=model, backend=backend,  # type: ignore[arg-type]
                                              device=device, max_ctx=len(ids) + n_gen + 8, budget=budget,
                                              keep_ratio=keep_ratio, second_model_dir=second, console=console))
    # One log per invocation: a shared file's tail would show an earlier call's errors as this one's.
    fd, name = tempfile.mkstemp(prefix=f"lucebench-generate-{engine}-", suffix=".log")
    os.close(fd)
    log = Path(name)
    try:
        with EngineProcess(launch.argv, log_path=log, env=launch.env) as proc:
            proc.wait_ready(600)
            t0 = time.perf_counter()
            reply = proc.request({"type": "generate", "id": "generate", "prompt_ids": ids, "n_gen": n_gen,
                                  "ignore_eos": True, "eos_ids": [], **extra}, 600)
            reply["e2e_ms"] = (time.perf_counter() - t0) * 1e3
    except EngineError as exc:
        raise UserError(f"engine {engine} failed ({exc.kind}): {exc.message}"
                        + (f"\n{exc.stderr_tail}" if exc.stderr_tail else ""), exit_code=1,
                        hint=f"the engine's whole log of this call is {log}") from None
    log.unlink(missing_ok=True)  # kept only when the call failed
    if as_json:
        print(json.dumps({"engine": engine, "prompt_ids": ids, **{k: v for k, v in reply.items() if k != "type"}}))
        return
    console.print(f"output ids: {reply['output_ids']}")
    if (model / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        console.print(f"text: {Tokenizer.from_file(str(model / 'tokenizer.json')).decode(reply['output_ids'])!r}")
    t = reply["timing"]
    console.print(f"prefill {t['prefill_ms']:.2f} ms, decode {t['decode_ms']:.2f} ms")
