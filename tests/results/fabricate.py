"""Test fixtures: realistic `lucebench.result/v1` objects built in code.

`gpu_result` fabricates a multi-cell RTX 3090-like run (throughput at several power limits, DFlash
vs AR on three datasets with a budget sweep, long-context cells with two KV types, a failed and a
skipped cell), with per-repetition samples, per-phase energy and power traces; metrics are derived
from the samples the way docs/metrics.md defines them. `cpu_result` is a CPU smoke run without power.
Loaded by path from tests/conftest.py (pytest runs in importlib mode).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from lucebench.metrics import compute_cell_metrics
from lucebench.results.schema import (
    Cell,
    CellError,
    ConfigRecord,
    EngineInfo,
    Environment,
    GpuInfo,
    MetricSummary,
    ModelInfo,
    PhaseEnergy,
    PowerState,
    PrefillStats,
    Result,
    Sample,
    SpecStats,
    Workload,
)

IDLE_W = 30.0
DATASETS = {"humaneval": "openai/openai_humaneval", "gsm8k": "openai/gsm8k", "math500": "HuggingFaceH4/MATH-500"}


def _cell_id(params: dict[str, Any]) -> str:
    return hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:10]


def make_cell(rng: np.random.Generator, params: dict[str, Any], *, n_prompt: int, n_gen: int, prefill_tok_s: float,
              decode_tok_s: float, power_w: float | None, reps: int = 5, cov: float = 0.01, prompts: int = 1,
              dataset: str | None = None, al: float | None = None, bytes_per_token: float | None = None,
              bandwidth: float = 936e9, depth: int | None = None, synthetic: bool = True,
              backend: str = "cuda", keep_ratio: float | None = None, lost_needles: tuple[int, ...] = ()) -> Cell:
    """One ok cell with `reps` x `prompts` samples around the given speeds (gaussian noise of `cov`).

    `al`: a speculative cell (its `spec` counts: rounds committing floor or ceil of the AL, a stage split of
    the decode time). `keep_ratio`: a compressed prefill (its `prefill` counts: that share of the prompt kept,
    a TTFT split, and the needle of the prompts listed in `lost_needles` lost)."""
    samples: list[Sample] = []
    t = 1_000_000_000
    prompt_ids = [f"{params.get('suite')}/{i}" for i in range(prompts)]
    for rep in range(reps):
        for pi, pid in enumerate(prompt_ids):
            # Per-prompt offsets are fixed (same prompts, same difficulty) so that two runs are comparable.
            bias = 1.0 + 0.01 * (pi - (prompts - 1) / 2)
            pf = n_prompt / (prefill_tok_s * bias * (1 + cov * rng.standard_normal()))
            dec = (n_gen - 1) / (decode_tok_s * bias * (1 + cov * rng.standard_normal())) if n_gen > 1 else 0.0
            energy: dict[str, PhaseEnergy] = {}
            if power_w is not None:
                for phase, win in (("prefill", pf), ("decode", dec)):
                    p = power_w * (1 + 0.005 * rng.standard_normal())
                    energy[phase] = PhaseEnergy(window_s=win, energy_j=p * win, energy_net_j=(p - IDLE_W) * win,
                                                avg_power_w=p, peak_power_w=p * 1.03, method="counter")
            steps = n_gen - 1
            draft = accepted = None
            spec = prefill = None
            if al is not None:
                draft = max(1, round((n_gen - 1) / (al * bias)))
                accepted = n_gen - 1
                steps = draft
                spec = _spec_stats(draft, accepted, dec * 1e3)
            if keep_ratio is not None:
                prefill = _prefill_stats(n_prompt, keep_ratio, pf * 1e3, kept=pi not in lost_needles,
                                         depth=(0.1, 0.3, 0.5, 0.7, 0.9)[pi % 5])
            t0 = t
            t1 = t0 + int(pf * 1e9)
            t2 = t1
            t3 = t2 + int(dec * 1e9)
            t = t3 + 50_000_000
            samples.append(Sample(rep=rep, prompt_id=pid, n_prompt=n_prompt, n_gen=n_gen, decode_steps=steps,
                                  stop="length", prefill_s=pf, decode_s=dec, e2e_s=pf + dec + 0.002,
                                  t_prefill_start_ns=t0, t_prefill_end_ns=t1, t_decode_start_ns=t2,
                                  t_decode_end_ns=t3, bytes_per_token=bytes_per_token,
                                  peak_mem_bytes=int(2.1e9) if backend != "cpu" else None,
                                  draft_steps=draft, accepted_tokens=accepted, spec=spec, prefill=prefill,
                                  energy=energy))
    metrics = derive_metrics(samples, bandwidth=bandwidth)
    trace = []
    if power_w is not None:
        trace = [(i * 0.1, IDLE_W if i < 3 else power_w * (1 + 0.01 * math.sin(i))) for i in range(60)]
    suite = str(params.get("suite"))
    return Cell(
        id=_cell_id(params), params=params, status="ok", started="2026-05-01T10:00:00Z",
        finished="2026-05-01T10:01:00Z",
        engine=EngineInfo(name=str(params["engine"]), kind="bundled" if params["engine"] != "llamacpp" else "baseline",
                          version="0.1.0", backend=backend),
        model=ModelInfo(name=str(params.get("model", "qwen3.5-0.8b")), synthetic=synthetic,
                        files={"model.safetensors": "ab" * 32}),
        workload=Workload(suite=suite, dataset=dataset, prompt_ids=prompt_ids, n_gen=n_gen, depth=depth),
        power=PowerState(requested_limit_w=params.get("power_limit_w"), applied=params.get("power_limit_w") is not None,
                         limit_w=params.get("power_limit_w") or (350.0 if power_w else None),
                         idle_power_w=IDLE_W if power_w else None),
        warmups=2, samples=samples, power_trace=trace, metrics=metrics)


def _spec_stats(rounds: int, tokens: int, decode_ms: float) -> SpecStats:
    """Rounds committing floor(AL) or floor(AL) + 1 tokens, with the per-depth counts they imply."""
    base, extra = divmod(tokens, rounds)
    hist = [0] * (base + 2)
    hist[base] += rounds - extra
    hist[base + 1] += extra
    hist = hist[:max(k for k, n in enumerate(hist) if n) + 1]
    return SpecStats(draft_steps=rounds, accepted_tokens=tokens, acceptance_length=tokens / rounds,
                     accepted_per_depth=[sum(hist[d + 1:]) for d in range(1, 16)], al_histogram=hist,
                     time_ms={"draft": 0.25 * decode_ms, "tree": 0.05 * decode_ms, "verify": 0.65 * decode_ms,
                              "commit": 0.05 * decode_ms})


def _prefill_stats(n_prompt: int, keep_ratio: float, ttft_ms: float, *, kept: bool, depth: float) -> PrefillStats:
    """A prompt compressed to `keep_ratio` (in 32-token chunks); its one needle kept or lost."""
    kept_target = max(32, int(n_prompt * keep_ratio) // 32 * 32)
    return PrefillStats(prompt_tokens=n_prompt, drafter_prompt_tokens=int(n_prompt * 1.08),
                        kept_tokens_drafter=int(kept_target * 1.08), kept_tokens_target=kept_target,
                        kept_ranges=[(0, kept_target // 2), (n_prompt - kept_target // 2, n_prompt)],
                        time_ms={"score": 0.7 * ttft_ms, "select": 0.02 * ttft_ms, "bridge": 0.03 * ttft_ms,
                                 "target_prefill": 0.25 * ttft_ms}, needles_kept=[kept], needle_depths=[depth])


def derive_metrics(samples: list[Sample], bandwidth: float = 936e9) -> dict[str, MetricSummary]:
    """The cell's metrics as a run computes them (lucebench.metrics, docs/metrics.md)."""
    return compute_cell_metrics(samples, memory_bandwidth_bytes_s=bandwidth)


def environment(gpu: str | None = "NVIDIA GeForce RTX 3090", driver: str | None = "575.57.08") -> Environment:
    gpus = []
    if gpu is not None:
        gpus = [GpuInfo(index=0, name=gpu, uuid="GPU-0000", memory_total_bytes=24 * 2**30, compute_capability="8.6",
                        power_limit_w=350.0, power_limit_default_w=350.0, power_limit_min_w=100.0,
                        power_limit_max_w=400.0, energy_counter=True)]
    return Environment(hostname="bench1", os="Linux", kernel="6.8.0", cpu="AMD Ryzen 9 5950X", cpu_count=32,
                       python="3.11.9", driver_version=driver if gpu else None, cuda_version="12.9" if gpu else None,
                       gpus=gpus, lucebench_version="0.1.0", lucebench_commit="0123456789abcdef0123456789abcdef01234567",
                       lucebench_dirty=False, power_available=gpu is not None)


def _result(cells: list[Cell], env: Environment, run_id: str) -> Result:
    return Result(run_id=run_id, created="2026-05-01T10:00:00Z", lucebench_version="0.1.0", metrics_version="1",
                  config=ConfigRecord(path="configs/rtx3090.yaml", sha256="cd" * 32, content={"name": "rtx3090"}),
                  environment=env, cells=cells, complete=True)


def gpu_result(*, seed: int = 0, gpu: str = "NVIDIA GeForce RTX 3090", driver: str = "575.57.08", cov: float = 0.01,
               reps: int = 5, decode_scale: float = 1.0, failures: bool = True) -> Result:
    """A full RTX 3090-like matrix. `decode_scale` multiplies every decode speed (0.8 = a 20% slowdown)."""
    rng = np.random.default_rng(seed)
    cells: list[Cell] = []
    small = "qwen3.5-0.8b"
    bpt = 1.6e9
    for engine, pp, tg, watts in (("megakernel", 21347, 413, 300), ("llamacpp", 11247, 267, 350), ("hf", 7578, 108, 300)):
        cells.append(make_cell(rng, {"engine": engine, "model": small, "suite": "pp520", "power_limit_w": 350},
                               n_prompt=520, n_gen=1, prefill_tok_s=pp, decode_tok_s=tg, power_w=min(watts + 40, 390), reps=reps,
                               cov=cov))
        cells.append(make_cell(rng, {"engine": engine, "model": small, "suite": "tg128", "power_limit_w": 350},
                               n_prompt=1, n_gen=129, prefill_tok_s=pp, decode_tok_s=tg * decode_scale, power_w=watts,
                               reps=reps, cov=cov, bytes_per_token=bpt))
    for limit, tok_s, watts in ((300, 432, 300.0), (220, 411, 219.8), (150, 194, 150.0)):
        cells.append(make_cell(rng, {"engine": "megakernel", "model": small, "suite": "tg128", "power_limit_w": limit},
                               n_prompt=1, n_gen=129, prefill_tok_s=21347, decode_tok_s=tok_s * decode_scale,
                               power_w=watts, reps=reps, cov=cov, bytes_per_token=bpt))
    big = "qwen3.6-27b-q4km"
    for suite, ar, spec, al in (("humaneval", 37.8, 129.5, 8.31), ("gsm8k", 37.7, 96.2, 6.2), ("math500", 37.7, 110.5, 7.1)):
        common = {"n_prompt": 300, "n_gen": 256, "prefill_tok_s": 2000, "power_w": 340.0, "reps": reps, "cov": cov,
                  "prompts": 2, "dataset": DATASETS[suite], "synthetic": False}
        cells.append(make_cell(rng, {"engine": "ar", "model": big, "suite": suite}, decode_tok_s=ar * decode_scale,
                               **common))  # type: ignore[arg-type]
        cells.append(make_cell(rng, {"engine": "dflash", "model": big, "suite": suite, "budget": 22},
                               decode_tok_s=spec * decode_scale, al=al, **common))  # type: ignore[arg-type]
    for budget, al, tok_s in ((15, 7.64, 125.0), (30, 8.86, 121.0), (40, 8.90, 105.0)):
        cells.append(make_cell(rng, {"engine": "dflash", "model": big, "suite": "humaneval", "budget": budget},
                               n_prompt=300, n_gen=256, prefill_tok_s=2000, decode_tok_s=tok_s * decode_scale,
                               power_w=340.0, reps=reps, cov=cov, prompts=2, dataset=DATASETS["humaneval"], al=al,
                               synthetic=False))
    for ctx, ttft_llama in ((16384, 33000.0), (65536, 135000.0)):
        for engine, kv, ttft in (("pflash", "f16", ttft_llama / 10), ("pflash", "q8_0", ttft_llama / 9.5),
                                 ("llamacpp", "f16", ttft_llama)):
            params: dict[str, Any] = {"engine": engine, "model": big, "suite": "niah", "context": ctx,
                                      "kv_k": kv, "kv_v": kv}
            keep = 0.05 if engine == "pflash" else None
            if keep is not None:
                params["keep_ratio"] = keep
            cells.append(make_cell(rng, params, n_prompt=ctx, n_gen=32, prefill_tok_s=ctx / (ttft / 1e3),
                                   decode_tok_s=(30.0 if kv == "f16" else 33.0) * decode_scale * (16384 / ctx) ** 0.1,
                                   power_w=345.0, reps=max(3, reps - 2), cov=cov, synthetic=False, prompts=5,
                                   keep_ratio=keep, lost_needles=(4,) if ctx == 65536 and kv == "q8_0" else ()))
    if failures:
        p = {"engine": "hf", "model": big, "suite": "niah", "context": 65536, "kv_k": "f16", "kv_v": "f16"}
        cells.append(Cell(id=_cell_id(p), params=p, status="failed",
                          error=CellError(kind="oom", message="CUDA out of memory: tried to allocate 12.0 GiB",
                                          exit_code=1, stderr_tail="torch.OutOfMemoryError")))
        p = {"engine": "hf", "model": big, "suite": "humaneval"}
        cells.append(Cell(id=_cell_id(p), params=p, status="skipped",
                          error=CellError(kind="skipped", message="model does not fit in 24 GiB at bf16")))
    return _result(cells, environment(gpu, driver), run_id=f"run-gpu-{seed}")


def cpu_result(*, seed: int = 0, reps: int = 3) -> Result:
    """A CPU smoke run: one engine, tiny synthetic model, no power measurement (energy metrics n/a)."""
    rng = np.random.default_rng(seed)
    cell = make_cell(rng, {"engine": "ar", "model": "synthetic-tiny", "suite": "smoke"}, n_prompt=32, n_gen=16,
                     prefill_tok_s=900.0, decode_tok_s=55.0, power_w=None, reps=reps, cov=0.02, backend="cpu")
    result = _result([cell], environment(None, None), run_id=f"run-cpu-{seed}")
    result.config.content = {"name": "cpu-smoke", "models": {"synthetic-tiny": {"synth": {"shape": "tiny"}}}}
    return result
