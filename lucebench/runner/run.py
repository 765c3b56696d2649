"""`lucebench run`: expand the matrix, prepare models and engines, measure every cell, keep everything.

results.json is rewritten atomically after every cell, so a crash, a kill or Ctrl-C loses at most the
cell in flight (and even its samples are kept, marked interrupted). `--resume` skips finished cells.
Any power limit the run changed is restored on every exit path (lucebench.measure's guard).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from lucebench import __version__
from lucebench.config.load import LoadedConfig
from lucebench.engines.registry import GPU_BACKENDS, LaunchRequest, check_runnable, resolve_engine
from lucebench.errors import EngineError, UserError
from lucebench.matrix import CellSpec, expand, select
from lucebench.matrix.pairing import kv_types, pairing_key
from lucebench.measure.cpu_load import CpuLoadProbe
from lucebench.metrics import METRICS_VERSION, compute_cell_metrics, compute_speedups
from lucebench.results.schema import (
    Cell,
    CellError,
    ConfigRecord,
    EngineInfo,
    Environment,
    PowerState,
    Result,
    Workload,
)
from lucebench.results.store import ensure_writable_dir, save_atomic
from lucebench.runner.cell import CellFailed, CellInterrupted, measure_cell
from lucebench.runner.checks import token_match
from lucebench.runner.hardware import add_memory_bandwidth, check_hardware, resolve_backend
from lucebench.runner.power import RunPower, earlier_idle_power
from lucebench.runner.prepare import ModelCache, WorkloadCache, check_second_model, prepare_engines
from lucebench.runner.process import EngineProcess
from lucebench.suites import workload_identity


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def baseline_pairs(cells: list[Cell], baseline: str) -> list[tuple[Cell, Cell]]:
    """(cell, the baseline engine's cell it is measured against) for every ok cell that has one: the same workload
    (`pairing_key`: the params but the engine axes, the DDTree budget, the keep ratio and the KV types); of several
    such baseline cells the one of the same KV types, else the first in run order."""
    by_key: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.status == "ok" and c.params.get("engine") == baseline:
            by_key.setdefault(pairing_key(c.params), []).append(c)
    pairs = []
    for c in cells:
        cands = [b for b in by_key.get(pairing_key(c.params), []) if b is not c]
        if c.status == "ok" and cands:
            same_kv = (b for b in cands if kv_types(b.params) == kv_types(c.params))
            pairs.append((c, next(same_kv, cands[0])))
    return pairs


@dataclass
class RunOptions:
    out_dir: Path
    resume: bool = False
    only: str | None = None
    dry_run: bool = False
    allow_power_limit: bool = False
    score: bool | None = None
    report: bool = True


@dataclass
class RunSummary:
    result_path: Path
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    reused: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


class Runner:
    def __init__(self, loaded: LoadedConfig, options: RunOptions, console: Console | None = None):
        self.loaded = loaded
        self.config = loaded.config
        self.options = options
        self.console = console or Console(stderr=True)
        self.result_path = options.out_dir / "results.json"

    # -- planning -------------------------------------------------------------------------------------
    def cells(self, backend: str) -> list[CellSpec]:
        return select(expand(self.config, backend), self.options.only)

    # -- the run --------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        from lucebench.measure.env import collect_environment

        if self.options.resume and not self.result_path.exists():
            raise UserError("--resume: there is no run to continue here (no results.json)", where=str(self.result_path),
                            hint="give the folder of the earlier run with --out, or drop --resume to start a new run")
        backend = resolve_backend(self.config)
        cells = self.cells(backend)
        env = collect_environment()
        self.env = env
        if self.options.dry_run:
            try:
                check_hardware(self.config, backend, env)
            except UserError as exc:  # a plan can be read on another machine; running it cannot
                self.console.print(f"[yellow]warning:[/] this machine cannot run it: {exc}")
            from lucebench.runner.plan import print_plan

            try:
                check_runnable([c.engine for c in cells], self.config.engines)
            except UserError as exc:
                self.console.print(f"[yellow]warning:[/] {exc}")
            print_plan(self.config, backend, cells, console=self.console,
                       allow_power_limit=self.options.allow_power_limit)
            return RunSummary(result_path=self.result_path)
        check_hardware(self.config, backend, env)
        check_runnable([c.engine for c in cells], self.config.engines)

        devices = sorted({c.gpu for c in cells if c.gpu is not None}) if backend in GPU_BACKENDS else []
        ensure_writable_dir(self.options.out_dir)
        result = self._start_result(env)
        # after _start_result: a resume on the same machine keeps the bandwidth its cells were measured with
        add_memory_bandwidth(env, devices, console=self.console)
        summary = RunSummary(result_path=self.result_path)
        models = ModelCache(self.config, console=self.console)
        workloads = WorkloadCache(self.config)
        todo = [s for s in cells if not (self.options.resume and (c := result.cell(s.id)) is not None
                                         and c.status == "ok")]
        try:
            # Resolve every model and workload first: a missing model or unknown suite is a config error
            # (exit 2) found before anything is measured, not a failure in cell 17.
            for spec in cells:
                workloads.get(spec, models.get(spec.model).tokenizer_dir)
                if spec.second_model is not None:
                    check_second_model(spec, models.get(spec.model).path, models.get(spec.second_model).path)
            # Saved before the preparation, so that a Ctrl-C during a build leaves a run that --resume continues.
            save_atomic(result, self.result_path)
            unprepared = prepare_engines(self.config, backend, todo, models, limit_s=self.config.measure.prepare_timeout_s,
                                         console=self.console)
        except KeyboardInterrupt:
            # Synthetic checkpoints, builds and conversions are written atomically into caches: --resume reuses
            # whatever finished and redoes only what was cut.
            save_atomic(result, self.result_path)
            self.console.print(f"[yellow]interrupted while preparing; what was made is cached and the run is in "
                               f"{self.options.out_dir}; continue with --resume --out {self.options.out_dir}[/]")
            raise

        try:
            with ExitStack() as stack:
                power = (RunPower.start(devices, self.config.power.idle_s, console=self.console,
                                        known_idle_w=earlier_idle_power(result)) if devices else RunPower())
                stack.callback(power.stop)
                guard = self._power_guard(stack, devices)
                progress = stack.enter_context(Progress(
                    TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=False))
                overall = progress.add_task("cells", total=len(cells))
                for spec in cells:
                    previous = result.cell(spec.id)
                    if self.options.resume and previous is not None and previous.status == "ok":
                        summary.reused += 1
                        progress.advance(overall)
                        continue
                    why = unprepared.get((spec.engine, spec.model))
                    if why is not None:
                        cell = self._failed(spec, "build", why, started=_now(), model=models.get(spec.model).info)
                        self._store(result, cell)
                        progress.advance(overall)
                        summary.failed += 1
                        summary.failures.append(f"{cell.id}: build: {why}")
                        continue
                    requests = progress.add_task(f"  {spec.id}", total=None)
                    try:
                        cell = self._run_cell(spec, backend, models, workloads, power, guard,
                                              lambda d, t, task=requests: progress.update(task, completed=d, total=t))
                    except KeyboardInterrupt as exc:
                        samples = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
                        self._store(result, self._failed(spec, "interrupted", "interrupted by the user (Ctrl-C)",
                                                         samples=samples))
                        self.console.print(f"[yellow]interrupted; results so far are in {self.result_path}; "
                                           f"continue with --resume[/]")
                        raise
                    finally:
                        progress.remove_task(requests)
                    self._store(result, cell)
                    progress.advance(overall)
                    if cell.status == "ok":
                        summary.ok += 1
                    elif cell.status == "skipped":
                        summary.skipped += 1
                    else:
                        summary.failed += 1
                        summary.failures.append(f"{cell.id}: {cell.error.kind if cell.error else '?'}: "
                                                f"{cell.error.message if cell.error else ''}")
        except KeyboardInterrupt:
            self._finish(result, cells)  # speedups and the report over what was measured, then stop
            raise
        self._finish(result, cells)
        return summary

    # -- pieces ---------------------------------------------------------------------------------------
    def _finish(self, result: Result, cells: list[CellSpec]) -> None:
        """Cross-cell metrics, the final save and the report: after the last cell, or after Ctrl-C."""
        self._add_cross_cell_metrics(result)
        def done(cell: Cell | None) -> bool:
            return cell is not None and not (cell.error is not None and cell.error.kind == "interrupted")

        result.complete = all(done(result.cell(spec.id)) for spec in cells)
        result.updated = _now()
        save_atomic(result, self.result_path)
        if self.options.report:
            self._write_report()

    def _score(self) -> bool:
        return self.config.score if self.options.score is None else self.options.score

    def _start_result(self, env: Environment) -> Result:
        record = ConfigRecord(path=str(self.loaded.path), sha256=self.loaded.sha256, content=self.loaded.raw)
        if self.result_path.exists():
            if not self.options.resume:
                raise UserError("results.json already exists; refusing to overwrite measured results",
                                where=str(self.result_path),
                                hint="continue it with --resume, or choose another folder with --out")
            from lucebench.results.io import load_result

            result = load_result(self.result_path)
            if result.config.sha256 != self.loaded.sha256:
                self.console.print("[yellow]warning:[/] the config changed since this run started; finished "
                                   "cells with the same id are kept, the rest run with the new config")
                result.config = record
            moved = result.move_to(env)
            if moved is not None:
                kept = sum(c.environment_id == moved for c in result.cells)
                self.console.print(f"[yellow]note:[/] resuming on another machine or checkout: the {kept} cell(s) "
                                   f"measured before keep their environment (other_environments[{moved!r}])")
            return result
        return Result(run_id=uuid.uuid4().hex[:12], created=_now(), lucebench_version=__version__,
                      metrics_version=METRICS_VERSION, config=record, environment=env)

    def _power_guard(self, stack: ExitStack, devices: list[int]) -> dict[int, Any]:
        """One guard per device that restores the original limit on every exit path."""
        wanted = any(v is not None for v in self.config.matrix.power_limit_w)
        if not devices or not wanted:
            return {}
        from lucebench.measure.power_limit import PowerLimitGuard, recover_stale_power_limits

        for line in recover_stale_power_limits():  # limits left changed by a killed earlier run
            self.console.print(f"[yellow]restored:[/] {line}")
        return {d: stack.enter_context(PowerLimitGuard(d)) for d in devices}

    def _store(self, result: Result, cell: Cell) -> None:
        result.cells = [c for c in result.cells if c.id != cell.id] + [cell]
        result.prune_environments()
        result.updated = _now()
        save_atomic(result, self.result_path)

    def _failed(self, spec: CellSpec, kind: str, message: str, *, samples: list | None = None,
                exc: EngineError | None = None, log_file: Path | None = None, status: str = "failed",
                **known: Any) -> Cell:
        error = CellError(kind=kind, message=message, exit_code=exc.exit_code if exc else None,
                          signal=exc.signal if exc else None, stderr_tail=exc.stderr_tail if exc else None,
                          log_file=str(log_file) if log_file else None)
        return Cell(id=spec.id, params=spec.params(), status=status, finished=_now(), samples=samples or [],
                    error=error, log_file=str(log_file) if log_file else None, **known)

    def _run_cell(self, spec: CellSpec, backend: str, models: ModelCache, workloads: WorkloadCache,
                  power: RunPower, guard: dict[int, Any], on_request) -> Cell:
        started = _now()
        measure = self.config.measure
        deadline = time.monotonic() + measure.timeout_s
        model = models.get(spec.model)
        workload = workloads.get(spec, model.tokenizer_dir)
        engine_type, options = resolve_engine(spec.engine, self.config.engines)
        log_file = self.options.out_dir / "logs" / (spec.id.replace("/", "__") + ".log")
        second = models.get(spec.second_model) if spec.second_model is not None else None
        known: dict[str, Any] = {"started": started, "model": model.info, "workload": self._workload_info(workload),
                                 "draft_model": second.info if second is not None else None}
        not_here = engine_type.not_on(backend)
        if not_here is not None:
            return self._failed(spec, "skipped", not_here, status="skipped", **known)

        power_state = None
        if spec.gpu is not None:
            from lucebench.measure.power_limit import PowerLimitError
            from lucebench.measure.records import power_state as make_power_state
            from lucebench.measure.state import read_gpu_state

            limit = None
            if spec.power_limit_w is not None:
                allowed = self.config.power.allow_set_limit and self.options.allow_power_limit
                try:
                    limit = guard[spec.gpu].apply(spec.power_limit_w, allowed=allowed)
                except PowerLimitError as exc:
                    hint = ""
                    if exc.kind == "not_allowed":
                        hint = (" (needs power.allow_set_limit: true in the config and --allow-power-limit)")
                    return self._failed(spec, "skipped", f"power limit {spec.power_limit_w:g} W not applied: "
                                        f"{exc.reason}{hint}", status="skipped", **known)
            power_state = make_power_state(read_gpu_state(spec.gpu), limit=limit,
                                           requested_limit_w=spec.power_limit_w, idle_power_w=power.idle_w.get(spec.gpu))
            self._note_other_processes(power_state, spec, before=True)
        known["power"] = power_state

        max_ctx = max(len(p.token_ids) for p in workload.prompts) + workload.n_gen + 8
        try:
            launch = engine_type.launch(LaunchRequest(
                engine=spec.engine, options=options, model_dir=model.path, backend=backend,  # type: ignore[arg-type]
                device=spec.gpu or 0, max_ctx=max_ctx, kv_k=spec.kv_k, kv_v=spec.kv_v, budget=spec.budget,
                keep_ratio=spec.keep_ratio, second_model_dir=second.path if second is not None else None,
                console=self.console))
        except UserError as exc:
            return self._failed(spec, "build", str(exc), **known)
        except Exception as exc:  # a build or conversion tool failing is the cell's failure, not the run's
            return self._failed(spec, "build", f"{type(exc).__name__}: {exc}", **known)

        request_fields = None
        if engine_type.name == "pflash" and second is not None:
            from lucebench.engines.bridge import PFlashBridge

            try:
                bridge = PFlashBridge(model.tokenizer_dir, second.path)  # a GGUF target: its `tokenizer:`
            except UserError as exc:
                return self._failed(spec, "config", str(exc), **known)
            request_fields = lambda p: bridge.fields(p.token_ids)  # noqa: E731

        engine = EngineInfo(name=spec.engine, kind=engine_type.kind, backend=backend, command=launch.argv,
                            build=launch.build)
        known["engine"] = engine
        try:
            with EngineProcess(launch.argv, log_path=log_file, env=launch.env) as proc:
                engine_pid = proc.proc.pid
                ready = proc.wait_ready(max(1.0, deadline - time.monotonic()))
                engine.ready = ready
                ready_engine = ready.get("engine") or {}
                engine.version = ready_engine.get("version")
                if isinstance(ready_engine.get("tuning"), dict):
                    engine.tuning = ready_engine["tuning"]
                engine.warnings = [str(w) for w in ready_engine.get("warnings") or []]
                for w in engine.warnings:
                    self.console.print(f"[yellow]warning:[/yellow] {escape(spec.id)}: {escape(spec.engine)} says: {escape(w)}")
                probe = CpuLoadProbe(engine_session=engine_pid) if spec.gpu is None else None
                m = measure_cell(proc, workload, measure, power=power, device=spec.gpu,
                                 deadline=deadline, cell_id=spec.id,
                                 on_request=on_request, request_fields=request_fields)
                known["cpu_load"] = probe.stop() if probe is not None else None
        except CellInterrupted as exc:
            raise KeyboardInterrupt(exc.samples) from None
        except CellFailed as exc:
            return self._failed(spec, exc.error.kind, exc.error.message, samples=exc.samples, exc=exc.error,
                                log_file=log_file, **known)
        except EngineError as exc:
            return self._failed(spec, exc.kind, exc.message, exc=exc, log_file=log_file, **known)

        if power_state is not None and spec.gpu is not None:
            self._refresh_power_state(power_state, spec.gpu)
            self._note_other_processes(power_state, spec, before=False, exclude=(engine_pid,))
        load = known.get("cpu_load")
        if load is not None and load.contaminated:
            self.console.print(f"[yellow]warning:[/] {spec.id}: other processes used {load.other_cores:.1f} of "
                               f"{load.cpu_count} CPU cores while it measured, so its numbers are not the machine's: "
                               f"{'; '.join(load.other_processes[:3])}")
        bandwidth = self._bandwidth(spec.gpu)
        metrics = compute_cell_metrics(m.samples, phase_totals=m.phase_totals,
                                       memory_bandwidth_bytes_s=bandwidth, noisy_cov=measure.noisy_cov)
        cell = Cell(id=spec.id, params=spec.params(), status="ok", finished=_now(), warmups=m.warmups,
                    samples=m.samples, metrics=metrics, log_file=str(log_file),
                    power_trace=power.trace(spec.gpu, m.t_start_ns, m.t_end_ns), **known)
        if self._score() and workload.kind in ("dataset", "needle"):  # a needle's answer: the suite's scorer
            from lucebench.runner.checks import score_cell

            score_cell(cell, workload, model.tokenizer_dir)
        return cell

    def _workload_info(self, w) -> Workload:
        return Workload(suite=w.suite, suite_version=w.suite_version, dataset=w.dataset,
                        dataset_revision=w.dataset_revision, prompt_ids=[p.id for p in w.prompts],
                        prompt_format=w.prompt_format, n_gen=w.n_gen, ignore_eos=w.ignore_eos, eos_ids=list(w.eos_ids), depth=w.depth,
                        skipped_prompts=list(w.skipped), identity=workload_identity(w))

    def _refresh_power_state(self, state: PowerState, device: int) -> None:
        """Clocks, temperature and throttle reasons as they were at the end of the measurement."""
        from lucebench.measure.state import read_gpu_state

        for key, value in read_gpu_state(device).items():
            if value is not None:
                setattr(state, key, value)

    def _note_other_processes(self, state: PowerState, spec: CellSpec, *, before: bool, exclude: tuple[int, ...] = ()) -> None:
        """Records (and warns about) other processes computing on the cell's GPU, read before its engine starts and
        after it stopped: they time-slice with the engine and slow it without any error."""
        from lucebench.measure.state import other_gpu_processes

        others = other_gpu_processes(spec.gpu, exclude=exclude) if spec.gpu is not None else None
        new = [o for o in others or [] if o not in state.other_gpu_processes]
        if not new:
            return
        state.other_gpu_processes.extend(new)
        when = "before" if before else "after"
        self.console.print(f"[yellow]warning:[/] {spec.id}: other processes compute on GPU {spec.gpu} {when} its engine "
                           f"ran (they share the card, so its numbers are not the card's): {'; '.join(new)}")

    def _bandwidth(self, device: int | None) -> float | None:
        gpu = next((g for g in self.env.gpus if g.index == device), None) if device is not None else None
        return gpu.memory_bandwidth_bytes_s if gpu else None

    def _add_cross_cell_metrics(self, result: Result) -> None:
        """Speedups over the baseline engine's matching cell (same model, suite and settings)."""
        if not self.config.baseline:
            return
        for c, base in baseline_pairs(result.cells, self.config.baseline):
            c.metrics.update(compute_speedups(c, base))
            match = token_match(c, base)
            if match is not None:
                c.metrics["token_match_pct"], c.checks["lossless"] = match

    def _write_report(self) -> None:
        from lucebench.reports import write_report

        try:
            write_report([self.result_path], self.options.out_dir)
        except UserError as exc:
            self.console.print(f"[yellow]report not written:[/] {exc}")
