"""Escapes through /proc: the sandbox sees its own pid namespace only, and nothing writable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import Attack


def test_blocks_host_init_in_proc1(attack: Attack) -> None:
    host_init = Path("/proc/1/cmdline").read_bytes()
    assert host_init, "the host's /proc/1/cmdline is empty; nothing to compare with"
    microvm = attack.sandbox.backend == "microvm"
    # The wasm rung has no processes: Pyodide's /proc holds only self/fd, no pid 1 at all.
    hidden = microvm or attack.sandbox.backend == "wasm"
    body = f"""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            inner = f.read()
    except FileNotFoundError:
        if not {hidden!r}:
            raise
        # The guest's pid 1 is the agent, hidden from the program (hidepid=invisible): it is
        # not even the host's pid 1 by number, and the guest kernel has no host process at all.
        inner = None
    if inner is None:
        blocked("/proc/1 is the host's init", "ENOENT: the guest's pid 1 is hidden")
    elif inner == {host_init!r}:
        breach(f"/proc/1 is the host's init: {{inner[:200]!r}}")
    else:
        first = inner.split(bytes(1))[0]
        blocked("/proc/1 is the host's init", f"it is {{first[-40:]!r}}")
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)


def test_blocks_host_pid_view(attack: Attack) -> None:
    body = """
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    if len(pids) >= 10:
        breach(f"{len(pids)} processes visible: {pids[:30]}")
    else:
        blocked("see the host's processes", f"only {pids}")
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)


def test_blocks_host_process_by_pid(attack: Attack) -> None:
    """The test process's own pid, looked up inside, is not this process."""
    pid = os.getpid()
    mine = Path(f"/proc/{pid}/cmdline").read_bytes()
    body = f"""
    try:
        with open("/proc/{pid}/cmdline", "rb") as f:
            inner = f.read()
    except OSError as exc:
        blocked("open the host test process in /proc", errname(exc))
    else:
        if inner == {mine!r}:
            breach("/proc/{pid} is the host's test process")
        else:
            blocked("open the host test process in /proc", "a different process")
    attempt("read /proc/{pid}/environ", lambda: open("/proc/{pid}/environ", "rb").read(200))
    attempt("read /proc/{pid}/mem", lambda: open("/proc/{pid}/mem", "rb").read(1))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=3)


def test_blocks_proc_kcore(attack: Attack) -> None:
    body = """
    attempt("read /proc/kcore", lambda: open("/proc/kcore", "rb").read(64))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)


def test_blocks_proc_sysrq_trigger(attack: Attack) -> None:
    # 'h' only prints help to the kernel log: harmless if it ever got through.
    body = """
    def write():
        fd = os.open("/proc/sysrq-trigger", os.O_WRONLY)
        try:
            return os.write(fd, b"h")
        finally:
            os.close(fd)
    attempt("write /proc/sysrq-trigger", write)
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)


def test_blocks_proc_sys_writes(attack: Attack) -> None:
    """/proc/sys is read-only: sysctls that would change the host (values written are the current
    ones, so a breach changes nothing)."""
    knobs = [
        "kernel/hostname", "kernel/core_pattern", "kernel/modprobe", "vm/overcommit_memory",
        "net/ipv4/ip_forward", "kernel/randomize_va_space", "fs/protected_symlinks",
    ]  # fmt: skip
    body = f"""
    for knob in {knobs!r}:
        path = "/proc/sys/" + knob
        def write(path=path):
            with open(path, "rb") as f:
                current = f.read()
            fd = os.open(path, os.O_WRONLY)
            try:
                return os.write(fd, current)
            finally:
                os.close(fd)
        attempt(f"write {{path}}", write, ok=(errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=len(knobs))
