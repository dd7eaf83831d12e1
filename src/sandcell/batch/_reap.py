"""Stop the sandboxes this process is supervising, so that an interrupted batch ends at once.

The backend offers no handle on a run in progress; what it does offer is that SIGKILL to the init
of a sandbox's pid namespace kills every process in it (the launcher's own wall-time kill). So
this finds, among this process's descendants, the processes that are pid 1 of a nested pid
namespace (``NSpid`` in ``/proc/PID/status`` ends in 1) and kills them. Each supervising thread
then sees its run end as killed and cleans up (cgroup, workspace) as after any other run.

Limitation: it kills every sandbox this process supervises, not only the batch's; a program that
embeds the batch runner next to other runs in the same process interrupts those as well.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def _parents() -> dict[int, int]:
    """pid → ppid of every process visible in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name may hold spaces and parentheses: the fields follow its last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def _is_namespace_init(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            return len(ids) > 1 and ids[-1] == "1"
    return False


def kill_sandboxes() -> int:
    """SIGKILL the init of every sandbox below this process; returns how many were signalled."""
    killed = 0
    for pid in descendants(os.getpid()):
        if _is_namespace_init(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


__all__ = ["descendants", "kill_sandboxes"]
