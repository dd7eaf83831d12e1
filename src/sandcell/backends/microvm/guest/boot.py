"""The guest's boot, before any host: mounts, the cgroup hierarchy, and the runner started.

The runner (``/opt/sandcell/runner.py``, the runtime's interpreter) imports the preload modules
named on the kernel command line (``sandcell.preload=``) and says ``R`` on its socket; a VM
saved as a snapshot is saved after this, so no run pays for it.
"""

from __future__ import annotations

import os
import socket

from .cgroup import CG, PROG_CG
from .system import MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_REMOUNT, mount, write_file

RUNNER = "/opt/sandcell/runner.py"
INTERPRETER_FILE = "/opt/sandcell/interpreter"
"""Names the runtime's interpreter at its neutral path (/opt/sandcell/venv/bin/python for a
venv); written by the image build."""


def cmdline_preload() -> str:
    """The comma-separated modules of ``sandcell.preload=`` on the kernel command line."""
    try:
        with open("/proc/cmdline") as f:
            words = f.read().split()
    except OSError:
        return ""
    for w in words:
        if w.startswith("sandcell.preload="):
            return w.partition("=")[2]
    return ""


def boot() -> tuple[int, socket.socket]:
    """Mount what the agent needs and start the runner: its pid, and the agent's end of its
    socket, once it said it is ready."""
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    # Allocations succeed and the program's cgroup limit decides (an OOM kill, reported as
    # memory_limit), as on the host, instead of a MemoryError from the guest's small RAM.
    write_file("/proc/sys/vm/overcommit_memory", "1")
    mount("cgroup2", CG, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    write_file(CG + "/cgroup.subtree_control", "+memory +pids +cpu")
    os.mkdir(PROG_CG)
    # The program sees only its own processes, not the guest's kernel threads or the agent
    # (set here, before the snapshot: no run pays for it).
    mount("proc", "/proc", "proc", MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    os.makedirs("/dev/shm", mode=0o755, exist_ok=True)
    # Terminals for a session's PTY processes: the devtmpfs /dev/ptmx opens the devpts instance
    # mounted beside it (a guest of its own, so nothing of the host's terminals is in it).
    os.makedirs("/dev/pts", mode=0o755, exist_ok=True)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "mode=0620,ptmxmode=0666")
    # What the loopback bridge needs beyond the agent's own imports, loaded before a snapshot:
    # a run's bridge, forked from here, then starts without importing it.
    __import__("threading")
    # The runner starts in the program's cgroup, so that what it imports before the job (the
    # preload) is charged to the program, as the namespaces backend's template memory is not.
    sock_agent, sock_runner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/.matplotlib",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "SANDCELL_PRELOAD": cmdline_preload(),
        "HOME": "/tmp",
    }
    with open(INTERPRETER_FILE) as f:
        python = f.read().strip()
    pid = os.fork()
    if pid == 0:
        try:
            sock_agent.close()
            write_file(PROG_CG + "/cgroup.procs", str(os.getpid()))
            os.dup2(sock_runner.fileno(), 3, inheritable=True)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execve(python, [python, "-I", RUNNER, "3"], env)
        finally:
            os._exit(127)
    sock_runner.close()
    ready = sock_agent.recv(64)
    if not ready.startswith(b"R"):
        raise RuntimeError(f"the runner failed to start: {ready[:200]!r}")
    return pid, sock_agent
