"""Models and workloads for the cells, resolved once per run and shared between cells."""

from __future__ import annotations

import json
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
                resolved = resolve_model(source.model_dump(exclude_none=True), console=self.console)
            except UserError as exc:
                exc.where = exc.where or f"config models.{name}"
                raise
            path = Path(resolved.path)
            facts = _model_facts(path)
            self._models[name] = PreparedModel(path=path, info=ModelInfo(
                name=name, path=str(path), files=hash_model_files(path), synthetic=source.synth is not None
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
