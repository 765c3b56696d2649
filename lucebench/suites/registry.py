"""Finding suite definitions: the repository's suites/ folder, LUCEBENCH_SUITES_DIR, or a path.

Names `pp{N}` and `tg{N}` without a file of their own are the `pp` / `tg` family files with
`length: N`, so a context sweep needs no file per length.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from lucebench.errors import UserError
from lucebench.suites.spec import SuiteSpec, load_suite_file

ENV_SUITES_DIR = "LUCEBENCH_SUITES_DIR"
_FAMILY = re.compile(r"^(pp|tg)(\d+)$")


@dataclass(frozen=True)
class SuiteRef:
    """A suite found on disk: its name, file and parsed definition."""

    name: str
    path: Path
    spec: SuiteSpec


def repo_root() -> Path:
    """The repository (or source tree) that holds the installed package."""
    return Path(__file__).resolve().parents[2]


def suite_dirs() -> list[Path]:
    """Folders searched for `<name>.yaml`, first match wins: LUCEBENCH_SUITES_DIR entries, then suites/."""
    dirs = [Path(p) for p in os.environ.get(ENV_SUITES_DIR, "").split(os.pathsep) if p]
    dirs.append(repo_root() / "suites")
    return [d for d in dirs if d.is_dir()]


def _files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in suite_dirs():
        for f in sorted(d.glob("*.yaml")):
            found.setdefault(f.stem, f)
    return found


def list_suites() -> list[SuiteRef]:
    """Every suite definition that can be found, sorted by name (families `pp`, `tg` included)."""
    refs = []
    for name, path in sorted(_files().items()):
        spec = load_suite_file(path)
        if spec.name != name:
            raise UserError(f"suite file declares name {spec.name!r}", where=str(path),
                            hint=f"the name must match the file name: {name!r}")
        refs.append(SuiteRef(name=name, path=path, spec=spec))
    return refs


def resolve_suite(suite: str) -> SuiteRef:
    """A suite by name (`gsm8k`, `pp2048`, `tg64`) or by path to a suite YAML file."""
    if suite.endswith((".yaml", ".yml")) or os.sep in suite or "/" in suite:
        path = Path(suite)
        return SuiteRef(name=path.stem, path=path, spec=load_suite_file(path))
    files = _files()
    if suite in files:
        spec = load_suite_file(files[suite])
        if spec.name != suite:
            raise UserError(f"suite file declares name {spec.name!r}", where=str(files[suite]),
                            hint=f"the name must match the file name: {suite!r}")
        return SuiteRef(name=suite, path=files[suite], spec=spec)
    m = _FAMILY.match(suite)
    if m and m.group(1) in files:
        family = load_suite_file(files[m.group(1)])
        if family.synthetic is None or family.synthetic.mode != m.group(1):
            raise UserError(f"{m.group(1)}.yaml is not a {m.group(1)} synthetic suite", where=str(files[m.group(1)]))
        length = int(m.group(2))
        if length < 1:
            raise UserError(f"suite {suite!r}: the length must be at least 1")
        spec = family.model_copy(update={
            "name": suite,
            "synthetic": family.synthetic.model_copy(update={"length": length}),
            "n_gen": 1 if m.group(1) == "pp" else length + 1,
        })
        return SuiteRef(name=suite, path=files[m.group(1)], spec=spec)
    known = sorted(files) + [f"{f}{{N}}" for f in ("pp", "tg") if f in files]
    raise UserError(f"unknown suite {suite!r}", hint=f"known suites: {', '.join(known) or '(none found)'}; "
                    f"or give the path of a suite YAML; extra folders via {ENV_SUITES_DIR}")
