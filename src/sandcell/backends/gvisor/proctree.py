"""A process and its descendants, read from ``/proc``: for runs without a cgroup.

Without a cgroup (an ordinary user in the ``rlimits`` mode) the host still has to measure the
sandbox's CPU time (gVisor does not enforce RLIMIT_CPU) and to kill every process of it (runsc
starts its sandbox and gofer in sessions of their own, so a process group does not reach them).
Both walk the tree below the supervisor's child.
"""

from __future__ import annotations

import contextlib
import os
import signal

_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return text.rpartition(")")[2].split()


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (not ``root`` itself), parents before children."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            fields = _stat_fields(name)
            if fields is not None and len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    queue = list(children.get(root, ()))
    while queue:
        pid = queue.pop(0)
        out.append(pid)
        queue.extend(children.get(pid, ()))
    return out


def tree_cpu_ms(root: int) -> float:
    """CPU time of ``root``'s descendants, alive (their own) and reaped (their parents')."""
    total = 0.0
    for pid in descendants(root):
        fields = _stat_fields(str(pid))
        if fields is not None and len(fields) > 14:
            # utime, stime, cutime, cstime (fields 14-17 of proc(5), 11-14 after the name).
            total += sum(int(x) for x in fields[11:15]) * _TICK_MS
    return total


def kill_tree(root: int) -> None:
    """SIGKILL everything below ``root`` (twice: a process forked during the first pass)."""
    for _ in range(2):
        for pid in descendants(root):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def kill_matching(needles: list[str]) -> list[int]:
    """SIGKILL every process of this user whose command line contains one of ``needles``
    (the sweep: what a dead supervisor left running). Returns the pids signalled."""
    if not needles:
        return []
    killed: list[int] = []
    uid = os.geteuid()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = " " + f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(n in cmdline for n in needles):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)
                    killed.append(int(name))
    return killed


__all__ = ["descendants", "kill_matching", "kill_tree", "tree_cpu_ms"]
