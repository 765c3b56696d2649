"""`lucebench models train` and `lucebench models reference-al`: the trained reference models (docs/models.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from lucebench.cli.models_cmd import models_app
from lucebench.errors import UserError

_DATASETS_HELP = "the offline evaluation sets (HumanEval, GSM8K, MATH-500), see /work/shared/datasets/README.md"


def _check_datasets(path: Path) -> None:
    from lucebench.models.dflash_reference import PROMPT_FORMATS

    for rel, _, _ in PROMPT_FORMATS.values():
        if not (path / rel).is_file():
            raise UserError(f"{path / rel} not found", where="--datasets", hint=_DATASETS_HELP)


@models_app.command("train")
def train(
    out: Path = typer.Option(..., "--out", help="folder for target/, draft/, drafter/ and train_report.json"),
    recipe: str = typer.Option("reference", "--recipe", help="reference (one GPU, ~10 min) or tiny (CPU, ~1 min)"),
    datasets: Path = typer.Option(Path("../shared/datasets"), "--datasets", help=_DATASETS_HELP),
    device: str = typer.Option("cuda", "--device", help="cuda, cuda:N or cpu"),
) -> None:
    """Train the reference models: a Qwen3.5 target, its DFlash draft and a Qwen3 drafter."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UserError(f"training needs torch and transformers ({exc.name} is missing)",
                        hint="pip install 'lucebench[hf]'") from None
    from lucebench.models.train.pipeline import RECIPES, train_reference

    if recipe not in RECIPES:
        raise UserError(f"unknown recipe {recipe!r}", where="--recipe", hint=f"one of {', '.join(sorted(RECIPES))}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("no CUDA device here", where="--device", hint="use --device cpu (slow) or run on a GPU")
    _check_datasets(datasets)
    console = Console(stderr=True)
    report = train_reference(out, recipe=RECIPES[recipe], datasets_dir=datasets, device=device,
                             log=lambda m: console.print(m, highlight=False, markup=False))
    console.print(f"wrote {out} in {report['timings_s']['total']} s: target held-out loss "
                  f"{report['target']['heldout']['loss']}, drafter {report['drafter']['heldout']['loss']}")


@models_app.command("reference-al")
def reference_al(
    models: Path = typer.Option(..., "--models", help="folder holding target/ and draft/ (from `models train`)"),
    datasets: Path = typer.Option(Path("../shared/datasets"), "--datasets", help=_DATASETS_HELP),
    n_prompts: int = typer.Option(20, "--n-prompts", min=1, help="prompts per dataset (shuffle seed 42)"),
    n_gen: int = typer.Option(128, "--n-gen", min=1, help="tokens per prompt (stops early at end-of-text)"),
    out: Path = typer.Option(None, "--out", help="write the full JSON report here"),
) -> None:
    """Chain acceptance length of the reference DFlash loop (CPU, float32) and its losslessness."""
    import torch

    from lucebench.models.dflash_reference import measure_acceptance

    for sub in ("target", "draft"):
        if not (models / sub / "config.json").is_file():
            raise UserError(f"{models / sub / 'config.json'} not found", where="--models",
                            hint="a folder written by `lucebench models train`")
    _check_datasets(datasets)
    # One thread: the loop is a chain of small forwards, and extra threads only spin on a busy machine.
    torch.set_num_threads(1)
    console = Console(stderr=True)
    report = measure_acceptance(models / "target", models / "draft", datasets, n_prompts=n_prompts, n_gen=n_gen,
                                progress=lambda name, j, n, al: console.print(f"{name} {j}/{n}: AL {al:.2f}"))
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name, r in report["datasets"].items():
        print(f"{name}: AL {r['al']:.3f} over {r['rounds']} rounds, lossless {r['lossless_prompts']}/{n_prompts}")
