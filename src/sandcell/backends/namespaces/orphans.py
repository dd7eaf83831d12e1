"""Sandboxes whose supervisor died while they were starting: found and killed by the sweep.

bwrap starts a sandbox in two processes: the outer bwrap (the supervisor's child, with
``--die-with-parent``) and the inner one, pid 1 of the sandbox's pid namespace, its child. A soak
fault test that SIGKILLed a supervisor during a start left an inner bwrap alive for 50 minutes:
its outer bwrap had died with the supervisor, it had no child and sat in no cgroup of the run,
waiting on its eventfd for a parent that was gone. The cgroup sweep cannot see such a process,
so this finds it by what only a sandcell sandbox's bwrap is: pid 1 of its own pid namespace,
not the child of a bwrap, holding one of the memfds sandcell hands bwrap (``sandcell-*``).
Killing it takes its whole pid namespace with it.

Only processes of this user are looked at (``/proc/PID/fd`` of others is unreadable anyway).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

__all__ = ["kill_orphans", "orphans"]

_PROC = Path("/proc")
_MEMFD_PREFIX = "/memfd:sandcell-"


def _status(pid: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (_PROC / pid / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _comm(pid: str) -> str:
    return (_PROC / pid / "comm").read_text().strip()


def _holds_sandcell_memfd(pid: str) -> bool:
    for fd in (_PROC / pid / "fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith(_MEMFD_PREFIX):
                return True
    return False


def _is_orphan(pid: str, uid: int) -> bool:
    try:
        if (_PROC / pid).stat().st_uid != uid or _comm(pid) != "bwrap":
            return False
        status = _status(pid)
        ns_pids = status.get("NSpid", "").split()
        if len(ns_pids) < 2 or ns_pids[-1] != "1":
            return False  # the outer bwrap, or a bwrap without a pid namespace
        parent = status.get("PPid", "0")
        if parent != "0" and _comm(parent) == "bwrap":
            return False  # its outer bwrap still holds it: a live sandbox
        return _holds_sandcell_memfd(pid)
    except (OSError, ValueError):
        return False  # gone meanwhile, or not ours to read


def orphans() -> list[int]:
    """The pids of this user's sandbox starts whose outer bwrap is gone."""
    uid = os.geteuid()
    return sorted(
        int(entry.name)
        for entry in _PROC.iterdir()
        if entry.name.isdigit() and _is_orphan(entry.name, uid)
    )


def kill_orphans() -> list[str]:
    """SIGKILL each orphan (and with it its pid namespace); what was killed, for the sweep."""
    killed: list[str] = []
    for pid in orphans():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(f"orphaned sandbox start (bwrap pid {pid})")
    return killed
