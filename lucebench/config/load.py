"""Read a config file into a validated `Config`, with errors that name the file, line and key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from lucebench.config.schema import Config, LocatedError
from lucebench.config.yamlio import line_of, load_yaml
from lucebench.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    path: Path
    sha256: str
    raw: dict


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_config(path: Path) -> LoadedConfig:
    """Load and validate a YAML config. Every problem is reported, each with its line and key."""
    data, lines = load_yaml(path)
    if data is None:
        raise UserError("config is empty", where=str(path), hint="see configs/cpu-smoke.yaml for a minimal config")
    if not isinstance(data, dict):
        raise UserError(f"config must be a mapping at the top level, found {type(data).__name__}", where=f"{path}:1")
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            cause = (err.get("ctx") or {}).get("error")
            loc = tuple(err["loc"]) + (cause.loc if isinstance(cause, LocatedError) else ())
            line = line_of(lines, loc)
            key = _format_loc(loc)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check the spelling; docs/config.md lists the keys)"
            elif err["type"] == "missing":
                msg = "required key is missing"
            problems.append(f"{path}:{line or '?'}: {key}: {msg}")
        raise UserError("invalid config:\n  " + "\n  ".join(problems)) from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return LoadedConfig(config=config, path=path, sha256=digest, raw=data)


def find_config(name_or_path: str) -> Path:
    """A config path as given, or a bare name looked up in the repository's configs/ folder."""
    path = Path(name_or_path)
    if path.exists():
        return path
    for candidate in (CONFIGS_DIR / name_or_path, CONFIGS_DIR / f"{name_or_path}.yaml"):
        if candidate.exists():
            return candidate
    known = ", ".join(sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))) or "none"
    raise UserError("config file not found", where=name_or_path, hint=f"configs in {CONFIGS_DIR}: {known}")
