"""The HumanEval sandbox refuses writes outside its temp dir, hangs past the limit and network access."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from lucebench.suites.sandbox import available_isolation, run_program

MODES = sorted({available_isolation(), "guard"})


@pytest.mark.parametrize("isolation", MODES)
def test_a_normal_program_passes_and_may_use_its_work_dir(isolation: str) -> None:
    r = run_program("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())", isolation=isolation)
    assert r.passed and r.stdout.strip() == "ok" and r.isolation == isolation


@pytest.mark.parametrize("isolation", MODES)
def test_writing_outside_the_temp_dir_is_refused(isolation: str, tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    tmp_path.chmod(0o777)  # even a world-writable folder must stay untouched
    r = run_program(f"open({str(target)!r}, 'w').write('x')", isolation=isolation)
    assert not r.passed and not target.exists()
    r = run_program(f"import os\nos.makedirs({str(tmp_path / 'sub')!r})", isolation=isolation)
    assert not r.passed and not (tmp_path / "sub").exists()


@pytest.mark.parametrize("isolation", MODES)
def test_a_hang_is_killed_at_the_limit(isolation: str) -> None:
    import time

    start = time.monotonic()
    r = run_program("import time\nwhile True:\n    time.sleep(0.01)", timeout_s=0.5, isolation=isolation)
    assert r.status == "timeout" and time.monotonic() - start < 10
    assert run_program("while True: pass", timeout_s=0.5, isolation=isolation).status == "timeout"


@pytest.mark.parametrize("isolation", MODES)
def test_opening_a_socket_is_refused(isolation: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    r = run_program(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'x')",
                    isolation=isolation)
    # The kernel completes handshakes without accept(): a connection that got through would be queued now.
    server.setblocking(False)
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()
    assert not r.passed


@pytest.mark.parametrize("isolation", MODES)
def test_early_exit_and_memory_hogs_fail(isolation: str) -> None:
    assert not run_program("import sys\nsys.exit(0)", isolation=isolation).passed
    assert not run_program("x = bytearray(2 << 30)", memory_mb=256, isolation=isolation).passed
