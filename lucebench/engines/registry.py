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
    axes: frozenset[str]  # the per-engine axes that apply: budget, kv, context
    backends: frozenset[str]
    launch: Callable[[LaunchRequest], EngineLaunch]
    options: frozenset[str] = frozenset()  # engine options the config may set
    description: str = ""


def _bundled_argv(exe: Path, req: LaunchRequest) -> list[str]:
    argv = [str(exe), "--model", str(req.model_dir), "--backend", req.backend, "--device", str(req.device),
            "--max-ctx", str(req.max_ctx)]
    if req.kv_k:
        argv += ["--kv-k", req.kv_k, "--kv-v", req.kv_v or req.kv_k]
    if req.budget is not None:
        argv += ["--budget", str(req.budget)]
    return argv


def _launch_bundled(name: str) -> Callable[[LaunchRequest], EngineLaunch]:
    def launch(req: LaunchRequest) -> EngineLaunch:
        from lucebench.engines.build import build_engine, build_info

        arch = req.options.get("arch")
        exe = build_engine(name, backend=req.backend, arch=arch, console=req.console)
        return EngineLaunch(argv=_bundled_argv(exe, req), build=build_info(name, backend=req.backend, arch=arch))
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
    gguf_type = req.options.get("gguf", "f16" if req.backend == "cpu" else "bf16")
    gguf = prepare_gguf(req.model_dir, dtype=gguf_type, build=build, console=req.console)
    argv = command(
        gguf, build=build, mode=req.options.get("mode", "server"), ctx=req.max_ctx,
        kv_k=req.kv_k or "f16", kv_v=req.kv_v or req.kv_k or "f16",
        flash_attn=bool(req.options.get("flash_attn", req.backend != "cpu")),
        n_gpu_layers=int(req.options.get("n_gpu_layers", 0 if req.backend == "cpu" else 999)),
        threads=req.options.get("threads"),
    )
    return EngineLaunch(argv=argv, build={**build.to_dict(), "gguf_type": gguf_type, "gguf": gguf.name,
                                          "mode": req.options.get("mode", "server")})


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
                   _launch_bundled("ar"), frozenset({"arch"}),
                   "lucebench's autoregressive engine (engines/): the AR baseline for speculative speedups"),
        EngineType("megakernel", "bundled", frozenset({"kv", "context"}), frozenset({"cuda"}),
                   _launch_bundled("megakernel"), frozenset({"arch"}),
                   "the whole Qwen3.5 decode step in one persistent CUDA kernel; the core's CUDA prefill"),
        EngineType("hf", "baseline", frozenset({"context"}), frozenset({"cpu", "cuda"}), _launch_hf,
                   frozenset({"dtype", "compile", "attn", "kernels"}), "PyTorch + transformers' Qwen3.5, greedy"),
        EngineType("llama.cpp", "baseline", frozenset({"kv", "context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_llamacpp, frozenset({"mode", "gguf", "flash_attn", "n_gpu_layers", "threads", "arch"}),
                   "llama.cpp at a pinned commit, built by lucebench (llama-server or llama-bench)"),
        EngineType("external", "external", frozenset({"context"}), frozenset({"cpu", "cuda", "hip"}),
                   _launch_external, frozenset({"argv"}),
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
    unknown = set(options) - engine_type.options
    if unknown:
        raise UserError(f"engine {name!r}: unknown option(s) {sorted(unknown)}",
                        hint=f"{type_name} takes: {', '.join(sorted(engine_type.options)) or 'no options'}")
    return engine_type, options
