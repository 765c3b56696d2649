"""`lucebench models`: synthetic checkpoints, hub downloads, the named shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from lucebench.cli import app
from lucebench.errors import UserError

models_app = typer.Typer(help="Model checkpoints: synthesise random-weight ones, fetch real ones.",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("synth")
def synth(
    out: Path = typer.Option(..., "--out", help="folder to write the checkpoint into"),
    shape: Optional[str] = typer.Option(None, "--shape", help="named shape (see `lucebench models shapes`)"),
    config: Optional[Path] = typer.Option(None, "--config", help="a Hugging Face config.json instead of a shape"),
    seed: int = typer.Option(0, "--seed", help="random seed: same seed, same bytes"),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32"),
    layout: str = typer.Option("text", "--layout",
                               help="text (Qwen3_5ForCausalLM keys) or multimodal (model.language_model.* keys)"),
    shard_gb: float = typer.Option(4.0, "--shard-gb", min=0.001, help="largest safetensors shard, in GB"),
    force: bool = typer.Option(False, "--force", help="replace the checkpoint already in --out"),
    draft_for: Optional[Path] = typer.Option(None, "--draft-for",
                                             help="a target checkpoint folder: write a random DFlash draft for it "
                                                  "in the published (z-lab) layout instead"),
    fmt: str = typer.Option("hf", "--format",
                            help="hf (safetensors, Hugging Face layout) or gguf (a llama.cpp qwen35 file, "
                                 "quantised as --quant, written directly)"),
    quant: str = typer.Option("q4_k_m", "--quant", help="with --format gguf: q4_k_m or q8_0 (llama.cpp's recipes)"),
) -> None:
    """Write a random-weight checkpoint in Hugging Face layout that transformers loads, a llama.cpp GGUF
    (--format gguf), or a DFlash draft."""
    from lucebench.models.shapes import get_shape, shape_from_config
    from lucebench.models.synth import synthesize

    if draft_for is not None and (shape is not None or config is not None):
        raise UserError("--draft-for takes the draft's shape from the target: give no --shape or --config")
    if out.is_file() or (out.is_dir() and any(out.iterdir()) and not force):
        what = "a model" if (out / "config.json").is_file() else "files"
        raise UserError(f"already holds {what}; refusing to replace it", where=f"--out {out}",
                        hint="choose an empty or new folder, or pass --force to replace what is there")

    if fmt not in ("hf", "gguf"):
        raise UserError(f"unknown format {fmt!r}", where="--format", hint="hf or gguf")
    if draft_for is not None:
        if fmt != "hf":
            raise UserError("a DFlash draft is written in Hugging Face layout", where="--format",
                            hint="leave --format out; `lucebench models convert-draft` then writes it as a GGUF")
        if layout != "text":
            raise UserError("a DFlash draft has one layout", where="--layout", hint="leave --layout out")
        _synth_draft(draft_for, out, seed=seed, dtype=dtype)
        return
    if (shape is None) == (config is None):
        raise UserError("give exactly one of --shape NAME, --config FILE or --draft-for TARGET_DIR")
    if shape is not None:
        sh = get_shape(shape)
    else:
        assert config is not None
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UserError(f"cannot read {config}: {exc.strerror}", where="--config") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"not JSON: {exc}", where=str(config)) from None
        if not isinstance(cfg, dict):
            raise UserError("a config must be a JSON object", where=str(config))
        sh = shape_from_config(cfg, name=config.stem, where=str(config))
    console = Console(stderr=True)
    if fmt == "gguf":
        _synth_gguf(sh, out, quant=quant, seed=seed, console=console)
        return
    with console.status(f"writing {sh.name}") as status:
        def progress(name: str, done: int, total: int) -> None:
            status.update(f"writing {sh.name}: {done / 1e9:.2f} / {total / 1e9:.2f} GB ({name})")

        result = synthesize(sh, out, seed=seed, dtype=dtype, layout=layout,
                            shard_bytes=int(shard_gb * 1e9), progress=progress)
    console.print(f"wrote {sh.name} ({result.n_params:,} parameters, {result.weight_bytes / 1e9:.2f} GB {dtype}, "
                  f"{layout} layout) to {out} in {result.seconds:.1f} s")


def _synth_gguf(sh, out: Path, *, quant: str, seed: int, console: Console) -> None:
    from lucebench.models.gguf_synth import synthesize_gguf

    with console.status(f"writing {sh.name} ({quant} GGUF)") as status:
        def progress(name: str, done: int, total: int) -> None:
            status.update(f"writing {sh.name}: {done / 1e9:.2f} / {total / 1e9:.2f} GB ({name})")

        result = synthesize_gguf(sh, out, quant=quant, seed=seed, progress=progress)
    mix = ", ".join(f"{n} {t}" for t, n in sorted(result.types.items()))
    console.print(f"wrote SYNTHETIC {sh.name} ({result.n_params:,} parameters, {result.weight_bytes / 1e9:.2f} GB "
                  f"{quant}: {mix} tensors) to {result.path} in {result.seconds:.1f} s")


def _synth_draft(target: Path, out: Path, *, seed: int, dtype: str) -> None:
    from lucebench.models.dflash_draft import synthesize_draft

    result = synthesize_draft(target, out, seed=seed, dtype=dtype)
    layout = f"the sizes of {result.published}" if result.published else "sizes from the target"
    Console(stderr=True).print(f"wrote a DFlash draft for {target} ({layout}; {result.n_params:,} parameters, "
                               f"{result.weight_bytes / 1e9:.2f} GB {dtype}) to {out} in {result.seconds:.1f} s")


@models_app.command("convert-draft")
def convert_draft(
    src: Path = typer.Argument(..., help="a DFlash draft folder in the z-lab layout (config.json + *.safetensors)"),
    out: Path = typer.Argument(..., help="the GGUF file to write"),
    wtype: str = typer.Option("bf16", "--type",
                              help="the matrices' type: bf16 (exact for z-lab's BF16 drafts), f16, f32 or q8_0; "
                                   "norms stay f32"),
    force: bool = typer.Option(False, "--force", help="replace OUT if it exists"),
) -> None:
    """Write a DFlash draft as a GGUF file in Lucebox's layout (architecture qwen35-dflash-draft), which
    lucebench-dflash --draft and Lucebox's server both load."""
    from lucebench.models.dflash_gguf import convert_draft as convert

    if out.suffix != ".gguf":
        raise UserError("the output is a GGUF file", where=str(out), hint="name it *.gguf")
    if out.exists() and not force:
        raise UserError("already exists; refusing to replace it", where=str(out), hint="pass --force to replace it")
    result = convert(src, out, wtype=wtype)
    mix = ", ".join(f"{n} {t}" for t, n in sorted(result.types.items()))
    Console(stderr=True).print(f"wrote {result.path} ({result.n_params:,} parameters, {result.file_bytes / 1e6:.1f} MB; "
                               f"{mix} tensors) in {result.seconds:.1f} s")


@models_app.command("fetch")
def fetch(
    repo_id: str = typer.Argument(..., help="hub repository, e.g. Qwen/Qwen3.5-0.8B"),
    revision: Optional[str] = typer.Option(None, "--revision", help="branch, tag or commit"),
    include: Optional[list[str]] = typer.Option(None, "--include",
                                                help="only files matching this glob (repeatable), e.g. one GGUF"),
) -> None:
    """Download a model (or some of its files) into the standard Hugging Face cache."""
    from lucebench.models.resolve import fetch_model

    path = fetch_model(repo_id, revision, include)
    print(path)


@models_app.command("shapes")
def shapes(as_json: bool = typer.Option(False, "--json", help="print the shapes' configs as JSON")) -> None:
    """List the named shapes `models synth --shape` accepts."""
    from lucebench.models.shapes import SHAPES
    from lucebench.models.weights import n_params

    if as_json:
        print(json.dumps({n: {"config": s.config, "special_ids": s.special_ids, "source": s.source}
                          for n, s in SHAPES.items()}, indent=2))
        return
    table = Table("shape", "arch", "layers", "hidden", "vocab", "params", "source")
    for name, s in SHAPES.items():
        c = s.config
        table.add_row(name, s.arch, str(c["num_hidden_layers"]), str(c["hidden_size"]), str(c["vocab_size"]),
                      f"{n_params(c) / 1e6:,.1f} M", s.source)
    Console().print(table)
