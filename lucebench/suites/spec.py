"""The suite definition file (suites/*.yaml), schema `lucebench.suite/v1`, and its strict loader.

Every knob that changes the work an engine does (rows, prompt format, n_gen, stop policy, length
limits) lives in the suite file and is versioned by `version`, so two runs of "gsm8k v1" are the same
workload. Unknown keys are errors (a typo must not silently fall back to a default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lucebench.config.yamlio import line_of, load_yaml
from lucebench.errors import UserError

SCHEMA = "lucebench.suite/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSource(_Strict):
    """Where the rows come from: the hub (through `datasets`) or a local copy with the same rows."""

    hub_id: str = Field(description="Hugging Face dataset id, e.g. openai/gsm8k")
    config: str | None = Field(None, description="hub config name, e.g. main")
    split: str = "test"
    revision: str | None = Field(None, description="pin a hub revision (commit sha); default: the newest")
    local: str = Field(description="path of the local copy relative to the data dir, e.g. gsm8k/test.jsonl")
    rows: int = Field(ge=1, description="expected row count; a different count means different data")
    id_field: str | None = Field(None, description="column holding a stable row id (else the row index)")
    id_prefix: str = Field("", description="prefix of index-based row ids, e.g. gsm8k/test/")
    fields: dict[str, str] = Field(min_length=1, description="role -> column; roles are used by the template")
    reference: list[str] = Field(default_factory=list, description="roles copied into Prompt.reference")

    @model_validator(mode="after")
    def _roles(self) -> DatasetSource:
        unknown = [r for r in self.reference if r not in self.fields]
        if unknown:
            raise ValueError(f"reference names roles not in fields: {unknown}")
        return self


class Selection(_Strict):
    """Which rows run: a deterministic shuffle with a seed, then the first `sample_size`."""

    method: Literal["shuffle", "sha256", "first"] = Field(
        "shuffle", description="shuffle: numpy PCG64 permutation(seed) = datasets' Dataset.shuffle(seed); "
        "sha256: order by sha256(seed:row id); first: file order")
    seed: int = 42
    sample_size: int | None = Field(10, ge=1, description="rows to take; null = all")


class PromptFormat(_Strict):
    """How a row becomes text: `raw` fills `template`; `chat` puts it in the model's chat template."""

    format: Literal["raw", "chat"] = "raw"
    template: str = Field("{prompt}", description="text with {role} placeholders; {{ and }} are literal braces")
    thinking: bool = Field(False, description="chat only: the template's thinking mode (enable_thinking)")
    system: str | None = Field(None, description="chat only: an optional system message")


class Synthetic(_Strict):
    """pp/tg workloads: a fixed sentence repeated, cut to an exact token count."""

    mode: Literal["pp", "tg"]
    length: int = Field(ge=1, description="pp: prompt tokens; tg: timed decode steps")
    context: int = Field(1, ge=1, description="tg only: prompt tokens before the timed decode (depth)")
    text: str = Field(min_length=1, description="the sentence that is repeated")


class Needle(_Strict):
    """Needles in a haystack: key/value sentences hidden in filler text (prose or code), asked for at the end.

    Modes: `single` (one needle, asked for), `multi` (`needles_per_case` needles with distinct keys at
    distinct depths, all asked for), `variable_tracking` (a chain: the first needle assigns a value to a
    variable, each `hop` assigns the previous variable to a new one; the question asks for every variable
    holding the value). A case passes when every answer appears in the output.
    """

    mode: Literal["single", "multi", "variable_tracking"] = "single"
    lengths: list[Annotated[int, Field(ge=256)]] = Field(min_length=1, description="prompt lengths in tokens")
    depths: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        min_length=1, description="needle depths; case i uses depths[i], multi/variable_tracking the next ones too")
    cases_per_length: int = Field(5, ge=1)
    seed: int = 42
    needle: str = Field(description="with {key} and {value} (variable_tracking: {var} and {value})")
    hop: str | None = Field(None, description="variable_tracking: with {var} and {prev}")
    question: str = Field(description="single: with {key}; multi: with {keys}; variable_tracking: with {value}")
    question_prefix: str = Field("", description="raw format: text before the question, e.g. 'Question: '")
    answer_cue: str = Field("\nAnswer:", description="raw format: text after the question")
    preamble: str = Field("", description="text before the haystack, e.g. an instruction")
    needles_per_case: int = Field(1, ge=1, le=16)
    keys: list[str] | None = Field(None, min_length=1, description="the needles' subjects; null: random letters")
    key_letters: int = Field(8, ge=3, le=32, description="length of random keys / variable names")
    value_digits: int = Field(7, ge=3, le=18)
    filler: list[str] = Field(min_length=4, description="filler pieces (sentences or code blocks), cycled")
    filler_separator: str = Field(" ", description="put before each filler piece and needle: ' ' for prose, "
                                                   "'\\n' for code (pieces are then kept verbatim)")
    random_start: bool = Field(True, description="start the filler at a random piece (else at the first)")

    @model_validator(mode="after")
    def _mode(self) -> Needle:
        if self.mode == "single" and self.needles_per_case != 1:
            raise ValueError("mode single has one needle per case")
        if self.mode != "single" and self.needles_per_case < 2:
            raise ValueError(f"mode {self.mode} needs needles_per_case >= 2")
        if self.mode == "multi" and self.needles_per_case > len(self.depths):
            raise ValueError("mode multi puts each needle at its own depth: list at least needles_per_case depths")
        if self.mode == "variable_tracking" and not self.hop:
            raise ValueError("mode variable_tracking needs a `hop` sentence")
        if self.keys is not None and self.mode == "multi" and len(set(self.keys)) < self.needles_per_case:
            raise ValueError("mode multi needs at least needles_per_case distinct keys")
        return self


class Scoring(_Strict):
    method: Literal["gsm8k", "math500", "humaneval", "needle"]
    truncate_at: list[str] = Field(default_factory=list,
                                   description="the output is cut at the first of these before extraction")
    timeout_s: float = Field(10.0, gt=0, description="humaneval: wall-clock limit per task")
    memory_mb: int = Field(1024, ge=64, description="humaneval: address-space limit per task")


class SuiteSpec(_Strict):
    """One suite file."""

    schema_: Literal["lucebench.suite/v1"] = Field(alias="schema")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    version: str = Field(min_length=1, description="bump whenever the workload changes")
    description: str = ""
    kind: Literal["dataset", "synthetic", "needle"]
    dataset: DatasetSource | None = None
    selection: Selection = Field(default_factory=Selection)
    prompt: PromptFormat = Field(default_factory=PromptFormat)
    synthetic: Synthetic | None = None
    needle: Needle | None = None
    n_gen: int = Field(ge=1, description="tokens generated per request, the first included")
    max_prompt_tokens: int | None = Field(None, ge=1, description="longer prompts are skipped and listed")
    stop: Literal["fixed", "natural"] = "fixed"
    phase: Literal["prefill", "decode", "both"] = "both"
    scoring: Scoring | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _kind_sections(self) -> SuiteSpec:
        wanted = {"dataset": self.dataset, "synthetic": self.synthetic, "needle": self.needle}
        for section, value in wanted.items():
            if section == self.kind and value is None:
                raise ValueError(f"kind {self.kind!r} needs a `{section}:` section")
            if section != self.kind and value is not None:
                raise ValueError(f"`{section}:` is only allowed with kind {section!r}")
        return self


def load_suite_file(path: Path) -> SuiteSpec:
    """Read and validate one suite file; errors name the file, line and key."""
    if not path.is_file():
        raise UserError("suite file not found", where=str(path), hint="give a suite name (lucebench datasets list) or a path")
    data, lines = load_yaml(path)
    if not isinstance(data, dict):
        raise UserError("a suite file must be a YAML mapping", where=str(path))
    return validate_suite(data, where=str(path), lines=lines)


def validate_suite(data: dict[str, Any], *, where: str, lines: dict | None = None) -> SuiteSpec:
    """Validate a parsed suite mapping; the first problem becomes a UserError naming key and line."""
    try:
        return SuiteSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        line = line_of(lines, loc) if lines else None
        place = f"{where}:{line}" if line else where
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            raise UserError(f"unknown key `{key}`", where=place,
                            hint=f"allowed here: {', '.join(allowed)}" if allowed else None) from None
        if err["type"] == "missing":
            raise UserError(f"missing key `{key}`", where=place) from None
        raise UserError(f"`{key}`: {err['msg']}", where=place) from None


def _allowed_keys(loc: tuple) -> list[str]:
    """The keys a mapping at `loc` may have, for the unknown-key hint."""
    model: type[BaseModel] | None = SuiteSpec
    for part in loc:
        if model is None or not isinstance(part, str):
            return []
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return []
        ann = field.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if model is None:
        return []
    return sorted(f.alias or name for name, f in model.model_fields.items())
