"""PowerLimitGuard against the simulated NVML: refusals, restore on every exit path, crash journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lucebench.measure.fake import FakeGpu, FakeNvmlBackend, no_nvml_backend
from lucebench.measure.nvml import NVML_ERROR_UNKNOWN, Nvml
from lucebench.measure.power_limit import PowerLimitError, PowerLimitGuard, recover_stale_power_limits

REPO = Path(__file__).resolve().parents[2]


def setup(tmp_path, **kw):
    backend = FakeNvmlBackend([FakeGpu(**kw)])
    return backend, PowerLimitGuard(0, Nvml(backend), journal_dir=tmp_path / "journal")


def test_apply_reads_back_and_restores_on_exit(tmp_path):
    backend, guard = setup(tmp_path)
    with guard:
        state = guard.apply(350.0, allowed=True)
        assert (state.requested_limit_w, state.applied, state.limit_w, state.default_limit_w) == (350, True, 350, 700)
        assert guard.changed and guard.journal_path.exists()
        guard.apply(300.0, allowed=True)
        assert guard.original_w == 700.0  # the first original, not the previous step
    assert backend.set_calls == [(0, 350_000), (0, 300_000), (0, 700_000)]
    assert not guard.journal_path.exists() and not guard.changed
    assert guard.restore() is False and len(backend.set_calls) == 3  # idempotent


def test_restore_after_exception(tmp_path):
    backend, guard = setup(tmp_path)
    with pytest.raises(RuntimeError), guard:
        guard.apply(400.0, allowed=True)
        raise RuntimeError("engine crashed")
    assert backend.gpus[0].limit_mw == 700_000


def test_not_allowed_never_sets(tmp_path):
    backend, guard = setup(tmp_path)
    with guard, pytest.raises(PowerLimitError) as exc:
        guard.apply(300.0, allowed=False)
    assert exc.value.kind == "not_allowed" and "not allowed" in exc.value.reason
    assert backend.set_calls == [] and "set_power_limit_mw" not in backend.calls
    assert not guard.journal_path.exists()


def test_value_already_in_effect_needs_no_permission(tmp_path):
    backend, guard = setup(tmp_path, can_set_limit=False)
    with guard:
        state = guard.apply(700.0, allowed=False)
    assert state.applied and state.limit_w == 700.0 and backend.set_calls == []


def test_permission_error(tmp_path):
    backend, guard = setup(tmp_path, can_set_limit=False)
    with guard:
        with pytest.raises(PowerLimitError) as exc:
            guard.apply(300.0, allowed=True)
        assert exc.value.kind == "no_permission" and "root" in exc.value.reason
        assert not guard.changed and not guard.journal_path.exists()
    assert backend.gpus[0].limit_mw == 700_000


@pytest.mark.parametrize("watts", [150.0, 701.0])
def test_out_of_range(tmp_path, watts):
    backend, guard = setup(tmp_path)
    with guard, pytest.raises(PowerLimitError) as exc:
        guard.apply(watts, allowed=True)
    assert exc.value.kind == "out_of_range" and "200..700 W" in exc.value.reason
    assert backend.set_calls == []


def test_unavailable_and_failing_set(tmp_path):
    guard = PowerLimitGuard(0, Nvml(no_nvml_backend()), journal_dir=tmp_path)
    with pytest.raises(PowerLimitError) as exc:
        guard.apply(300.0, allowed=True)
    assert exc.value.kind == "unavailable"
    backend, guard = setup(tmp_path)
    backend.fail["set_power_limit_mw"] = NVML_ERROR_UNKNOWN
    with pytest.raises(PowerLimitError) as exc:
        guard.apply(300.0, allowed=True)
    assert exc.value.kind == "failed" and not guard.changed


def test_failed_restore_keeps_journal(tmp_path):
    backend, guard = setup(tmp_path)
    guard.apply(300.0, allowed=True)
    backend.fail["set_power_limit_mw"] = NVML_ERROR_UNKNOWN
    assert guard.restore() is False and guard.changed and guard.journal_path.exists()
    del backend.fail["set_power_limit_mw"]
    assert guard.restore() is True and not guard.journal_path.exists()


def test_signal_handlers_installed_only_while_changed(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    _backend, guard = setup(tmp_path)
    with guard:
        guard.apply(300.0, allowed=True)
        assert signal.getsignal(signal.SIGTERM) == guard._on_signal
    assert signal.getsignal(signal.SIGTERM) == before


# ------------------------------------------------------------------ subprocess: signals, atexit, SIGKILL
CHILD = textwrap.dedent("""
    import sys, time
    from lucebench.measure.fake import FakeGpu, FakeNvmlBackend
    from lucebench.measure.nvml import Nvml
    from lucebench.measure.power_limit import PowerLimitGuard
    state, journal, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    guard = PowerLimitGuard(0, Nvml(FakeNvmlBackend([FakeGpu()], state_file=state)), journal_dir=journal)
    if mode == "atexit":
        guard.apply(250.0, allowed=True)
        print("applied", flush=True)
        sys.stdin.readline()  # the parent checks the changed limit first
        sys.exit(3)  # leaves without the with-block: only atexit can restore
    with guard:
        guard.apply(250.0, allowed=True)
        print("applied", flush=True)
        time.sleep(60)
""")


def interactive_sigint() -> None:
    """The child takes SIGINT as a terminal user's Ctrl-C, also when pytest itself was started in the background
    by a shell without job control (which starts it with SIGINT ignored, a disposition children inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_child(tmp_path, mode):
    state, journal = tmp_path / "nvml.json", tmp_path / "journal"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(state), str(journal), mode], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=interactive_sigint)
    assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
    assert json.loads(state.read_text())["limits_mw"] == [250_000]
    return proc, state, journal


def limits(state):
    return json.loads(state.read_text())


@pytest.mark.parametrize("sig, expect_rc", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM)])
def test_restore_on_signal_in_subprocess(tmp_path, sig, expect_rc):
    proc, state, journal = start_child(tmp_path, "signal")
    proc.send_signal(sig)
    rc = proc.wait(timeout=20)
    assert rc == expect_rc  # the process still dies of the signal (KeyboardInterrupt for SIGINT), after restoring
    data = limits(state)
    assert data["limits_mw"] == [700_000]
    assert data["set_calls"] == [[0, 250_000], [0, 700_000]]  # restored exactly once
    assert list(journal.glob("*.json")) == []


def test_restore_at_interpreter_exit(tmp_path):
    proc, state, _journal = start_child(tmp_path, "atexit")
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    assert proc.wait(timeout=20) == 3
    assert limits(state)["limits_mw"] == [700_000]


def test_sigkill_is_recovered_from_the_journal(tmp_path):
    proc, state, journal = start_child(tmp_path, "signal")
    proc.kill()
    proc.wait(timeout=20)
    assert limits(state)["limits_mw"] == [250_000]  # SIGKILL cannot be caught
    assert len(list(journal.glob("*.json"))) == 1
    nv = Nvml(FakeNvmlBackend([FakeGpu()], state_file=state))
    actions = recover_stale_power_limits(nv, journal)
    assert len(actions) == 1 and "restored GPU 0 to 700.0 W" in actions[0]
    assert limits(state)["limits_mw"] == [700_000] and list(journal.glob("*.json")) == []


def test_next_guard_adopts_a_dead_processs_original(tmp_path):
    proc, state, journal = start_child(tmp_path, "signal")
    proc.kill()
    proc.wait(timeout=20)
    nv = Nvml(FakeNvmlBackend([FakeGpu()], state_file=state))
    with PowerLimitGuard(0, nv, journal_dir=journal) as guard:
        guard.apply(300.0, allowed=True)
        assert guard.original_w == 700.0  # not the 250 W the dead process left
    assert limits(state)["limits_mw"] == [700_000]


def test_live_holder_makes_the_gpu_busy(tmp_path):
    proc, state, journal = start_child(tmp_path, "signal")
    try:
        nv = Nvml(FakeNvmlBackend([FakeGpu()], state_file=state))
        guard = PowerLimitGuard(0, nv, journal_dir=journal)
        with pytest.raises(PowerLimitError) as exc:
            guard.apply(300.0, allowed=True)
        assert exc.value.kind == "busy" and str(proc.pid) in exc.value.reason
        guard.restore()
        assert len(list(journal.glob("*.json"))) == 1  # the holder's journal is not ours to remove
        assert recover_stale_power_limits(nv, journal) == []
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert limits(state)["limits_mw"] == [700_000]


def test_journal_from_an_earlier_boot_is_dropped(tmp_path):
    backend, guard = setup(tmp_path)
    path = guard.journal_path
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": 1, "boot_id": "another-boot", "device_index": 0, "original_w": 500.0}))
    with guard:
        guard.apply(300.0, allowed=True)
        assert guard.original_w == 700.0
    assert backend.gpus[0].limit_mw == 700_000
