"""The device check scripts' engine client: lucebench's own protocol client (lucebench.runner.process),
with a one-call-per-generation interface. Engine stderr goes to $OUT/engine-logs/<binary>.log."""

from __future__ import annotations

import os
from pathlib import Path

from lucebench.runner.process import EngineProcess

TIMEOUT_S = 600.0  # a load or one generation; a hang ends as EngineError("timeout") instead of blocking


class Engine:
    def __init__(self, exe: Path, model: Path, *extra: str, env: dict | None = None):
        logs = Path(os.environ.get("OUT", "/tmp/out")) / "engine-logs"
        self.proc = EngineProcess([str(exe), "--model", str(model), *extra], log_path=logs / f"{exe.name}.log", env=env)
        try:
            self.ready = self.proc.wait_ready(TIMEOUT_S)
        except Exception:
            self.proc.close()
            raise

    def gen(self, prompt: list[int], n: int, timeout_s: float = TIMEOUT_S, **kw) -> dict:
        """One greedy generation; an engine error raises lucebench.errors.EngineError (kind "timeout", the
        engine killed, when it takes longer than timeout_s)."""
        return self.proc.request({"type": "generate", "id": "x", "prompt_ids": prompt, "n_gen": n, **kw}, timeout_s)

    def close(self) -> None:
        self.proc.close()
