"""The program's cgroup (``/sys/fs/cgroup/prog``): its limits, its end, and what it used."""

from __future__ import annotations

import contextlib

from .system import read_file, write_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .job import Job

CG = "/sys/fs/cgroup"
PROG_CG = CG + "/prog"


def prepare_cgroup(lim: Job) -> None:
    write_file(PROG_CG + "/memory.max", str(lim["memory_bytes"]))
    write_file(PROG_CG + "/memory.swap.max", "0")
    write_file(PROG_CG + "/pids.max", str(lim["max_pids"]))


def kill_cgroup() -> None:
    with contextlib.suppress(OSError):
        write_file(PROG_CG + "/cgroup.kill", "1")


def cpu_usage_ms() -> float | None:
    try:
        for line in read_file(PROG_CG + "/cpu.stat").splitlines():
            k, _, v = line.partition(" ")
            if k == "usage_usec":
                return int(v) / 1000
    except (OSError, ValueError):
        pass
    return None


def current_memory() -> int | None:
    try:
        return int(read_file(PROG_CG + "/memory.current"))
    except (OSError, ValueError):
        return None


def cgroup_stats(cpu_before: float | None) -> dict[str, Any]:
    """OOM kills, CPU time since ``cpu_before`` and peak memory (None where unreadable)."""
    out: dict[str, Any] = {"oom_kill": 0, "cpu_ms": None, "peak_bytes": None}
    try:
        for line in read_file(PROG_CG + "/memory.events").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                out["oom_kill"] = int(v)
        cpu = cpu_usage_ms()
        if cpu is not None:
            # The runner's start and preload ran in this cgroup before the job.
            out["cpu_ms"] = max(cpu - (cpu_before or 0), 0)
        out["peak_bytes"] = int(read_file(PROG_CG + "/memory.peak"))
    except (OSError, ValueError):
        pass
    return out
