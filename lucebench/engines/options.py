"""Typed engine options: what the config's `engines:` variants may set, per engine type, validated.

Every option that changes what an engine computes is typed here, documented in docs/config.md and
recorded in the result (the cell's `engine.build` and params). The speculative engines name their second
model by a `models:` entry (`draft` for dflash, `drafter` for pflash); their DDTree `budget` and PFlash
`keep_ratio` are defaults that the matrix axes of the same name override per cell.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lucebench.errors import UserError

# DDTree candidates per depth: a draft's distribution is a vocabulary row, but more than a few hundred
# candidates per depth never enter a budget-bounded tree (best-first pops at most `budget` of them).
MAX_TOP_K = 4096


class OptionsBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BundledOptions(OptionsBase):
    arch: str | None = Field(None, description="CUDA compute capability or HIP gfx target; default: detected")


class HfOptions(OptionsBase):
    dtype: Literal["fp32", "bf16", "fp16"] | None = Field(None, description="default: fp32 on cpu, bf16 on GPUs")
    compile: bool = False
    attn: str | None = Field(None, description="transformers attn_implementation")
    kernels: Literal["auto", "torch"] = "auto"


class LlamaCppOptions(OptionsBase):
    mode: Literal["server", "bench"] = "server"
    gguf: str | None = Field(None, description="f32, f16, bf16, q8_0, q4_k_m, ... (default f16 on cpu, bf16 on GPUs)")
    flash_attn: bool | None = None
    n_gpu_layers: int | None = Field(None, ge=0)
    threads: int | None = Field(None, ge=1)
    ubatch: int | None = Field(None, ge=32, description="prompt tokens per forward (-b and -ub); default: "
                               "llama.cpp's (-b 2048, -ub 512). A long prefill runs faster at 2048")
    arch: str | None = None


class ExternalOptions(OptionsBase):
    argv: list[str] = Field(min_length=1, description="command line; {model} {max_ctx} {device} {backend} substituted")


class DFlashOptions(BundledOptions):
    draft: str = Field(description="the `models:` entry of the DFlash draft (z-lab layout or GGUF)")
    budget: int | None = Field(None, ge=1, description="DDTree node budget; the matrix axis `budget` overrides it")
    verify: Literal["tree", "chain"] = Field("tree", description="DDTree verification, or the top-1 chain only")
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K,
                              description="DDTree candidates per depth (the tree uses min(budget, top_k)); "
                              "default: the engine's, 8")
    chain_seed: bool | None = Field(None, description="insert the top-1 chain before growing the tree best-first "
                                    "(`--chain-seed on|off`); default: the engine's, on")
    force_accept_length: float | None = Field(
        None, ge=1.0, le=16.0,
        description="BENCHMARK ONLY: rounds commit this many tokens on average on a fixed schedule instead of the "
                    "target's greedy walk (`--force-accept-length`, as vLLM's and llama.cpp's synthetic acceptance); "
                    "the output is not the model's and the cell's AL is forced: for speed against AL on synthetic "
                    "weights, reported apart from real acceptance")


class PFlashOptions(BundledOptions):
    drafter: str = Field(description="the `models:` entry of the drafter (a Qwen3 checkpoint with its tokenizer)")
    keep_ratio: float | None = Field(None, gt=0.0, le=1.0,
                                     description="share of the prompt kept; the matrix axis `keep_ratio` overrides it")
    # Upstream compresses only long prompts; a shorter one is prefilled whole (kept = all, recorded).
    min_prompt_tokens: int = Field(32000, ge=0, description="compress only prompts of at least this many target "
                                   "tokens (upstream: 32,000); 0 compresses every prompt")
    # The drafter's prefill attention (docs/engines.md, "PFlash"): block-sparse in long forwards, as upstream.
    drafter_sparse_from: int = Field(32768, ge=0, le=1 << 30,
                                     description="the drafter's attention is block-sparse (128-token key blocks) "
                                     "in forwards of at least this many drafter tokens (upstream: about 32K); "
                                     "0: dense attention always")
    drafter_sparse_alpha: float = Field(0.85, gt=0.0, le=1.0,
                                        description="block-sparse threshold: a key block is kept when its score is "
                                        "within ln(alpha) of its query tile's best (upstream: 0.85)")
    drafter_sparse_budget: float = Field(0.1, gt=0.0, le=1.0,
                                         description="of the key blocks a query tile sees, the share it may keep by "
                                         "the alpha rule beyond its 2 sink and 4 recent blocks, the best-scoring "
                                         "(0.1; 1: no bound)")
    # The cell's `kv` is the target's cache type (as llama.cpp's -ctk/-ctv); the drafter's is its own.
    drafter_kv: Literal["bf16", "f16", "q8_0", "q4_0", "f32"] = Field(
        "bf16", description="the drafter's K and V cache type (upstream's drafter runs in bf16); the `kv` axis "
        "sets the target's. f32: for reference checks")


# The option naming a second model, per option class.
SECOND_MODEL_OPTION: dict[type[OptionsBase], str] = {DFlashOptions: "draft", PFlashOptions: "drafter"}


def validate_options(model: type[OptionsBase], options: dict[str, Any], *, engine: str) -> dict[str, Any]:
    """The options as typed values (only those the config set); the first problem is a UserError naming it."""
    try:
        typed = model.model_validate(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(options)"
        allowed = ", ".join(model.model_fields)
        if err["type"] == "extra_forbidden":
            raise UserError(f"engine {engine!r}: unknown option(s) {[key]}",
                            where=f"config engines.{engine}.options", hint=f"it takes: {allowed}") from None
        if err["type"] == "missing":
            raise UserError(f"engine {engine!r} needs option `{key}`", where=f"config engines.{engine}.options",
                            hint=model.model_fields[key].description) from None
        raise UserError(f"engine {engine!r}: option `{key}`: {err['msg']}",
                        where=f"config engines.{engine}.options") from None
    return typed.model_dump(exclude_unset=True) | {
        k: getattr(typed, k) for k in model.model_fields if model.model_fields[k].is_required()}
