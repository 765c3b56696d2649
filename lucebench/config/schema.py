"""The YAML config: a matrix over GPU, power limit, engine, model, suite, DDTree budget, KV type and context.

Strict: unknown keys are rejected, so a typo never silently falls back to a default. docs/config.md
documents every key; configs/*.yaml are the examples.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

KV_TYPES = ("f16", "bf16", "q8_0", "q4_0")
AXES = ("engine", "model", "suite", "gpu", "power_limit_w", "budget", "keep_ratio", "kv", "context")
SECOND_MODEL_OPTIONS = ("draft", "drafter")  # engine options that name a `models:` entry
MAX_POWER_LIMIT_W = 2000.0  # above any card's maximum; the card's own range is checked when the limit is applied
MAX_CONTEXT = 1 << 20
MAX_BUDGET = 4096


class LocatedError(ValueError):
    """A problem found by a validator of a whole section, with the key path it belongs to (for its line)."""

    def __init__(self, loc: tuple, message: str):
        super().__init__(message)
        self.loc = loc


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SynthSpec(_Strict):
    """A random-weight checkpoint with real shapes, made on first use (`lucebench models synth`)."""

    shape: str | None = None
    config: str | None = Field(None, description="path of a config.json, instead of a named shape")
    draft_for: str | None = Field(None, description="a `models:` entry: a random DFlash draft for that target")
    seed: int = Field(0, ge=0)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    format: Literal["hf", "gguf"] = Field("hf", description="hf: safetensors in Hugging Face layout; gguf: a "
                                          "llama.cpp qwen35 file quantised as `quant` (`models synth --format gguf`)")
    quant: Literal["q4_k_m", "q8_0"] = Field("q4_k_m", description="with format gguf: llama.cpp's recipe")

    @field_validator("shape")
    @classmethod
    def _known_shape(cls, value: str | None) -> str | None:
        from lucebench.models.shapes import shape_names

        if value is not None and value not in shape_names():
            raise ValueError(f"unknown model shape {value!r}; shapes: {', '.join(shape_names())}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> SynthSpec:
        if sum(x is not None for x in (self.shape, self.config, self.draft_for)) != 1:
            raise ValueError("give exactly one of 'shape', 'config' or 'draft_for'")
        if self.format == "gguf" and self.draft_for is not None:
            raise ValueError("a DFlash draft is written in Hugging Face layout: leave 'format' out")
        if self.format == "gguf" and "dtype" in self.model_fields_set:
            raise ValueError("a GGUF's tensor types come from 'quant': leave 'dtype' out")
        if self.format != "gguf" and "quant" in self.model_fields_set:
            raise ValueError("'quant' applies to format gguf only")
        return self


class ModelSource(_Strict):
    """Where a model comes from: a local folder or file, a hub repository in the HF cache, or synthetic."""

    path: str | None = None
    hub: str | None = None
    revision: str | None = None
    file: str | None = Field(None, description="with hub: one file of the repository, e.g. a GGUF")
    tokenizer: str | None = Field(None, description="a hub repository or folder with the tokenizer.json that "
                                  "prompts are encoded with, for a model that is a single GGUF file")
    synth: SynthSpec | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("path", "hub", "synth") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of 'path', 'hub' or 'synth' (got {given or 'none'})")
        if self.file is not None and self.hub is None:
            raise ValueError("'file' names a file of a hub repository: give it with 'hub'")
        if self.tokenizer is not None and self.synth is not None:
            raise ValueError("a synthetic model has its own tokenizer: leave 'tokenizer' out")
        return self


class EngineVariant(_Strict):
    """A named engine configuration, e.g. `hf-compiled: {type: hf, options: {compile: true}}`."""

    type: str
    options: dict[str, Any] = Field(default_factory=dict)


class GpuExpect(_Strict):
    """What the config expects to run on; a mismatch is an error before anything runs."""

    name: str | None = Field(None, description="substring of the GPU name, e.g. 'H200' or 'RTX 3090'")
    arch: str | None = Field(None, pattern=r"^[0-9]{2,3}[a-z]?$|^gfx[0-9a-f]+$",
                             description="compute capability without the dot, e.g. '90', '86' (or a gfx target)")
    devices: list[int] = Field(default_factory=lambda: [0], min_length=1)

    @field_validator("devices")
    @classmethod
    def _device_indices(cls, values: list[int]) -> list[int]:
        if any(v < 0 for v in values) or len(set(values)) != len(values):
            raise ValueError("device indices are distinct numbers from 0")
        return values


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
    prompt_format: Literal["raw", "chat", "chat-nothinking", "chat-thinking"] | None = None


class Matrix(_Strict):
    """Each list is an axis; the run is their cartesian product, less the axes an engine ignores."""

    engine: list[str] = Field(min_length=1)
    model: list[str] = Field(min_length=1)
    suite: list[str] = Field(min_length=1)
    gpu: list[int] | None = Field(None, description="device indices; default: gpu.devices")
    power_limit_w: list[float | None] = Field(default_factory=lambda: [None])
    budget: list[int | None] = Field(default_factory=lambda: [None], description="DDTree node budget (dflash)")
    keep_ratio: list[float | None] = Field(default_factory=lambda: [None], description="PFlash keep ratio (pflash)")
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
        if any(v is not None and not 0 < v <= MAX_POWER_LIMIT_W for v in values):
            raise ValueError(f"power limits are watts from 1 to {MAX_POWER_LIMIT_W:g} (or null for the card's "
                             "current limit)")
        return values

    @field_validator("gpu")
    @classmethod
    def _gpu_indices(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and (not values or any(v < 0 for v in values) or len(set(values)) != len(values)):
            raise ValueError("GPU indices are distinct numbers from 0")
        return values

    @field_validator("budget")
    @classmethod
    def _budgets(cls, values: list[int | None]) -> list[int | None]:
        if any(v is not None and not 1 <= v <= MAX_BUDGET for v in values):
            raise ValueError(f"a budget is a number of draft tokens from 1 to {MAX_BUDGET} (or null)")
        return values

    @field_validator("keep_ratio")
    @classmethod
    def _keep_ratios(cls, values: list[float | None]) -> list[float | None]:
        if any(v is not None and not 0 < v <= 1 for v in values):
            raise ValueError("a keep ratio lies in (0, 1] (or null for the engine's own)")
        return values

    @field_validator("context")
    @classmethod
    def _contexts(cls, values: list[int | None]) -> list[int | None]:
        if any(v is not None and not 0 <= v <= MAX_CONTEXT for v in values):
            raise ValueError(f"a context depth is a number of tokens from 0 to {MAX_CONTEXT} (or null)")
        return values

    @field_validator("suite")
    @classmethod
    def _known_suites(cls, values: list[str]) -> list[str]:
        for value in values:
            _check_suite(value)
        return values


def _check_suite(name: str) -> None:
    from lucebench.errors import UserError
    from lucebench.suites.registry import resolve_suite

    try:
        resolve_suite(name)
    except UserError as exc:
        raise ValueError(f"suite {name!r}: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")) from None


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
    score: bool = Field(False, description="score outputs (GSM8K, Math500, HumanEval, needles) against the "
                        "gold answers")

    @model_validator(mode="after")
    def _references(self) -> Config:
        from lucebench.engines.registry import ENGINE_TYPES

        for i, name in enumerate(self.matrix.model):
            if name not in self.models:
                raise LocatedError(("matrix", "model", i), f"{name!r} is not under 'models' "
                                   f"(defined: {', '.join(self.models)})")
        for name, variant in self.engines.items():
            if variant.type not in ENGINE_TYPES:
                raise LocatedError(("engines", name, "type"), f"unknown engine type {variant.type!r}; "
                                   f"types: {', '.join(sorted(ENGINE_TYPES))}")
            unknown = set(variant.options) - ENGINE_TYPES[variant.type].options
            if unknown:
                raise LocatedError(("engines", name, "options"), f"unknown option(s) {sorted(unknown)} for "
                                   f"{variant.type}; it takes: {', '.join(sorted(ENGINE_TYPES[variant.type].options))}")
            try:  # typed: each option's type and range
                ENGINE_TYPES[variant.type].options_model.model_validate(variant.options)
            except ValidationError as exc:
                first = exc.errors()[0]
                raise LocatedError(("engines", name, "options", *first["loc"]),
                                   f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
            for key in SECOND_MODEL_OPTIONS:
                named = variant.options.get(key)
                if named is not None and named not in self.models:
                    raise LocatedError(("engines", name, "options", key), f"{named!r} is not under 'models' "
                                       f"(defined: {', '.join(self.models)})")
        for name, source in self.models.items():
            target = source.synth.draft_for if source.synth is not None else None
            if target is not None:
                other = self.models.get(target)
                if other is None or target == name:
                    raise LocatedError(("models", name, "synth", "draft_for"), f"{target!r} is not another entry "
                                       f"under 'models' (defined: {', '.join(self.models)})")
                if other.synth is not None and other.synth.draft_for is not None:
                    raise LocatedError(("models", name, "synth", "draft_for"),
                                       f"{target!r} is itself a draft: name the target")
                if other.file is not None or (other.path or "").lower().endswith(".gguf"):
                    raise LocatedError(("models", name, "synth", "draft_for"),
                                       f"{target!r} is a GGUF file, which has no config.json to size a draft "
                                       "from: name a checkpoint folder or a synthetic target (a `synth:` GGUF "
                                       "too), or the published draft")
        for i, name in enumerate(self.matrix.engine):
            if name not in self.engines and name not in ENGINE_TYPES:
                raise LocatedError(("matrix", "engine", i), f"unknown engine {name!r}; engines: "
                                   f"{', '.join(sorted(ENGINE_TYPES))}, or a variant defined under 'engines:'")
        types = {self.engines[e].type if e in self.engines else e for e in self.matrix.engine}
        for axis, what in (("budget", "a budget"), ("keep_ratio", "a keep ratio")):
            if any(v is not None for v in getattr(self.matrix, axis)) and not any(
                    axis in ENGINE_TYPES[t].axes for t in types):
                raise LocatedError(("matrix", axis), f"no engine of matrix.engine takes {what}, so no cell "
                                   "could use these values; leave the axis out")
        for name in self.suites:
            try:
                _check_suite(name)
            except ValueError as exc:
                raise LocatedError(("suites", name), str(exc)) from None
        for rule_set, label in ((self.include, "include"), (self.exclude, "exclude")):
            for i, rule in enumerate(rule_set):
                unknown = set(rule) - set(AXES)
                if unknown:
                    raise LocatedError((label, i), f"unknown axis {sorted(unknown)}; axes are {', '.join(AXES)}")
                if "engine" in rule and rule["engine"] not in self.engines and rule["engine"] not in ENGINE_TYPES:
                    raise LocatedError((label, i, "engine"), f"unknown engine {rule['engine']!r}")
                if "model" in rule and rule["model"] not in self.models:
                    raise LocatedError((label, i, "model"), f"{rule['model']!r} is not under 'models'")
                if label == "include" and "suite" in rule:
                    try:
                        _check_suite(str(rule["suite"]))
                    except ValueError as exc:
                        raise LocatedError((label, i, "suite"), str(exc)) from None
                try:  # every other value under the rules of its matrix axis
                    Matrix.model_validate({"engine": ["x"], "model": ["x"], "suite": ["pp1"],
                                           **{k: [v] for k, v in rule.items()
                                              if k not in ("engine", "model", "suite")}})
                except ValidationError as exc:
                    first = exc.errors()[0]
                    raise LocatedError((label, i, str(first["loc"][0])),
                                       first["msg"].removeprefix("Value error, ")) from None
        if self.baseline is not None and self.baseline not in self.matrix.engine:
            raise LocatedError(("baseline",), f"{self.baseline!r} is not in matrix.engine {self.matrix.engine}")
        return self
