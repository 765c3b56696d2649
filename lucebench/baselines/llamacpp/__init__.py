"""The llama.cpp baseline: pinned source, CMake build, HF -> GGUF conversion, llama-bench, protocol adapter.

Public entry points (see docs/baselines.md):

* :func:`build_llamacpp` -> :class:`LlamaCppBuild` (``lucebench build llama.cpp``)
* :func:`prepare_gguf` (checkpoint folder -> cached GGUF at a dtype)
* :func:`command` (argv of the protocol adapter for the runner)
* :func:`run_llama_bench` (pp/tg/depth sweeps with per-repetition samples)
"""

from lucebench.baselines.llamacpp.adapter import command
from lucebench.baselines.llamacpp.bench import (
           BenchRecord,
           BenchRun,
           kv_type_flag,
           parse_bench_output,
           run_llama_bench,
)
from lucebench.baselines.llamacpp.build import LlamaCppBuild, LlamaCppBuildError, build_llamacpp
from lucebench.baselines.llamacpp.convert import prepare_gguf
from lucebench.baselines.llamacpp.pins import LLAMACPP_COMMIT
from lucebench.baselines.llamacpp.source import LlamaCppSource, locate_source

__all__ = [
           "LLAMACPP_COMMIT",
           "BenchRecord",
           "BenchRun",
           "LlamaCppBuild",
           "LlamaCppBuildError",
           "LlamaCppSource",
           "build_llamacpp",
           "command",
           "kv_type_flag",
           "locate_source",
           "parse_bench_output",
           "prepare_gguf",
           "run_llama_bench",
]
