"""The YAML config: a matrix over GPU, power limit, engine, model, suite, DDTree budget, KV type and context.

Strict: unknown keys are rejected, so a typo never silently falls back to a default. docs/config.md
documents every key; configs/*.yaml are the examples.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

KV_TYPES = ("f16", "bf16", "q8_0", "q4_0")
AXES = ("engine", "model", "suite", "gpu", "power_limit_w", "budget", "kv", "context")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SynthSpec(_Strict):
    """A random-weight checkpoint with real shapes, made on first use (`lucebench models synth`)."""

    shape: str | None = None
    config: str | None = Field(None, description="path of a config.json, instead of a named shape")
    seed: int = 0
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"

    @model_validator(mode="after")
    def _one_source(self) -> SynthSpec:
        if (self.shape is None) == (self.config is None):
            raise ValueError("give exactly one of 'shape' or 'config'")
        return self


class ModelSource(_Strict):
    """Where a model comes from: a local folder or file, a hub repository in the HF cache, or synthetic."""

    path: str | None = None
    hub: str | None = None
    revision: str | None = None
    synth: SynthSpec | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("path", "hub", "synth") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of 'path', 'hub' or 'synth' (got {given or 'none'})")
        return self


class EngineVariant(_Strict):
    """A named engine configuration, e.g. `hf-compiled: {type: hf, options: {compile: true}}`."""

    type: str
    options: dict[str, Any] = Field(default_factory=dict)


class GpuExpect(_Strict):
    """What the config expects to run on; a mismatch is an error before anything runs."""

    name: str | None = Field(None, description="substring of the GPU name, e.g. 'H200' or 'RTX 3090'")
    arch: str | None = Field(None, description="compute capability without the dot, e.g. '90', '86'")
    devices: list[int] = Field(default_factory=lambda: [0])


class Measure(_Strict):
    repetitions: int = Field(5, ge=1, description="measured repetitions of the suite's prompts, after warm-up")
    warmups: int = Field(1, ge=0, description="untimed requests before measuring")
    min_duration_s: float = Field(0.0, ge=0, description="keep repeating until the measured time reaches this")
    min_energy_window_s: float = Field(2.0, ge=0, description="extend by repetition until each phase's summed "
                                       "windows reach this, so the energy counter resolves it")
    max_extension_s: float = Field(120.0, ge=0, description="cap on the time spent extending a cell")
    timeout_s: float = Field(900.0, gt=0, description="per cell: load + all requests")
    prepare_timeout_s: float = Field(3600.0, gt=0, description="the preparation before the first cell (engine "
                                     "builds, GGUF conversion), never counted in a cell's timeout_s")
    request_timeout_s: float = Field(600.0, gt=0, description="per request")
    noisy_cov: float = Field(0.05, gt=0, description="coefficient of variation above which a metric is 'noisy'")
    keep_output_ids: bool = Field(True, description="store generated token ids per sample (losslessness checks)")


class PowerPolicy(_Strict):
    allow_set_limit: bool = Field(False, description="the config may change the power limit; the command line "
                                  "must also pass --allow-power-limit")
    idle_s: float = Field(3.0, ge=0, description="seconds of idle power measured before the run")


class SuiteOverride(_Strict):
    n_gen: int | None = Field(None, ge=1)
    sample_size: int | None = Field(None, ge=1)
    max_prompt_tokens: int | None = Field(None, ge=1)
    stop: Literal["fixed", "natural"] | None = None
    prompt_format: str | None = None


class Matrix(_Strict):
    """Each list is an axis; the run is their cartesian product, less the axes an engine ignores."""

    engine: list[str] = Field(min_length=1)
    model: list[str] = Field(min_length=1)
    suite: list[str] = Field(min_length=1)
    gpu: list[int] | None = Field(None, description="device indices; default: gpu.devices")
    power_limit_w: list[float | None] = Field(default_factory=lambda: [None])
    budget: list[int | None] = Field(default_factory=lambda: [None])
    kv: list[str] = Field(default_factory=lambda: ["bf16"], description="'bf16' for K and V, or 'q8_0/q4_0' for K/V")
    context: list[int | None] = Field(default_factory=lambda: [None], description="tokens already in context (depth)")

    @field_validator("kv")
    @classmethod
    def _kv_types(cls, values: list[str]) -> list[str]:
        for value in values:
            for part in value.split("/"):
                if part not in KV_TYPES or value.count("/") > 1:
                    raise ValueError(f"KV type {value!r}: use one of {', '.join(KV_TYPES)}, or K/V such as 'q8_0/q4_0'")
        return values

    @field_validator("power_limit_w")
    @classmethod
    def _positive_watts(cls, values: list[float | None]) -> list[float | None]:
        if any(v is not None and v <= 0 for v in values):
            raise ValueError("power limits are positive watts (or null for the card's current limit)")
        return values


class Config(_Strict):
    name: str
    description: str = ""
    backend: Literal["auto", "cpu", "cuda", "hip"] = "auto"
    gpu: GpuExpect | None = None
    models: dict[str, ModelSource] = Field(min_length=1)
    engines: dict[str, EngineVariant] = Field(default_factory=dict)
    suites: dict[str, SuiteOverride] = Field(default_factory=dict, description="per-suite overrides")
    matrix: Matrix
    include: list[dict[str, Any]] = Field(default_factory=list, description="extra cells (axis -> value)")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="drop cells matching all given axes")
    measure: Measure = Field(default_factory=Measure)
    power: PowerPolicy = Field(default_factory=PowerPolicy)
    baseline: str | None = Field(None, description="engine whose cells the speedups are measured against")
    score: bool = Field(False, description="score outputs (GSM8K, Math500, HumanEval) against the gold answers")

    @model_validator(mode="after")
    def _references(self) -> Config:
        for name in self.matrix.model:
            if name not in self.models:
                raise ValueError(f"matrix.model names {name!r}, which is not under 'models' "
                                 f"(defined: {', '.join(self.models)})")
        for rule_set, label in ((self.include, "include"), (self.exclude, "exclude")):
            for i, rule in enumerate(rule_set):
                unknown = set(rule) - set(AXES)
                if unknown:
                    raise ValueError(f"{label}[{i}] has unknown axis {sorted(unknown)}; axes are {', '.join(AXES)}")
        if self.baseline is not None and self.baseline not in self.matrix.engine:
            raise ValueError(f"baseline {self.baseline!r} is not in matrix.engine {self.matrix.engine}")
        return self
