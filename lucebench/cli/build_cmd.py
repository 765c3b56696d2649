"""`lucebench build [ENGINE...] [--backend cpu|cuda|hip] [--arch A]`: build engines into the cache."""

from __future__ import annotations

import importlib
from typing import Optional

import typer
from rich.console import Console

from lucebench.cli import app
from lucebench.errors import UserError


def _build_llamacpp(backend: str, arch: str | None, console: Console) -> object:
    try:
        module = importlib.import_module("lucebench.baselines.llamacpp.build")
    except ModuleNotFoundError as exc:
        raise UserError("llama.cpp support is not available in this checkout (lucebench.baselines.llamacpp.build)",
                        hint="update lucebench, or build only the bundled engines: lucebench build ar") from exc
    return module.build_llamacpp(backend=backend, arch=arch, console=console)


def default_engines(backend: str) -> list[str]:
    """What `lucebench build` builds without names: every engine the default `lucebench run` uses on `backend`
    (not the speculative ones, which need a second model the default run does not have)."""
    from lucebench.engines.build import BUNDLED_ENGINES
    from lucebench.engines.registry import ENGINE_TYPES

    return [n for n in BUNDLED_ENGINES
            if backend in ENGINE_TYPES[n].backends and ENGINE_TYPES[n].second_model_option is None] + ["llama.cpp"]


@app.command("build")
def build(
    engines: Optional[list[str]] = typer.Argument(
        None, help="Engines to build: ar, megakernel (CUDA only), pflash, llama.cpp. Default: what "
                   "`lucebench run` needs on this backend: ar and llama.cpp, and megakernel on cuda."),
    backend: Optional[str] = typer.Option(None, "--backend", help="cpu, cuda or hip (default: detected)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="GPU architecture, e.g. 90 or sm_86 (default: detected)."),
) -> None:
    """Configure and build engines with CMake, cached by source hash, backend, arch and compiler."""
    from lucebench.engines.build import BUNDLED_ENGINES, build_engine
    from lucebench.engines.detect import detect_backend
    from lucebench.engines.registry import ENGINE_TYPES

    console = Console(stderr=True)
    backend = backend or detect_backend()
    names = list(engines) if engines else default_engines(backend)
    for name in names:
        if name in BUNDLED_ENGINES and backend not in ENGINE_TYPES[name].backends:
            raise UserError(f"{name} runs only on {', '.join(sorted(ENGINE_TYPES[name].backends))}: there is nothing "
                            f"to build for the {backend} backend", where="lucebench build",
                            hint=f"build it on a GPU machine (--backend cuda), or build {', '.join(default_engines(backend))}")
    for name in names:
        if name == "llama.cpp":
            result = _build_llamacpp(backend, arch, console)
            print(f"llama.cpp: {getattr(result, 'path', result)}")
            continue
        exe = build_engine(name, backend=backend, arch=arch, console=console)
        print(f"{name}: {exe}")
