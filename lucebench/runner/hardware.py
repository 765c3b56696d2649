"""Which backend a run uses, and whether this machine is the one the config asks for."""

from __future__ import annotations

from typing import Any

from lucebench.config.schema import Config
from lucebench.errors import UserError
from lucebench.results.schema import Environment


def resolve_backend(config: Config) -> str:
    """The config's backend, or the detected one for `auto` (cuda, hip or cpu)."""
    if config.backend != "auto":
        return config.backend
    from lucebench.engines.detect import detect_backend

    return detect_backend()


def check_hardware(config: Config, backend: str, env: Environment) -> None:
    """Refuse a GPU config on a machine without that GPU, before anything is built or measured."""
    if backend == "cuda" and not env.gpus:
        raise UserError(f"config {config.name!r} needs an NVIDIA GPU (backend: cuda) but none was found "
                        "through NVML", hint="run a CPU config such as configs/cpu-smoke.yaml, or check the driver "
                        "with nvidia-smi")
    if backend == "hip" and not env.rocm_version:
        raise UserError(f"config {config.name!r} needs an AMD GPU (backend: hip) but no ROCm installation was found")
    if config.gpu is None or backend == "cpu":
        return
    by_index = {g.index: g for g in env.gpus}
    for index in config.matrix.gpu or config.gpu.devices:
        gpu = by_index.get(index)
        if backend == "cuda" and gpu is None:
            raise UserError(f"GPU {index} does not exist (found {len(env.gpus)})", where="config gpu.devices")
        if gpu is None:
            continue
        if config.gpu.name and config.gpu.name.lower() not in gpu.name.lower():
            raise UserError(f"config expects a GPU named like {config.gpu.name!r}, GPU {index} is {gpu.name!r}",
                            where="config gpu.name", hint="use the config for this card, or edit gpu.name")
        if config.gpu.arch and gpu.compute_capability and config.gpu.arch != gpu.compute_capability.replace(".", ""):
            raise UserError(f"config expects compute capability {config.gpu.arch}, GPU {index} has "
                            f"{gpu.compute_capability}", where="config gpu.arch")


def add_memory_bandwidth(env: Environment, devices: list[int], console: Any = None) -> None:
    """Fill each used GPU's memory bandwidth for the roofline: measured where possible, else the datasheet."""
    if not devices:
        return
    from lucebench.measure import bandwidth

    for gpu in env.gpus:
        if gpu.index in devices and gpu.memory_bandwidth_bytes_s is None:
            if console is not None:
                console.log(f"measuring device copy bandwidth of GPU {gpu.index}")
            found = bandwidth.memory_bandwidth(gpu.index, gpu.name)
            if found is not None:
                gpu.memory_bandwidth_bytes_s, gpu.memory_bandwidth_source = found.bytes_per_s, found.source
