"""The machine's CPU load while a CPU cell runs: other processes' CPU time, from /proc.

A CPU engine shares the cores with everything else on the machine; a busy neighbour slows it without any
error (a 2-core machine under a parallel build measured `ar` pp64 43x slower). So every CPU cell records
how much CPU time processes other than its engine and the harness took while it ran, and is flagged
`contaminated` when that exceeds CONTAMINATED_FRACTION of the machine, as GPU cells record other
processes on their card.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from lucebench.results.schema import CpuLoad

#: Other processes' share of the machine's CPU time above which a CPU cell's numbers are not the machine's.
CONTAMINATED_FRACTION = 0.10
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcTimes:
    comm: str
    session: int
    ticks: int  # user + system CPU time, in clock ticks
    start: int = 0  # start time after boot, in clock ticks: tells a reused pid from the same process


def read_stat(text: str) -> ProcTimes | None:
    """One /proc/<pid>/stat line -> (command, session, utime + stime); None when malformed."""
    try:
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        # fields[0] is field 3 (state): session is field 6, utime 14, stime 15, starttime 22
        return ProcTimes(comm=comm, session=int(fields[3]), ticks=int(fields[11]) + int(fields[12]),
                         start=int(fields[19]))
    except (ValueError, IndexError):
        return None


def snapshot(proc: Path = _PROC) -> dict[int, ProcTimes]:
    """CPU time of every process readable now (processes that vanish while read are left out)."""
    out: dict[int, ProcTimes] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            parsed = read_stat((entry / "stat").read_text())
        except OSError:
            continue
        if parsed is not None:
            out[int(entry.name)] = parsed
    return out


def other_usage(before: dict[int, ProcTimes], after: dict[int, ProcTimes], *, exclude_pids: set[int],
                exclude_sessions: set[int]) -> dict[int, tuple[str, int]]:
    """pid -> (command, CPU ticks used between the snapshots) for the processes not excluded.

    A process that started between the snapshots counts all its time; one that ended is not seen.
    """
    used: dict[int, tuple[str, int]] = {}
    for pid, now in after.items():
        if pid in exclude_pids or now.session in exclude_sessions:
            continue
        then = before.get(pid)
        # the same process (kernel threads rename themselves, so the start time decides, not the name)
        delta = now.ticks - then.ticks if then is not None and then.start == now.start else now.ticks
        if delta > 0:
            used[pid] = (now.comm, delta)
    return used


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class CpuLoadProbe:
    """Start before a CPU cell's measurement, stop after it: what else used the machine's CPU meanwhile."""

    def __init__(self, *, engine_session: int | None, proc: Path = _PROC):
        self.proc = proc
        self.exclude_pids = {os.getpid()}
        self.exclude_sessions = {engine_session} if engine_session is not None else set()
        self.before = snapshot(proc)
        self.loadavg_before = _loadavg()
        self.t0 = time.monotonic()

    def stop(self) -> CpuLoad:
        wall = max(time.monotonic() - self.t0, 1e-3)
        used = other_usage(self.before, snapshot(self.proc), exclude_pids=self.exclude_pids,
                           exclude_sessions=self.exclude_sessions)
        return summarize(used, wall_s=wall, cpu_count=os.cpu_count() or 1, loadavg_before=self.loadavg_before,
                         loadavg_after=_loadavg())


def summarize(used: dict[int, tuple[str, int]], *, wall_s: float, cpu_count: int, loadavg_before: float | None,
              loadavg_after: float | None, ticks_per_s: int = _TICKS) -> CpuLoad:
    """The CpuLoad record: other processes' cores in use on average, their share, the busiest few."""
    cores = sum(t for _, t in used.values()) / ticks_per_s / wall_s
    fraction = min(cores / cpu_count, 1.0)
    busiest = sorted(used.items(), key=lambda kv: -kv[1][1])[:5]
    top = [f"pid {pid} {comm}: {ticks / ticks_per_s / wall_s:.2f} cores" for pid, (comm, ticks) in busiest
           if ticks / ticks_per_s / wall_s >= 0.01]
    return CpuLoad(cpu_count=cpu_count, window_s=round(wall_s, 3), other_cores=round(cores, 3),
                   other_fraction=round(fraction, 4), contaminated=fraction > CONTAMINATED_FRACTION,
                   loadavg_1m_before=loadavg_before, loadavg_1m_after=loadavg_after, other_processes=top)
