"""lucebench.measure.cpu_load: other processes' CPU time while a CPU cell measures, and the contaminated flag."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from lucebench.measure.cpu_load import CONTAMINATED_FRACTION, CpuLoadProbe, ProcTimes, other_usage, read_stat, summarize


def test_read_stat_handles_spaces_and_parentheses_in_the_command():
    line = "4242 (my (odd) proc) R 1 4242 4240 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 1000 0 0"
    assert read_stat(line) == ProcTimes(comm="my (odd) proc", session=4240, ticks=300, start=1000)
    assert read_stat("garbage") is None


def test_other_usage_leaves_out_the_engine_session_and_the_harness():
    before = {1: ProcTimes("engine", 1, 100), 2: ProcTimes("child", 1, 10), 3: ProcTimes("make", 9, 50),
              4: ProcTimes("harness", 7, 0)}
    after = {1: ProcTimes("engine", 1, 500), 2: ProcTimes("child", 1, 90), 3: ProcTimes("make", 9, 250),
             4: ProcTimes("harness", 7, 40), 5: ProcTimes("cc1plus", 9, 30)}
    used = other_usage(before, after, exclude_pids={4}, exclude_sessions={1})
    assert used == {3: ("make", 200), 5: ("cc1plus", 30)}  # a process born in the window counts all its time


def test_a_kernel_thread_that_renames_itself_is_the_same_process():
    before = {32: ProcTimes("kworker/u8:1-writeback", 0, 50_000, start=7)}
    after = {32: ProcTimes("kworker/u8:1-iou_exit", 0, 50_010, start=7),
             33: ProcTimes("reused", 0, 40, start=900)}
    before[33] = ProcTimes("old", 0, 30_000, start=8)  # pid 33 ended and was reused: count the new one's time
    assert other_usage(before, after, exclude_pids=set(), exclude_sessions=set()) == {
        32: ("kworker/u8:1-iou_exit", 10), 33: ("reused", 40)}


def test_summarize_flags_a_busy_machine():
    busy = summarize({3: ("make", 200)}, wall_s=1.0, cpu_count=2, loadavg_before=0.1, loadavg_after=2.0,
                     ticks_per_s=100)
    assert busy.other_cores == 2.0 and busy.other_fraction == 1.0 and busy.contaminated
    assert busy.other_processes == ["pid 3 make: 2.00 cores"]
    quiet = summarize({3: ("sshd", 1)}, wall_s=10.0, cpu_count=2, loadavg_before=None, loadavg_after=None,
                      ticks_per_s=100)
    assert quiet.other_fraction < CONTAMINATED_FRACTION and not quiet.contaminated


def test_probe_sees_a_spinning_neighbour():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    try:
        time.sleep(0.2)
        probe = CpuLoadProbe(engine_session=None)
        time.sleep(1.5)
        load = probe.stop()
    finally:
        spinner.kill()
        spinner.wait()
    assert load.cpu_count == os.cpu_count()
    assert load.other_cores > 0.2 and any(f"pid {spinner.pid} " in p for p in load.other_processes)
    # the same neighbour inside the engine's session is the engine's own work
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"],
                               start_new_session=True)
    try:
        time.sleep(0.2)
        probe = CpuLoadProbe(engine_session=spinner.pid)
        time.sleep(1.0)
        load = probe.stop()
    finally:
        spinner.kill()
        spinner.wait()
    assert not any(f"pid {spinner.pid} " in p for p in load.other_processes)
