"""The result schema `lucebench.result/v1`: what one `lucebench run` writes to results.json.

A result is self-describing: the config and its hash, the environment, the lucebench commit, and per
cell the engine build, the model files, the workload (dataset, prompt ids), every raw repetition sample
and the derived metrics (defined in docs/metrics.md, computed in lucebench.metrics).

The committed JSON Schema `lucebench/schemas/result-v1.schema.json` is generated from these models
(`python -m lucebench.results.export_schema`); a test keeps the two in step.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_ID = "lucebench.result/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------- environment
class GpuInfo(_Strict):
    index: int
    name: str
    uuid: str | None = None
    vbios: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    compute_capability: str | None = None
    power_limit_w: float | None = None
    power_limit_default_w: float | None = None
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    ecc_enabled: bool | None = None
    energy_counter: bool | None = Field(None, description="NVML total-energy counter available (Volta+)")
    memory_bandwidth_bytes_s: float | None = Field(None, description="for the roofline: bytes read + written per s")
    memory_bandwidth_source: str | None = Field(None, description="'measured: <how>' or 'datasheet: <source>'")


class Environment(_Strict):
    hostname: str | None = None
    os: str
    kernel: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    python: str
    packages: dict[str, str | None] = Field(default_factory=dict)
    driver_version: str | None = None
    cuda_version: str | None = None
    rocm_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    compilers: dict[str, str | None] = Field(default_factory=dict)
    lucebench_version: str
    lucebench_commit: str | None = None
    lucebench_dirty: bool | None = None
    power_available: bool = Field(description="False where no NVML GPU is present: power is 'unavailable', never 0")
    lb_env: dict[str, str] | None = Field(None, description="every LB_* environment variable of the harness process "
                                          "(the bundled engines' knobs: docs/engines.md), name -> value")


# ---------------------------------------------------------------------------------------------- per cell
class EngineInfo(_Strict):
    name: str
    kind: Literal["bundled", "baseline", "external"]
    version: str | None = None
    backend: str | None = None
    command: list[str] = Field(default_factory=list)
    build: dict[str, Any] = Field(default_factory=dict, description="compiler, flags, arch, source hash, commit")
    ready: dict[str, Any] = Field(default_factory=dict, description="the engine's own ready message")
    tuning: dict[str, Any] | None = Field(None, description="the bundled engine's knobs in effect (its ready line's "
                                          "engine.tuning: every knob's value, 'set': those set by LB_* variables)")
    warnings: list[str] = Field(default_factory=list, description="the engine's ready-line warnings (e.g. an LB_* "
                                "variable that is no knob and changed nothing)")


class ModelInfo(_Strict):
    name: str
    path: str | None = None
    files: dict[str, str] = Field(default_factory=dict, description="file name -> sha256")
    synthetic: bool = False
    arch: str | None = None
    dtype: str | None = None
    n_params: int | None = None


class Workload(_Strict):
    suite: str
    suite_version: str | None = None
    dataset: str | None = None
    dataset_revision: str | None = Field(None, description="hub revision or sha256 of the local file")
    prompt_ids: list[str] = Field(default_factory=list)
    prompt_format: str | None = None
    n_gen: int
    ignore_eos: bool = True
    eos_ids: list[int] = Field(default_factory=list, description="end-of-sequence ids sent with every request")
    depth: int | None = Field(None, description="context already in the KV cache before the timed phase")
    skipped_prompts: list[dict[str, Any]] = Field(default_factory=list, description="id and reason of each skipped prompt")
    identity: str | None = Field(None, description="sha256 over prompt token ids, n_gen, stop policy, depth: "
                                 "cells with equal identity did identical work")


class PowerState(_Strict):
    """The card's power setting for this cell, as requested and as read back."""

    requested_limit_w: float | None = None
    applied: bool = False
    limit_w: float | None = None
    default_limit_w: float | None = None
    idle_power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    other_gpu_processes: list[str] = Field(
        default_factory=list, description="other processes computing on the GPU before or after the cell's engine "
                                          "ran (pid, command, memory): they time-slice with it, so its numbers are "
                                          "not the card's")


class CpuLoad(_Strict):
    """What else used the machine's CPU while a CPU cell measured (lucebench.measure.cpu_load)."""

    cpu_count: int
    window_s: float = Field(description="wall time the load was read over (the cell's measurement)")
    other_cores: float = Field(description="CPU cores other processes used on average over the window")
    other_fraction: float = Field(description="other_cores / cpu_count")
    contaminated: bool = Field(description="other processes took enough of the CPU that the cell's numbers are "
                                           "not the machine's")
    loadavg_1m_before: float | None = None
    loadavg_1m_after: float | None = None
    other_processes: list[str] = Field(default_factory=list, description="the busiest other processes")


class PhaseEnergy(_Strict):
    """Energy of one phase window: from the NVML counter and from integrating power samples."""

    window_s: float
    energy_j: float | None = Field(None, description="total-energy counter difference (gross)")
    energy_integrated_j: float | None = Field(None, description="trapezoid integral of power samples (gross)")
    energy_net_j: float | None = Field(None, description="gross minus idle power x window")
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    method: Literal["counter", "integrated", "unavailable"] = "unavailable"
    note: str | None = None


SPEC_STAGES = ("draft", "tree", "verify", "commit")
PREFILL_STAGES = ("score", "select", "bridge", "target_prefill")


class SpecStats(_Strict):
    """A speculative engine's counts for one request: the reply's ``spec`` object (docs/protocol.md).

    A round is one draft + verify. Counts are of tokens committed to the output (after the cut at n_gen or
    at a stop token), the bonus token included; the first generated token comes from prefill and is in none.
    """

    draft_steps: int = Field(ge=0, description="draft+verify rounds")
    accepted_tokens: int = Field(ge=0, description="tokens the rounds committed, bonus tokens included")
    acceptance_length: float | None = Field(None, description="the engine's accepted_tokens / draft_steps")
    accepted_per_depth: list[int] = Field(
        default_factory=list, description="[d-1]: rounds in which the draft token at depth d was accepted (d = 1..)")
    al_histogram: list[int] = Field(
        default_factory=list, description="[k]: rounds that committed exactly k tokens (entry 0 is always 0)")
    time_ms: dict[str, float] = Field(
        default_factory=dict, description="summed over the request's rounds: draft, tree, verify, commit")
    forced_acceptance_length: float | None = Field(
        None, description="set by a benchmark-only forced-acceptance run (dflash --force-accept-length): the rounds "
                          "followed a fixed schedule, so the counts measure nothing about acceptance and the output "
                          "is not the model's greedy decoding")

    def problems(self) -> list[str]:
        """Inconsistencies between the counts (each round commits at least its bonus token; the histogram,
        the per-depth counts and the totals describe the same rounds)."""
        out: list[str] = []
        if self.draft_steps and self.accepted_tokens < self.draft_steps:
            out.append(f"accepted_tokens {self.accepted_tokens} < draft_steps {self.draft_steps}: each round "
                       f"commits at least one token")
        if self.draft_steps == 0 and self.accepted_tokens:
            out.append("tokens accepted without a draft step")
        if any(v < 0 for v in self.accepted_per_depth + self.al_histogram):
            out.append("negative counts")
        h = self.al_histogram
        if h:
            if h[0]:
                out.append("al_histogram[0] must be 0: a round commits at least its bonus token")
            if sum(h) != self.draft_steps:
                out.append(f"al_histogram counts {sum(h)} rounds, draft_steps is {self.draft_steps}")
            if sum(k * n for k, n in enumerate(h)) != self.accepted_tokens:
                out.append(f"al_histogram commits {sum(k * n for k, n in enumerate(h))} tokens, "
                           f"accepted_tokens is {self.accepted_tokens}")
            if self.accepted_per_depth:
                want = [sum(h[d + 1:]) for d in range(1, len(self.accepted_per_depth) + 1)]
                if list(self.accepted_per_depth) != want:
                    out.append(f"accepted_per_depth {self.accepted_per_depth} disagrees with al_histogram ({want})")
        d = self.accepted_per_depth
        if any(b > a for a, b in zip(d, d[1:])) or (d and d[0] > self.draft_steps):
            out.append("accepted_per_depth must not grow with depth nor exceed draft_steps")
        unknown = sorted(set(self.time_ms) - set(SPEC_STAGES))
        if unknown:
            out.append(f"unknown time_ms stages {unknown} (known: {', '.join(SPEC_STAGES)})")
        return out


class PrefillStats(_Strict):
    """A compressed prefill's counts for one request: the reply's ``prefill`` object (docs/protocol.md)."""

    prompt_tokens: int = Field(ge=1, description="the request's prompt, in target tokens")
    compressed: bool | None = Field(
        None, description="whether the prompt was compressed; false: shorter than the engine's min_prompt_tokens, "
                          "prefilled whole (kept = all)")
    drafter_prompt_tokens: int | None = Field(None, ge=1, description="the same prompt in the drafter's tokens")
    kept_tokens_drafter: int | None = Field(None, ge=0, description="drafter tokens kept")
    kept_tokens_target: int = Field(ge=0, description="target tokens the target prefilled (after the bridge)")
    kept_ranges: list[tuple[int, int]] = Field(
        default_factory=list, description="half-open [start, end) ranges of the request's prompt positions whose "
                                          "text was kept, ascending and disjoint")
    kept_char_ranges: list[tuple[int, int]] | None = Field(
        None, description="half-open [start, end) character spans of the prompt's text that were kept (the kept "
                          "text; a harness may re-tokenise it)")
    n_chunks: int | None = Field(None, ge=1, description="selection chunks of the drafter's prompt")
    kept_chunks: int | None = Field(None, ge=0, description="chunks kept, forced ones included")
    forced_chunks: int | None = Field(None, ge=0, description="chunks kept by rule: head, tail and anchors")
    time_ms: dict[str, float] = Field(
        default_factory=dict, description="TTFT split: score (drafter forward + scores), select, bridge, "
                                          "target_prefill")
    drafter_forward_ms: float | None = Field(
        None, ge=0, description="of time_ms.score: the drafter's forwards over the prompt (the backend's timer)")
    drafter_attention_read: float | None = Field(
        None, ge=0, le=1, description="block-sparse drafter attention (the engine's drafter_sparse_from): the share "
                                      "of the causal key tiles it read, all layers; absent when it ran dense")
    memory_bytes: dict[str, int] | None = Field(
        None, description="bytes each model holds on its backend (weights, caches, scratch): target, drafter")
    needles_kept: list[bool] | None = Field(
        None, description="harness: per needle of the prompt, whether all of its tokens lie in kept_ranges")
    needle_depths: list[float] | None = Field(None, description="harness: the depth of each needle, as needles_kept")

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.kept_tokens_drafter is not None and self.drafter_prompt_tokens is not None and (
                self.kept_tokens_drafter > self.drafter_prompt_tokens):
            out.append("kept_tokens_drafter exceeds drafter_prompt_tokens")
        prev = 0
        for a, b in self.kept_ranges:
            if not prev <= a < b <= self.prompt_tokens:
                out.append(f"kept range [{a}, {b}) is empty, out of order or outside the prompt "
                           f"({self.prompt_tokens} tokens)")
                break
            prev = b
        unknown = sorted(set(self.time_ms) - set(PREFILL_STAGES))
        if unknown:
            out.append(f"unknown time_ms stages {unknown} (known: {', '.join(PREFILL_STAGES)})")
        return out


class Sample(_Strict):
    """One measured request (after warm-up). Raw values; metrics are derived from these."""

    rep: int
    prompt_id: str
    n_prompt: int
    n_gen: int
    decode_steps: int
    stop: str | None = None
    prefill_s: float
    decode_s: float
    e2e_s: float = Field(description="harness-side wall time from request sent to reply parsed")
    t_prefill_start_ns: int
    t_prefill_end_ns: int
    t_decode_start_ns: int
    t_decode_end_ns: int
    bytes_per_token: float | None = None
    peak_mem_bytes: int | None = None
    draft_steps: int | None = None
    accepted_tokens: int | None = None
    spec: SpecStats | None = Field(None, description="speculative decoding: the reply's spec object")
    prefill: PrefillStats | None = Field(None, description="compressed prefill: the reply's prefill object")
    output_ids: list[int] | None = None
    energy: dict[str, PhaseEnergy] = Field(default_factory=dict, description="phase name -> energy")


class MetricSummary(_Strict):
    unit: str
    n: int
    median: float | None
    mean: float | None
    stddev: float | None
    min: float | None
    max: float | None
    cov: float | None = Field(None, description="coefficient of variation = stddev / mean")
    noisy: bool = False
    samples: list[float] = Field(default_factory=list)
    note: str | None = None


class CellError(_Strict):
    kind: str = Field(description="crash | timeout | oom | protocol | engine_error | build | config | skipped | interrupted")
    message: str
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str | None = None
    log_file: str | None = None


class Cell(_Strict):
    id: str = Field(description="deterministic id from the cell's parameters")
    params: dict[str, Any] = Field(description="the axis values that define this cell")
    status: Literal["ok", "failed", "skipped"]
    started: str | None = None
    finished: str | None = None
    engine: EngineInfo | None = None
    model: ModelInfo | None = None
    draft_model: ModelInfo | None = Field(None, description="the second model of a speculative cell: the dflash "
                                                            "draft or the pflash drafter, resolved and hashed")
    workload: Workload | None = None
    power: PowerState | None = None
    cpu_load: CpuLoad | None = Field(None, description="CPU cells: other processes' CPU use while it measured")
    warmups: int = 0
    samples: list[Sample] = Field(default_factory=list)
    power_trace: list[tuple[float, float]] = Field(
        default_factory=list, description="(seconds since cell start, watts), decimated, for the timeline plot")
    metrics: dict[str, MetricSummary] = Field(default_factory=dict)
    error: CellError | None = None
    log_file: str | None = None
    checks: dict[str, Any] = Field(default_factory=dict,
                                   description="scoring and losslessness details (per prompt), when run")
    environment_id: str | None = Field(
        None, description="key into Result.other_environments: the machine this cell was measured on, where a "
                          "resumed run moved to another one; null: Result.environment")


class ConfigRecord(_Strict):
    path: str | None = None
    sha256: str
    content: dict[str, Any]


class Result(_Strict):
    schema_: Literal["lucebench.result/v1"] = Field(SCHEMA_ID, alias="schema")
    run_id: str
    created: str
    updated: str | None = None
    lucebench_version: str
    metrics_version: str
    config: ConfigRecord
    environment: Environment = Field(description="the machine of the latest session (run or --resume)")
    other_environments: dict[str, Environment] = Field(
        default_factory=dict, description="earlier machines of a run resumed on another one, by key "
                                          "(Cell.environment_id names the cells measured there)")
    cells: list[Cell] = Field(default_factory=list)
    complete: bool = Field(False, description="True once every cell of the matrix has a status")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def cell(self, cell_id: str) -> Cell | None:
        return next((c for c in self.cells if c.id == cell_id), None)

    def environment_of(self, cell: Cell) -> Environment:
        """The environment a cell was measured in (an unknown key, which validation reports, gives the run's)."""
        if cell.environment_id is None:
            return self.environment
        return self.other_environments.get(cell.environment_id, self.environment)

    def move_to(self, env: Environment) -> str | None:
        """Make `env` the run's environment (a --resume). Where it is another machine or checkout
        (`machine_identity` differs), the environment of the cells measured so far is kept under a key in
        other_environments and those cells name it; returns that key, or None for the same machine, whose
        GPUs keep the memory bandwidth measured first (the roofline of every cell of the run uses it)."""
        if machine_identity(self.environment) == machine_identity(env):
            # One run, one roofline denominator: the cells measured so far used the earlier bandwidth.
            earlier = {g.index: g for g in self.environment.gpus}
            for gpu in env.gpus:
                before = earlier.get(gpu.index)
                if before is not None and before.memory_bandwidth_bytes_s is not None:
                    gpu.memory_bandwidth_bytes_s = before.memory_bandwidth_bytes_s
                    gpu.memory_bandwidth_source = before.memory_bandwidth_source
            self.environment = env
            return None
        key = environment_key(self.environment)
        self.other_environments[key] = self.environment
        for c in self.cells:
            if c.environment_id is None:
                c.environment_id = key
        self.environment = env
        return key

    def prune_environments(self) -> None:
        """Drop earlier environments that no cell names any more (their cells were measured again)."""
        used = {c.environment_id for c in self.cells}
        self.other_environments = {k: e for k, e in self.other_environments.items() if k in used}


def machine_identity(env: Environment) -> dict[str, Any]:
    """What makes two environments different machines for a result: host, GPUs (uuid, else name), driver
    and toolkit versions, and the lucebench checkout. Measured values (bandwidth, clocks) are not identity."""
    return {"hostname": env.hostname, "gpus": [[g.index, g.uuid or g.name] for g in env.gpus],
            "driver": env.driver_version, "cuda": env.cuda_version, "rocm": env.rocm_version,
            "commit": env.lucebench_commit, "dirty": env.lucebench_dirty}


def environment_key(env: Environment) -> str:
    """A short stable key for an environment: sha256 of its machine identity, 12 hex digits."""
    text = json.dumps(machine_identity(env), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
