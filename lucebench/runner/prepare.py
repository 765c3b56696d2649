"""Models and workloads for the cells, resolved once per run and shared between cells."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebench.config.schema import Config
from lucebench.errors import UserError
from lucebench.matrix import CellSpec
from lucebench.results.schema import ModelInfo
from lucebench.suites.base import PreparedWorkload


@dataclass
class PreparedModel:
    path: Path
    info: ModelInfo
    tokenizer_dir: Path  # where prompts' tokenizer.json is: the model's folder, or its `tokenizer:` source


class ModelCache:
    """Resolves each config model (local path, HF cache, or synthetic) once, with its file hashes."""

    def __init__(self, config: Config, console: Any = None):
        self.config = config
        self.console = console
        self._models: dict[str, PreparedModel] = {}

    def get(self, name: str) -> PreparedModel:
        if name not in self._models:
            from lucebench.models.resolve import hash_model_files, resolve_model

            source = self.config.models[name]
            try:
                if source.synth is not None and source.synth.draft_for is not None:
                    from lucebench.models.resolve import resolve_draft_synth, synth_shape

                    target = self.get(source.synth.draft_for).path
                    target_source = self.config.models[source.synth.draft_for]
                    target_config = None
                    if target.is_file() and target_source.synth is not None:  # a synthetic GGUF: no config.json
                        target_config = synth_shape(target_source.synth.model_dump(exclude_none=True)).config
                    resolved = resolve_draft_synth(target, target_config=target_config, seed=source.synth.seed,
                                                   dtype=source.synth.dtype, console=self.console)
                else:
                    resolved = resolve_model(source.model_dump(exclude_none=True, exclude={"tokenizer"}),
                                             console=self.console)
                tokenizer_dir = resolved.path
                if resolved.path.is_file() and (resolved.path.parent / "tokenizer.json").is_file():
                    tokenizer_dir = resolved.path.parent  # a synthetic GGUF: its tokenizer.json beside it
                if source.tokenizer is not None:
                    from lucebench.models.resolve import resolve_tokenizer

                    tokenizer_dir = resolve_tokenizer(source.tokenizer)
            except UserError as exc:
                exc.where = exc.where or f"config models.{name}"
                raise
            path = Path(resolved.path)
            facts = _model_facts(path)
            files = hash_model_files(path)
            if source.tokenizer is not None:  # the prompts' token ids depend on it: recorded beside the weights
                files["tokenizer/tokenizer.json"] = hash_model_files(tokenizer_dir / "tokenizer.json")["tokenizer.json"]
            self._models[name] = PreparedModel(path=path, tokenizer_dir=Path(tokenizer_dir), info=ModelInfo(
                name=name, path=str(path), files=files, synthetic=source.synth is not None
                or (path / "lucebench_synth.json").exists(), arch=facts.get("arch"), dtype=facts.get("dtype")))
        return self._models[name]


def _model_facts(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    text = config.get("text_config", config)
    return {"arch": text.get("model_type") or config.get("model_type"),
            "dtype": text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype")}


class WorkloadCache:
    """Each (suite, model, context) tokenised once: every engine of the run gets identical token ids."""

    def __init__(self, config: Config):
        self.config = config
        self._workloads: dict[tuple, PreparedWorkload] = {}

    def get(self, spec: CellSpec, model_dir: Path) -> PreparedWorkload:
        key = (spec.suite, spec.model, spec.context)
        if key not in self._workloads:
            from lucebench.suites.loader import prepare_workload

            o = self.config.suites.get(spec.suite)
            try:
                w = prepare_workload(spec.suite, tokenizer_dir=model_dir, context=spec.context,
                                     n_gen=o.n_gen if o else None, max_prompt_tokens=o.max_prompt_tokens if o else None,
                                     sample_size=o.sample_size if o else None, stop=o.stop if o else None,
                                     prompt_format=o.prompt_format if o else None)
            except UserError as exc:
                exc.where = exc.where or f"config matrix.suite {spec.suite!r}"
                raise
            if not w.prompts:
                raise UserError(f"suite {spec.suite!r} has no usable prompt for model {spec.model!r}: "
                                f"{len(w.skipped)} skipped ({w.skipped[0]['reason'] if w.skipped else 'none'})")
            self._workloads[key] = w
        return self._workloads[key]


class PreparationTimeout(Exception):
    """The preparation phase ran past its limit (`measure.prepare_timeout_s`)."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise PreparationTimeout in the main thread after `seconds` (a build's subprocess.run kills its child)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise PreparationTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _descendants(root: int) -> list[int]:
    """Pids of every process below `root`, from /proc (empty where /proc is not there)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            text = (entry / "stat").read_text()
            ppid = int(text[text.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _stop_build_processes() -> None:
    """After the time limit: a build's subprocess.run kills only its direct child (cmake), whose compilers would
    go on; during the preparation every process below this one belongs to it."""
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def prepare_engines(config: Config, backend: str, cells: list[CellSpec], models: ModelCache, *,
                    limit_s: float, console: Any = None) -> dict[tuple[str, str], str]:
    """Build the engines and convert the models the cells need, before any cell starts its clock.

    Building llama.cpp or a bundled engine and converting a checkpoint to GGUF take minutes on a small
    machine; done inside a cell they would eat its `timeout_s` and the failure would blame the engine.
    Every step is cached (build folders keyed by sources, GGUF files by model hash), so an interrupted
    preparation continues where it stopped and a cell's own launch afterwards only reads the cache.
    Returns {(engine, model): why it could not be prepared}; those cells fail without running.
    """
    from lucebench.engines.registry import LaunchRequest, resolve_engine

    wanted: dict[tuple[str, str], CellSpec] = {}
    for spec in cells:
        engine_type, _ = resolve_engine(spec.engine, config.engines)
        if engine_type.not_on(backend) is not None:
            continue  # its cells are skipped with the reason
        if engine_type.kind == "bundled" or engine_type.name == "llama.cpp":
            wanted.setdefault((spec.engine, spec.model), spec)
    failures: dict[tuple[str, str], str] = {}
    if not wanted:
        return failures
    started = time.monotonic()
    if console is not None:
        console.print(f"[bold]preparing[/] {len(wanted)} engine build(s)/conversion(s) (time limit {limit_s:g} s, "
                      "not counted in any cell's timeout)")
    for (engine, model_name), spec in wanted.items():
        engine_type, options = resolve_engine(engine, config.engines)
        left = limit_s - (time.monotonic() - started)
        if left <= 0:
            failures[(engine, model_name)] = (f"not prepared: the preparation time limit ({limit_s:g} s, "
                                              "measure.prepare_timeout_s) was spent before its turn")
            continue
        t0 = time.monotonic()
        what = f"{engine} for {model_name}" if engine_type.name == "llama.cpp" else engine
        if console is not None:
            console.print(f"  preparing {what} ({backend}) ...")
        try:
            with _time_limit(left):
                engine_type.launch(LaunchRequest(
                    engine=engine, options=options, model_dir=models.get(model_name).path,
                    backend=backend, device=spec.gpu or 0, max_ctx=4096, console=console))  # type: ignore[arg-type]
        except PreparationTimeout:
            _stop_build_processes()
            failures[(engine, model_name)] = (f"preparing {what} ran past the preparation time limit ({limit_s:g} s, "
                                              "measure.prepare_timeout_s); what was built is cached, so --resume "
                                              "continues it")
        except UserError as exc:
            failures[(engine, model_name)] = f"preparing {what} failed: {exc}"
        except Exception as exc:  # a build or conversion tool failing is those cells' failure, not the run's
            failures[(engine, model_name)] = f"preparing {what} failed: {type(exc).__name__}: {exc}"
        else:
            if console is not None:
                console.print(f"  prepared {what} in {time.monotonic() - t0:.0f} s")
    return failures


def check_second_model(spec: CellSpec, target_dir: Path, second_dir: Path) -> None:
    """Before a run: a DFlash draft (z-lab folder or GGUF file) must fit its target (hidden size, depth, vocabulary),
    a PFlash drafter must have its own tokenizer; a mismatch is a config error naming the model."""
    where = f"config models.{spec.second_model}"
    if spec.engine_type == "dflash" and (second_dir.is_dir() or second_dir.suffix == ".gguf"):
        from lucebench.models.dflash_draft import check_draft
        from lucebench.models.dflash_gguf import check_gguf_draft

        try:
            target = json.loads((target_dir / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return  # a GGUF target: the engine checks the fit when it loads both
        try:
            if second_dir.is_dir():
                check_draft(second_dir, target)
            else:  # a GGUF draft (Lucebox's layout, `models convert-draft`)
                check_gguf_draft(second_dir, target)
        except UserError as exc:
            raise UserError(f"draft {spec.second_model!r} does not fit target {spec.model!r}: {exc.message}",
                            where=where, hint=exc.hint) from None
    if spec.engine_type == "pflash" and second_dir.is_dir() and not (second_dir / "tokenizer.json").is_file():
        raise UserError(f"drafter {spec.second_model!r} has no tokenizer.json: the prompt is bridged through text",
                        where=where)
