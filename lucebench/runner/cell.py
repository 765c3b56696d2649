"""Measure one cell: start the engine, warm up, repeat the suite's requests, cut energy per phase.

Repetition rules (docs/metrics.md): `warmups` untimed requests, then `repetitions` passes over the
prompts, extended while the measured time is under `min_duration_s` and, where power is measured,
while a phase's summed windows are under `min_energy_window_s` (the NVML counter updates only every
tens of milliseconds, so short windows are extended by repetition rather than reported), capped by
`max_extension_s` and the cell's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from lucebench.config.schema import Measure
from lucebench.errors import EngineError, UserError
from lucebench.results.schema import PhaseEnergy, PrefillStats, Sample, SpecStats
from lucebench.runner.power import RunPower
from lucebench.runner.process import EngineProcess
from lucebench.suites.base import PreparedWorkload, Prompt
from lucebench.suites.needle import needles_kept


@dataclass
class CellMeasurement:
    samples: list[Sample]
    phase_totals: dict[str, PhaseEnergy]
    warmups: int
    t_start_ns: int
    t_end_ns: int


class CellInterrupted(Exception):
    """Ctrl-C during a cell; carries what was measured so far so that it can be kept."""

    def __init__(self, samples: list[Sample]):
        super().__init__("interrupted")
        self.samples = samples


class CellFailed(Exception):
    """An engine failure mid-cell; carries the samples measured before it."""

    def __init__(self, error: EngineError, samples: list[Sample]):
        super().__init__(error.message)
        self.error = error
        self.samples = samples


def _request(prompt: Prompt, workload: PreparedWorkload, req_id: str,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "generate", "id": req_id, "prompt_ids": prompt.token_ids, "n_gen": workload.n_gen,
            "ignore_eos": workload.ignore_eos, "eos_ids": list(workload.eos_ids), **(extra or {})}


def _output_ids(reply: dict[str, Any], n_gen: int) -> list[int] | None:
    """The generated ids, or None where the engine cannot report them (e.g. llama-bench timings only)."""
    ids = reply.get("output_ids")
    if ids is None or (n_gen > 0 and not ids):
        return None
    return [int(i) for i in ids]


def _typed(model: type[SpecStats] | type[PrefillStats], reply: dict[str, Any], key: str) -> Any:
    """The reply's optional `spec` / `prefill` object, typed and checked; a malformed one is a protocol error."""
    raw = reply.get(key)
    if raw is None:
        return None
    try:
        obj = model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise EngineError("protocol", f"reply field {key}.{where}: {err['msg']}") from None
    problems = obj.problems()
    if problems:
        raise EngineError("protocol", f"reply field {key}: {problems[0]}")
    return obj


def _sample(reply: dict[str, Any], rep: int, prompt: Prompt, e2e_s: float, keep_ids: bool) -> Sample:
    t = reply["timing"]
    spec_stats: SpecStats | None = _typed(SpecStats, reply, "spec")
    prefill_stats: PrefillStats | None = _typed(PrefillStats, reply, "prefill")
    if prefill_stats is not None and prefill_stats.kept_ranges:
        prefill_stats.needles_kept = needles_kept(prompt.reference, prefill_stats.kept_ranges)
        if prefill_stats.needles_kept is not None:
            prefill_stats.needle_depths = [float(n["depth"]) for n in prompt.reference["needles"]]
    spec = reply.get("spec") or {}
    n_gen = int(reply.get("n_gen", len(reply.get("output_ids", []))))
    return Sample(
        rep=rep, prompt_id=prompt.id, n_prompt=int(reply.get("n_prompt", len(prompt.token_ids))), n_gen=n_gen,
        decode_steps=int(reply.get("decode_steps", max(n_gen - 1, 0))), stop=reply.get("stop"),
        prefill_s=float(t["prefill_ms"]) / 1e3, decode_s=float(t["decode_ms"]) / 1e3, e2e_s=e2e_s,
        t_prefill_start_ns=int(t["t_prefill_start_ns"]), t_prefill_end_ns=int(t["t_prefill_end_ns"]),
        t_decode_start_ns=int(t["t_decode_start_ns"]), t_decode_end_ns=int(t["t_decode_end_ns"]),
        bytes_per_token=reply.get("bytes_per_token"), peak_mem_bytes=reply.get("peak_mem_bytes"),
        draft_steps=spec.get("draft_steps"), accepted_tokens=spec.get("accepted_tokens"),
        spec=spec_stats, prefill=prefill_stats,
        output_ids=_output_ids(reply, n_gen) if keep_ids else None,
    )


def _phase_windows(samples: list[Sample]) -> dict[str, list[tuple[int, int]]]:
    return {
        "prefill": [(s.t_prefill_start_ns, s.t_prefill_end_ns) for s in samples],
        "decode": [(s.t_decode_start_ns, s.t_decode_end_ns) for s in samples if s.t_decode_end_ns > s.t_decode_start_ns],
    }


def _short_phases(samples: list[Sample], min_window_s: float, headline: str) -> list[str]:
    """Headline phases with some work whose summed windows are still shorter than the energy rule asks.

    Only the suite's headline phase is extended (both phases' for "both" would mean thousands of tg128
    repetitions to accumulate 2 s of 1-token prefills): for "both" that is decode, which dominates the
    energy of a generation workload.
    """
    wanted = {"prefill": {"prefill"}, "decode": {"decode"}, "both": {"decode"}}[headline]
    short = []
    for phase, windows in _phase_windows(samples).items():
        if phase not in wanted:
            continue
        total_s = sum(b - a for a, b in windows) / 1e9
        if windows and 0 < total_s < min_window_s:
            short.append(phase)
    return short


def measure_cell(proc: EngineProcess, workload: PreparedWorkload, measure: Measure, *, power: RunPower,
                 device: int | None, deadline: float, cell_id: str,
                 on_request: Callable[[int, int], None] | None = None,
                 request_fields: Callable[[Prompt], dict[str, Any]] | None = None) -> CellMeasurement:
    """Run warm-ups and measured repetitions on a started engine; return raw samples and phase energy.

    `request_fields(prompt)`: extra request fields an engine needs (PFlash: the drafter's tokenisation),
    computed once per prompt, before the first request, so that no repetition times it."""
    prompts = workload.prompts
    try:
        extra: dict[str, dict[str, Any]] = {p.id: request_fields(p) for p in prompts} if request_fields else {}
    except UserError as exc:  # e.g. a prompt of no text for the drafter: this cell fails, the run goes on
        raise CellFailed(EngineError("config", str(exc)), []) from None
    samples: list[Sample] = []
    t_start_ns = time.monotonic_ns()
    planned = measure.repetitions * len(prompts)
    done = 0

    def send(prompt: Prompt, req_id: str) -> tuple[dict[str, Any], float]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EngineError("timeout", f"cell timeout ({measure.timeout_s:g} s) reached")
        t0 = time.perf_counter()
        reply = proc.request(_request(prompt, workload, req_id, extra.get(prompt.id)),
                             min(measure.request_timeout_s, remaining))
        return reply, time.perf_counter() - t0

    try:
        for i in range(measure.warmups):
            send(prompts[i % len(prompts)], f"{cell_id}/warmup{i}")
        measured_s = 0.0
        extension_started: float | None = None
        rep = 0
        while True:
            for prompt in prompts:
                reply, e2e = send(prompt, f"{cell_id}/rep{rep}/{prompt.id}")
                samples.append(_sample(reply, rep, prompt, e2e, measure.keep_output_ids))
                measured_s += e2e
                done += 1
                if on_request:
                    on_request(done, max(planned, done))
            rep += 1
            if rep < measure.repetitions:
                continue
            wants_more = measured_s < measure.min_duration_s or (
                power.available and _short_phases(samples, measure.min_energy_window_s, workload.phase))
            if not wants_more:
                break
            extension_started = extension_started or time.monotonic()
            if time.monotonic() - extension_started > measure.max_extension_s:
                break
    except KeyboardInterrupt:
        raise CellInterrupted(samples) from None
    except EngineError as exc:
        raise CellFailed(exc, samples) from None

    phase_totals: dict[str, PhaseEnergy] = {}
    if power.available:
        for s in samples:
            for phase, (a, b) in (("prefill", (s.t_prefill_start_ns, s.t_prefill_end_ns)),
                                  ("decode", (s.t_decode_start_ns, s.t_decode_end_ns))):
                energy = power.energy(device, a, b)
                if energy is not None and energy.method != "unavailable":
                    s.energy[phase] = energy
        for phase, windows in _phase_windows(samples).items():
            total = power.energy_over(device, windows)
            if total is not None:
                phase_totals[phase] = total
    return CellMeasurement(samples=samples, phase_totals=phase_totals, warmups=measure.warmups,
                           t_start_ns=t_start_ns, t_end_ns=time.monotonic_ns())
