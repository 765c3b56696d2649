"""The power-limit guard: the only code in lucebench that changes a GPU setting.

DESIGN.md, "Hardware safety": lucebench changes a GPU's power limit only when the config asks and the
user allows it explicitly, and restores the original value on every exit path. `PowerLimitGuard` does:

* refuse (`PowerLimitError`, with a reason the runner records on the skipped cells) when not allowed,
  when the value is outside the card's min..max, when NVML says NO_PERMISSION, or when another live
  lucebench process holds the limit of the same GPU;
* remember the original limit before the first change, and restore it on `with` exit (normal or by
  exception), on SIGINT and SIGTERM (then hands the signal on to the previous handler), and at
  interpreter exit (atexit). Restoring is idempotent;
* write a small journal file (original limit, pid, boot id) while a changed limit is in effect, so that a
  process killed by SIGKILL or power loss of the host process is cleaned up by the next guard
  (`recover_stale_power_limits` or the next `apply`). A journal from an earlier boot is dropped: the
  driver resets the limit on reboot.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from lucebench.measure.nvml import NVML_ERROR_NO_PERMISSION, Nvml, NvmlError, resolve

log = logging.getLogger(__name__)

RefusalKind = Literal["not_allowed", "no_permission", "out_of_range", "unsupported", "unavailable", "busy",
                      "failed"]
_SAME_W = 0.5  # NVML stores mW; a requested value within 0.5 W of the current one needs no change
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class PowerLimitError(Exception):
    """A power limit could not or must not be applied. ``kind`` classifies it; ``reason`` is the sentence
    to record on the skipped cells. Nothing was changed on the GPU when this is raised."""

    def __init__(self, kind: RefusalKind, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass
class LimitState:
    """The outcome of `PowerLimitGuard.apply`, with lucebench.results.schema.PowerState field names."""

    requested_limit_w: float
    applied: bool
    limit_w: float | None
    default_limit_w: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_journal_dir() -> Path:
    """$XDG_STATE_HOME/lucebench, or ~/.local/state/lucebench."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "lucebench"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class PowerLimitGuard:
    """Applies power limits to GPU ``device_index`` and guarantees the original comes back.

    Use as a context manager around all cells of a run that need limits::

        with PowerLimitGuard(0) as guard:
            try:
                state = guard.apply(250.0, allowed=config_allows and flag_given)
            except PowerLimitError as exc:
                ... skip the cells with exc.reason ...

    ``journal_dir``: where the crash journal lives (default `default_journal_dir()`); ``handle_signals``:
    install SIGINT/SIGTERM handlers while a changed limit is in effect (only possible in the main thread;
    elsewhere `with`, atexit and the journal still apply).
    """

    def __init__(self, device_index: int, nvml: Nvml | None = None, *, journal_dir: str | os.PathLike[str] | None = None,
                 handle_signals: bool = True):
        self.device_index = device_index
        self.nvml = resolve(nvml)
        self.journal_dir = Path(journal_dir) if journal_dir is not None else default_journal_dir()
        self.handle_signals = handle_signals
        self.original_w: float | None = None  # the limit to restore, known once a change was made
        self._changed = False
        self._lock = threading.RLock()
        self._prev_handlers: dict[int, Any] = {}
        self._atexit_registered = False
        self._journal_written = False
        self._journal_path: Path | None = None

    # -- context manager
    def __enter__(self) -> PowerLimitGuard:  # noqa: PYI034  (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    @property
    def journal_path(self) -> Path:
        """This GPU's journal file, named by UUID so a renumbering of GPUs cannot mix them up."""
        if self._journal_path is not None:
            return self._journal_path
        uuid = None
        if self.nvml.available:
            try:
                uuid = self.nvml.device_info(self.device_index).uuid
            except NvmlError:
                uuid = None
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", uuid or f"index{self.device_index}")
        self._journal_path = self.journal_dir / f"power-limit-{key}.json"
        return self._journal_path

    # -- apply
    def apply(self, watts: float, *, allowed: bool) -> LimitState:
        """Set the power limit to ``watts`` when ``allowed`` (config AND command-line flag), read it back.

        A value already in effect (within 0.5 W) needs no change and is accepted even when not allowed.
        Raises `PowerLimitError` (nothing changed) when not allowed, unavailable, out of the card's range,
        refused by NVML (e.g. no permission: setting limits needs root) or held by another process.
        """
        with self._lock:
            nv = self.nvml
            if not nv.available:
                raise PowerLimitError("unavailable", nv.reason or "NVML unavailable: cannot set a power limit")
            try:
                limits = nv.power_limits(self.device_index)
            except NvmlError as exc:
                raise PowerLimitError("unavailable", f"GPU {self.device_index}: {exc.message}") from exc
            if limits.current_w is None:
                raise PowerLimitError("unsupported",
                                      f"GPU {self.device_index} does not report a power limit through NVML")
            if abs(limits.current_w - watts) < _SAME_W:
                log.info("GPU %d: power limit already %.1f W; nothing to change", self.device_index, watts)
                return LimitState(watts, True, limits.current_w, limits.default_w)
            if not allowed:
                raise PowerLimitError(
                    "not_allowed",
                    f"the config asks for a {watts:g} W power limit on GPU {self.device_index} "
                    f"(now {limits.current_w:g} W), but changing GPU settings was not allowed on the command line")
            if limits.min_w is not None and limits.max_w is not None and not limits.min_w <= watts <= limits.max_w:
                raise PowerLimitError(
                    "out_of_range",
                    f"{watts:g} W is outside GPU {self.device_index}'s power limit range "
                    f"{limits.min_w:g}..{limits.max_w:g} W")
            first = not self._changed
            if first:
                original = self._adopt_journal(limits.current_w)
                self.original_w = original
                self._install_hooks()
                self._write_journal(original)
            try:
                nv.set_power_limit_w(self.device_index, watts)
            except NvmlError as exc:
                if first:  # nothing was changed: drop the hooks and the journal again
                    if self.original_w != limits.current_w:
                        # The journal carries a dead process's original that is still to be restored:
                        # keep it (with our pid, dead soon) for the next run.
                        self._journal_written = False
                    self._cleanup()
                    self.original_w = None
                if exc.code == NVML_ERROR_NO_PERMISSION:
                    raise PowerLimitError(
                        "no_permission",
                        f"no permission to set the power limit of GPU {self.device_index} "
                        "(NVML_ERROR_NO_PERMISSION: it needs root)") from exc
                raise PowerLimitError("failed", f"setting {watts:g} W on GPU {self.device_index} failed: "
                                                f"{exc.message}") from exc
            self._changed = True
            after = nv.power_limits(self.device_index)
            log.info("GPU %d: power limit set to %.1f W (read back %s W; original %.1f W)", self.device_index,
                     watts, after.current_w, self.original_w)
            if after.current_w is not None and abs(after.current_w - watts) >= _SAME_W:
                log.warning("GPU %d: requested %.1f W, the driver reports %.1f W", self.device_index, watts,
                            after.current_w)
            return LimitState(watts, True, after.current_w, after.default_w)

    # -- restore
    def restore(self) -> bool:
        """Put the original limit back if this guard changed it. Idempotent; safe from signal handlers and
        atexit. Returns True when it restored something. On failure the journal stays for the next run."""
        with self._lock:
            if not self._changed:
                self._cleanup()
                return False
            assert self.original_w is not None
            try:
                self.nvml.set_power_limit_w(self.device_index, self.original_w)
            except NvmlError as exc:
                log.error("GPU %d: could not restore the power limit to %.1f W: %s (journal kept at %s)",
                          self.device_index, self.original_w, exc.message, self.journal_path)
                return False
            self._changed = False
            log.info("GPU %d: power limit restored to %.1f W", self.device_index, self.original_w)
            self._cleanup()
            return True

    @property
    def changed(self) -> bool:
        """True while a limit set by this guard is in effect."""
        return self._changed

    # -- hooks
    def _install_hooks(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.restore)
            self._atexit_registered = True
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                if sig not in self._prev_handlers:
                    self._prev_handlers[sig] = signal.getsignal(sig)
                    signal.signal(sig, self._on_signal)

    def _cleanup(self) -> None:
        if self._atexit_registered:
            atexit.unregister(self.restore)
            self._atexit_registered = False
        if threading.current_thread() is threading.main_thread():
            for sig, prev in list(self._prev_handlers.items()):
                # Put the previous handler back only if nobody installed another one after us; otherwise
                # ours stays in the chain and, with nothing to restore, just passes the signal on.
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
                del self._prev_handlers[sig]
        if self._journal_written:  # never remove a journal another process wrote
            try:
                self.journal_path.unlink(missing_ok=True)
                self._journal_written = False
            except OSError as exc:
                log.warning("could not remove %s: %s", self.journal_path, exc)

    def _on_signal(self, signum: int, frame: Any) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        log.warning("GPU %d: %s received, restoring the power limit", self.device_index,
                    signal.Signals(signum).name)
        self.restore()  # also puts the previous handlers back
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:  # default action (terminate) with the same signal, so the exit status tells the truth
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # -- journal
    def _write_journal(self, original_w: float) -> None:
        path = self.journal_path
        data = {"pid": os.getpid(), "boot_id": _boot_id(), "device_index": self.device_index,
                "original_w": original_w, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
            self._journal_written = True
        except OSError as exc:  # the in-process restore paths still work; only SIGKILL is uncovered
            log.warning("could not write the power-limit journal %s: %s", path, exc)

    def _adopt_journal(self, current_w: float) -> float:
        """The true original limit: ``current_w``, or the original recorded by a dead process's journal
        (whose limit is still in effect). Raises PowerLimitError when a live process holds the GPU."""
        path = self.journal_path
        data = _read_journal(path)
        if data is None:
            return current_w
        if data.get("boot_id") != _boot_id():
            log.info("dropping power-limit journal %s from an earlier boot", path)
            path.unlink(missing_ok=True)
            return current_w
        pid = int(data.get("pid", -1))
        if pid == os.getpid() or _pid_alive(pid):
            raise PowerLimitError("busy", f"another lucebench process (pid {pid}) holds the power limit of GPU "
                                          f"{self.device_index}; if it is gone, delete {path}")
        original = float(data["original_w"])
        log.warning("GPU %d: process %d died with a changed power limit; the original %.1f W will be restored",
                    self.device_index, pid, original)
        return original


def _read_journal(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable power-limit journal %s: %s", path, exc)
        return None
    return data if isinstance(data, dict) and "original_w" in data else None


def recover_stale_power_limits(nvml: Nvml | None = None, journal_dir: str | os.PathLike[str] | None = None
                               ) -> list[str]:
    """Restore the limits that dead lucebench processes left changed (journal from this boot, pid gone).
    Returns one line per action. Call it at the start of a run that is allowed to change limits."""
    nv = resolve(nvml)
    directory = Path(journal_dir) if journal_dir is not None else default_journal_dir()
    actions: list[str] = []
    if not nv.available or not directory.is_dir():
        return actions
    for path in sorted(directory.glob("power-limit-*.json")):
        data = _read_journal(path)
        if data is None:
            continue
        if data.get("boot_id") != _boot_id():
            path.unlink(missing_ok=True)
            actions.append(f"dropped {path.name} (earlier boot)")
            continue
        pid = int(data.get("pid", -1))
        if _pid_alive(pid):
            continue
        index = int(data["device_index"])
        guard = PowerLimitGuard(index, nv, journal_dir=directory, handle_signals=False)
        if guard.journal_path != path:  # GPUs were renumbered: do not touch a different card
            actions.append(f"left {path.name}: GPU {index} is now a different card")
            continue
        try:
            nv.set_power_limit_w(index, float(data["original_w"]))
        except NvmlError as exc:
            actions.append(f"could not restore GPU {index} to {data['original_w']} W: {exc.message}")
            continue
        path.unlink(missing_ok=True)
        actions.append(f"restored GPU {index} to {data['original_w']} W (left by dead process {pid})")
        log.warning(actions[-1])
    return actions
