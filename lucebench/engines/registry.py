"""The engines and baselines lucebench can run, each turned into a subprocess command line.

Every entry speaks docs/protocol.md. Bundled engines are CMake executables from engines/; baselines are
Python adapters (lucebench.baselines.*) that wrap llama.cpp or transformers in the same protocol, so the
runner treats them all alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lucebench.engines.options import (
    SECOND_MODEL_OPTION,
    BundledOptions,
    DFlashOptions,
    ExternalOptions,
    HfOptions,
    LlamaCppOptions,
    OptionsBase,
    PFlashOptions,
    validate_options,
)
from lucebench.errors import UserError

GPU_BACKENDS = ("cuda", "hip")


@dataclass(frozen=True)
class LaunchRequest:
    """Everything an engine needs to start for one cell."""

    engine: str  # the config's name for it (a type or a named variant)
    options: dict[str, Any]
    model_dir: Path
    backend: Literal["cpu", "cuda", "hip"]
    device: int
    max_ctx: int
    kv_k: str | None = None
    kv_v: str | None = None
    budget: int | None = None
    keep_ratio: float | None = None
    second_model_dir: Path | None = None  # the dflash draft or the pflash drafter
    console: Any = None


@dataclass
class EngineLaunch:
    argv: list[str]
    build: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineType:
    name: str
    kind: Literal["bundled", "baseline", "external"]
    axes: frozenset[str]  # the per-engine axes that apply: budget, keep_ratio, kv, context
    backends: frozenset[str]
    launch: Callable[[LaunchRequest], EngineLaunch]
    options_model: type[OptionsBase] = BundledOptions  # the typed options the config may set
    description: str = ""
    executable: str | None = None  # a bundled engine's CMake executable (engines/), which must exist to run
    # The backends its executable computes on today, where fewer than `backends` (what configs may name).
    runs_on: frozenset[str] | None = None

    @property
    def options(self) -> frozenset[str]:
        """Names of the options the config may set."""
        return frozenset(self.options_model.model_fields)

    @property
    def second_model_option(self) -> str | None:
        """The option naming a second `models:` entry (dflash: draft, pflash: drafter), if any."""
        return SECOND_MODEL_OPTION.get(self.options_model)

    def not_on(self, backend: str) -> str | None:
        """Why this engine's cells are skipped on `backend` although configs may name it there, or None."""
        if self.runs_on is not None and backend not in self.runs_on:
            return (f"{self.name} runs on the {', '.join(sorted(self.runs_on))} backend only so far; its {backend} "
                    "cells are skipped (docs/engines.md)")
        return None

    def unavailable(self) -> str | None:
        """Why this engine cannot run from this checkout (a bundled engine without an executable), or None."""
        if self.executable is not None:
            from lucebench.engines.build import BUNDLED_ENGINES

            if self.executable not in BUNDLED_ENGINES.values():
                return (f"engine type {self.name!r} has no executable in this checkout yet: engines/ builds no "
                        f"{self.executable} (its config, options and second model are checked, but it cannot run)")
        return None


def _bundled_argv(exe: Path, req: LaunchRequest) -> list[str]:
    argv = [str(exe), "--model", str(req.model_dir), "--backend", req.backend, "--device", str(req.device),
            "--max-ctx", str(req.max_ctx)]
    if req.kv_k:
        argv += ["--kv-k", req.kv_k, "--kv-v", req.kv_v or req.kv_k]
    if req.second_model_dir is not None:
        argv += ["--draft" if "draft" in req.options else "--drafter", str(req.second_model_dir)]
    if req.budget is not None:
        argv += ["--budget", str(req.budget)]
    if req.keep_ratio is not None:
        argv += ["--keep-ratio", repr(req.keep_ratio)]
    if "min_prompt_tokens" in req.options:
        argv += ["--min-prompt-tokens", str(int(req.options["min_prompt_tokens"]))]
    if "drafter_sparse_from" in req.options:
        argv += ["--drafter-sparse-from", str(int(req.options["drafter_sparse_from"]))]
    for key in ("drafter_sparse_alpha", "drafter_sparse_budget"):
        if key in req.options:
            argv += ["--" + key.replace("_", "-"), repr(float(req.options[key]))]
    if "drafter_kv" in req.options:
        argv += ["--drafter-kv", str(req.options["drafter_kv"])]
    if req.options.get("verify") == "chain":
        argv.append("--chain")
    if req.options.get("top_k") is not None:
        argv += ["--top-k", str(req.options["top_k"])]
    if req.options.get("chain_seed") is not None:
        argv += ["--chain-seed", "on" if req.options["chain_seed"] else "off"]
    if req.options.get("force_accept_length") is not None:
        argv += ["--force-accept-length", repr(float(req.options["force_accept_length"]))]
    return argv


def _launch_bundled(name: str) -> Callable[[LaunchRequest], EngineLaunch]:
    def launch(req: LaunchRequest) -> EngineLaunch:
        from lucebench.engines.build import build_engine, build_info

        arch = req.options.get("arch")
        exe = build_engine(name, backend=req.backend, arch=arch, console=req.console)
        # What the config chose besides the build (draft, verify, top_k, ...) is recorded with the build; the
        # engine's ready line records the values it actually uses (defaults included).
        chosen = {k: v for k, v in req.options.items() if k != "arch"}
        build = build_info(name, backend=req.backend, arch=arch) | ({"options": chosen} if chosen else {})
        return EngineLaunch(argv=_bundled_argv(exe, req), build=build)
    return launch


def _launch_hf(req: LaunchRequest) -> EngineLaunch:
    from lucebench.baselines import hf

    device = "cpu" if req.backend == "cpu" else f"cuda:{req.device}"
    dtype = req.options.get("dtype", "fp32" if req.backend == "cpu" else "bf16")
    kernels = req.options.get("kernels", "auto")
    argv = hf.command(req.model_dir, device=device, dtype=dtype, compile=bool(req.options.get("compile", False)),
                      attn=req.options.get("attn"), kernels=kernels)
    return EngineLaunch(argv=argv, build={"dtype": dtype, "compile": bool(req.options.get("compile", False)),
                                          "attn": req.options.get("attn"), "kernels": kernels})


def _launch_llamacpp(req: LaunchRequest) -> EngineLaunch:
    from lucebench.baselines.llamacpp import build_llamacpp, command, prepare_gguf

    build = build_llamacpp(backend=req.backend, arch=req.options.get("arch"), console=req.console)
    if Path(req.model_dir).is_file():  # the model is a GGUF already (a published quantisation): run that file
        if req.options.get("gguf") is not None:
            raise UserError(f"engine {req.engine!r}: option gguf: {req.options['gguf']!r} converts a checkpoint "
                            f"folder, but the model is the GGUF file {Path(req.model_dir).name}",
                            where=f"config engines.{req.engine}.options.gguf", hint="leave `gguf` out")
        gguf_type, gguf = "as published", Path(req.model_dir)
    else:
        gguf_type = req.options.get("gguf", "f16" if req.backend == "cpu" else "bf16")
        gguf = prepare_gguf(req.model_dir, dtype=gguf_type, build=build, console=req.console)
    argv = command(
        gguf, build=build, mode=req.options.get("mode", "server"), ctx=req.max_ctx,
        kv_k=req.kv_k or "f16", kv_v=req.kv_v or req.kv_k or "f16",
        flash_attn=bool(req.options.get("flash_attn", req.backend != "cpu")),
        n_gpu_layers=int(req.options.get("n_gpu_layers", 0 if req.backend == "cpu" else 999)),
        threads=req.options.get("threads"), ubatch=req.options.get("ubatch"),
    )
    return EngineLaunch(argv=argv, build={**build.to_dict(), "gguf_type": gguf_type, "gguf": gguf.name,
                                          "mode": req.options.get("mode", "server"),
                                          **({"ubatch": req.options["ubatch"]} if req.options.get("ubatch") else {})})


def _launch_external(req: LaunchRequest) -> EngineLaunch:
    """Any program that speaks docs/protocol.md; {model}, {max_ctx}, {device}, {backend} are substituted."""
    argv = req.options.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise UserError(f"engine {req.engine!r}: options.argv must be a non-empty list of strings")
    values = {"model": str(req.model_dir), "max_ctx": str(req.max_ctx), "device": str(req.device),
              "backend": req.backend}
    return EngineLaunch(argv=[a.format(**values) for a in argv], build={"argv": argv})


ENGINE_TYPES: dict[str, EngineType] = {
    t.name: t
    for t in (
        EngineType("ar", "bundled", frozenset({"kv", "context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_bundled("ar"), BundledOptions,
                   "lucebench's autoregressive engine (engines/): the AR baseline for speculative speedups",
                   "lucebench-ar"),
        EngineType("megakernel", "bundled", frozenset({"kv", "context"}), frozenset({"cuda"}),
                   _launch_bundled("megakernel"), BundledOptions,
                   "the whole Qwen3.5 decode step in one persistent CUDA kernel; the core's CUDA prefill",
                   "lucebench-megakernel"),
        EngineType("dflash", "bundled", frozenset({"budget", "kv", "context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_bundled("dflash"), DFlashOptions,
                   "DFlash block-diffusion drafting with DDTree (or chain) verification; a second model: the draft",
                   "lucebench-dflash"),
        EngineType("pflash", "bundled", frozenset({"keep_ratio", "kv", "context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_bundled("pflash"), PFlashOptions,
                   "PFlash compressed prefill: a drafter scores the prompt, the target prefills what is kept",
                   # Both models on the cpu or the CUDA backend; HIP compiles the same code, not yet run on a card.
                   "lucebench-pflash", runs_on=frozenset({"cpu", "cuda"})),
        EngineType("hf", "baseline", frozenset({"context"}), frozenset({"cpu", "cuda"}), _launch_hf, HfOptions,
                   "PyTorch + transformers' Qwen3.5, greedy"),
        EngineType("llama.cpp", "baseline", frozenset({"kv", "context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_llamacpp, LlamaCppOptions,
                   "llama.cpp at a pinned commit, built by lucebench (llama-server or llama-bench)"),
        EngineType("external", "external", frozenset({"context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_external, ExternalOptions,
                   "any program speaking docs/protocol.md, given by its command line"),
    )
}


def resolve_engine(name: str, variants: dict[str, Any]) -> tuple[EngineType, dict[str, Any]]:
    """The engine type and options behind a matrix engine name (a type, or a variant from `engines:`)."""
    if name in variants:
        variant = variants[name]
        type_name, options = variant.type, dict(variant.options)
    else:
        type_name, options = name, {}
    if type_name not in ENGINE_TYPES:
        known = ", ".join(sorted(ENGINE_TYPES))
        raise UserError(f"unknown engine {type_name!r}", hint=f"engines: {known}; or define a variant under 'engines:'")
    engine_type = ENGINE_TYPES[type_name]
    return engine_type, validate_options(engine_type.options_model, options, engine=name)


def check_runnable(engine_names: list[str], variants: dict[str, Any]) -> None:
    """Before a run: every engine of the matrix can start here; else one UserError naming the first that cannot."""
    for name in dict.fromkeys(engine_names):
        engine_type, _ = resolve_engine(name, variants)
        reason = engine_type.unavailable()
        if reason is not None:
            raise UserError(reason, where=f"config matrix.engine {name!r}",
                            hint="leave it out of the matrix (or --only other cells) until the engine exists; "
                                 "`--dry-run` shows its plan")
