"""Running untrusted generated code (HumanEval completions) in a separate, confined process.

Two stages, no preexec_fn (unsafe with threads): the parent starts this interpreter with `_STAGE1`, which
confines itself and then exec()s a fresh interpreter that runs the program (read from stdin).

Isolation `namespace` (root with CAP_SYS_ADMIN; this workplace and CI): new network namespace (no
interfaces up: no network at all) and a private mount namespace in which every mount is remounted
read-only, fresh tmpfs on /tmp, /var/tmp and /dev/shm, the interpreter bind-mounted read-only at
/tmp/.python, the work dir /tmp/work (the only writable place), privileges dropped to `nobody`.
Isolation `guard` (elsewhere): a throw-away temp dir as cwd, `nobody` when root and the interpreter is
reachable for it, and an in-process reliability guard (writes outside the work dir, sockets, process
creation, deletions refused), like human-eval's reliability_guard: it stops accidents, not an attacker.
Both: RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC, no core files, a wall-clock limit that kills
the process group, and stdout/stderr into size-limited files.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["namespace", "guard"]

# Stage 1: runs as the caller (root or not), confines, then execs stage 2. Config comes as argv[1] (JSON).
_STAGE1 = r'''
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def fail(msg):
    sys.stderr.write("sandbox setup: " + msg + "\n"); os._exit(121)
def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        return ctypes.get_errno()
    return 0
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
exe, env = cfg["exe"], dict(cfg["env"])
if cfg["probe"]:
    ok = libc.unshare(0x40000000 | 0x00020000) == 0 and mount(None, "/", None, MS_REC | MS_PRIVATE) == 0
    print("namespace" if ok else "guard"); sys.exit(0)
if cfg["isolation"] == "namespace":
    if libc.unshare(0x40000000 | 0x00020000) != 0:  # CLONE_NEWNET | CLONE_NEWNS
        fail("unshare failed, errno %d" % ctypes.get_errno())
    if mount(None, "/", None, MS_REC | MS_PRIVATE):
        fail("cannot make mounts private")
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            points.append(line.split()[4].replace("\\040", " "))
    for p in points:  # read-only everywhere; failures (e.g. special file systems) leave that mount as it was
        mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    for p in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(p) and mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=755"):
            fail("cannot mount tmpfs on " + p)
    os.mkdir("/tmp/.python")
    if mount(cfg["prefix"], "/tmp/.python", None, MS_BIND | MS_REC) or \
            mount(None, "/tmp/.python", None, MS_REMOUNT | MS_BIND | MS_RDONLY):
        fail("cannot bind the interpreter")
    # The interpreter may sit under a folder `nobody` cannot enter (/root); its bound copy is reachable.
    exe = "/tmp/.python/" + os.path.relpath(cfg["exe_real"], cfg["prefix"])
    env["LD_LIBRARY_PATH"] = "/tmp/.python/lib"
    os.mkdir("/tmp/work", 0o700)
    workdir = "/tmp/work"
else:
    workdir = cfg["workdir"]
if cfg["uid"] is not None:
    os.chown(workdir, cfg["uid"], cfg["gid"])
os.chdir(workdir)
env["HOME"] = workdir
limits = [(resource.RLIMIT_AS, cfg["memory_bytes"]), (resource.RLIMIT_CPU, cfg["cpu_s"]),
          (resource.RLIMIT_FSIZE, cfg["fsize_bytes"]), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, 64)]
for which, value in limits:
    resource.setrlimit(which, (value, value))
if cfg["uid"] is not None:
    os.setgroups([]); os.setgid(cfg["gid"]); os.setuid(cfg["uid"])
os.execve(exe, [exe, "-I", "-S", "-B", "-c", cfg["stage2"]], env)
'''

# Stage 2: the confined interpreter. Reads "<nonce>\n<guard 0|1>\n<program>" from stdin, runs the program
# and prints the nonce only if the program returned normally (an early sys.exit(0) is not a pass).
_STAGE2 = r'''
import sys
def _main():
    nonce, guard, program = sys.stdin.buffer.read().decode("utf-8").split("\n", 2)
    if guard == "1":
        _guard()
    exec(compile(program, "<candidate>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    sys.stdout.flush()
    sys.stdout.write("\n" + nonce + "\n")
    sys.stdout.flush()
def _guard():
    import builtins, io, os, shutil, socket, subprocess
    root = os.path.realpath(os.getcwd())
    def inside(path):
        if isinstance(path, int):
            return True
        real = os.path.realpath(os.fspath(path))
        return real == root or real.startswith(root + os.sep)
    real_open, real_os_open = builtins.open, os.open
    def open_(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and not inside(file):
            raise PermissionError("sandbox: no writing outside the work dir: %r" % (file,))
        return real_open(file, mode, *a, **k)
    def os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND) and not inside(path):
            raise PermissionError("sandbox: no writing outside the work dir: %r" % (path,))
        return real_os_open(path, flags, *a, **k)
    builtins.open = io.open = open_
    os.open = os_open
    real_mkdir = os.mkdir
    def mkdir(path, *a, **k):
        if not inside(path):
            raise PermissionError("sandbox: no writing outside the work dir: %r" % (path,))
        return real_mkdir(path, *a, **k)
    os.mkdir = mkdir
    def refuse(name):
        def f(*a, **k):
            raise PermissionError("sandbox: %s is disabled" % name)
        return f
    for name in ("remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "truncate", "chmod",
                 "chown", "lchown", "link", "symlink", "kill", "killpg", "fork", "forkpty", "system", "popen",
                 "execv", "execve", "execl", "execle", "execlp", "execvp", "execvpe", "spawnv", "spawnve",
                 "putenv", "setuid", "chroot", "fchdir", "chdir"):
        if hasattr(os, name):
            setattr(os, name, refuse("os." + name))
    shutil.rmtree = refuse("shutil.rmtree"); shutil.move = refuse("shutil.move")
    subprocess.Popen = refuse("subprocess.Popen")
    class NoSocket(socket.socket):
        def __init__(self, *a, **k):
            raise PermissionError("sandbox: network access is disabled")
    socket.socket = NoSocket
    socket.create_connection = refuse("socket.create_connection")
    socket.socketpair = refuse("socket.socketpair")
_main()
'''


@dataclass(frozen=True)
class RunResult:
    """The outcome of one confined run."""

    status: Literal["passed", "failed", "timeout"]
    exit_code: int | None
    stdout: str  # tails, for diagnosis
    stderr: str
    isolation: Isolation

    @property
    def passed(self) -> bool:
        """True when the program ran to its end without an exception."""
        return self.status == "passed"


@functools.lru_cache(maxsize=1)
def available_isolation() -> Isolation:
    """`namespace` when this process may create network and mount namespaces, else `guard` (probed once)."""
    if not sys.platform.startswith("linux"):
        return "guard"
    cfg = {"probe": True, "exe": sys.executable, "env": {}}
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", _STAGE1, json.dumps(cfg)],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "guard"
    return "namespace" if out.stdout.strip() == "namespace" else "guard"


def _nobody() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return None


def _reachable_by_others(path: str) -> bool:
    # Every folder above must be enterable by "other" for a dropped-privilege process to exec the file.
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o005 == 0o005)


def run_program(program: str, *, timeout_s: float = 10.0, memory_mb: int = 1024,
                isolation: Isolation | None = None) -> RunResult:
    """Run Python source in a confined child; passed = it ran to its end (exceptions and exit() fail).

    `isolation` None picks the strongest available; "guard" forces the fallback (tests use it).
    """
    iso = isolation or available_isolation()
    exe_real = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    ids = _nobody()
    if iso == "guard" and ids is not None and not _reachable_by_others(exe_real):
        ids = None  # nobody could not even start the interpreter; the guard has to do
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="lucebench-sandbox-") as tmp:
        workdir = os.path.join(tmp, "work")
        os.mkdir(workdir, 0o700)
        cfg = {
            "probe": False, "isolation": iso, "exe": exe_real if iso == "guard" else sys.executable,
            "exe_real": exe_real, "prefix": prefix if exe_real.startswith(prefix + os.sep) else os.path.dirname(exe_real),
            "workdir": workdir, "uid": ids[0] if ids else None, "gid": ids[1] if ids else None,
            "memory_bytes": memory_mb << 20, "cpu_s": math.ceil(timeout_s) + 1, "fsize_bytes": 16 << 20,
            "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8"},
            "stage2": _STAGE2,
        }
        if iso == "guard" and exe_real != sys.executable and not exe_real.startswith(prefix + os.sep):
            cfg["exe"] = sys.executable
        payload = f"{nonce}\n{1 if iso == 'guard' else 0}\n{program}".encode()
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", _STAGE1, json.dumps(cfg)],
                                    stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True,
                                    cwd=tmp, env=cfg["env"])
            timed_out = False
            try:
                proc.communicate(payload, timeout=timeout_s + 1)  # + start-up of two interpreters
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        stdout = _tail(out_path)
        stderr = _tail(err_path)
    if timed_out or proc.returncode == -signal.SIGXCPU:  # wall clock or CPU-time limit
        return RunResult("timeout", None, stdout, stderr, iso)
    ok = proc.returncode == 0 and stdout.rstrip().endswith(nonce)
    return RunResult("passed" if ok else "failed", proc.returncode, stdout.replace(nonce, "").rstrip(), stderr, iso)


def _kill_group(proc: subprocess.Popen) -> None:
    # The child leads its own session/process group; whatever it spawned goes with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _tail(path: str, limit: int = 4000) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode("utf-8", "replace")
