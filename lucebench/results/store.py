"""Writing results.json so that nothing measured is ever lost: atomic replace after every cell."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from lucebench.errors import UserError
from lucebench.results.schema import Result


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_atomic(result: Result, path: Path) -> None:
    """Write `result` to `path` via a temporary file in the same folder and an atomic rename.

    A crash or Ctrl-C mid-write leaves the previous complete file in place, never a truncated one.
    """
    data = result.model_dump(mode="json", by_alias=True, exclude_none=False)
    fd, tmp = tempfile.mkstemp(prefix=".results.", suffix=".json.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            # mkstemp creates 0600; a result is for sharing, so it gets what the umask gives any new file (0644).
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def ensure_writable_dir(out_dir: Path) -> None:
    """Create the output folder and prove it is writable before anything is measured."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-probe.", delete=True)
        probe.close()
    except OSError as exc:
        raise UserError(f"output folder is not writable: {exc.strerror or exc}", where=str(out_dir),
                        hint="choose another folder with --out") from None
