"""What a namespaces session's sandbox uses now: CPU, memory, workspace (its ``metrics()``).

Where the session has a cgroup (root, strict mode), CPU time and memory are the cgroup's: its
``cpuacct.usage`` (v1) or ``cpu.stat`` (v2), and the memory it is charged for against its limit
(page cache and the workspace's tmpfs pages included, as the limit counts them). Without one (an
ordinary user, or the rlimits mode), they are read from the sandbox's processes: CPU as the sum
of every live process's own and reaped children's time below the sandbox init, memory as the
sum of their resident sets (shared pages counted once per process, so it can overstate), against
the request's memory limit (enforced there per process, as an address-space rlimit). The
workspace's use is its tmpfs's, read with ``statvfs`` through the host's view of it, against the
request's workspace limit; the CPU count is the kernel's CPU affinity (this rung sets no CPU
quota).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from pathlib import Path

from sandcell.backends.cell.state import SandboxMetrics
from sandcell.backends.host import cgroups
from sandcell.spec import Limits

_TICKS = os.sysconf("SC_CLK_TCK")


class MetricsSampler:
    """Samples one sandbox; remembers the previous sample for the CPU percentage."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._prev_at = time.monotonic()
        self._prev_cpu_ms = 0.0
        """CPU time at the previous sample: none yet at the sandbox's start."""

    def sample(
        self,
        *,
        cgroup: cgroups.RunCgroup | None,
        sandbox_pid: int | None,
        kernel_pid: int | None,
        workspace: Path,
    ) -> SandboxMetrics:
        now = time.monotonic()
        pids = _tree(sandbox_pid) if sandbox_pid is not None else []
        if cgroup is not None:
            cpu_ms = cgroup.usage().cpu_ms
            mem = cgroup.memory_now()
        else:
            cpu_ms = sum(_cpu_ms(p) for p in pids)
            mem = sum(_rss(p) for p in pids)
        cpus = _cpu_count(kernel_pid)
        used_pct = 0.0
        if cpu_ms is not None:
            wall_ms = (now - self._prev_at) * 1000
            if wall_ms > 0:
                used_pct = (cpu_ms - self._prev_cpu_ms) / (wall_ms * cpus) * 100
            self._prev_cpu_ms = cpu_ms
        self._prev_at = now
        return SandboxMetrics(
            timestamp=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            cpu_count=cpus,
            cpu_used_pct=round(min(max(used_pct, 0.0), 100.0), 2),
            mem_used_bytes=mem or 0,
            mem_total_bytes=self.limits.memory_bytes,
            disk_used_bytes=_used_bytes(workspace),
            disk_total_bytes=self.limits.workspace_bytes,
        )


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (children of every thread)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with (
                    contextlib.suppress(OSError, ValueError),
                    open(f"/proc/{pid}/task/{task}/children") as f,
                ):
                    todo += [int(x) for x in f.read().split()]
    return found


def _cpu_ms(pid: int) -> float:
    """The process's CPU time and that of the children it reaped (so none is lost or counted
    twice as the tree changes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return sum(int(x) for x in fields[11:15]) * 1000 / _TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cpu_count(kernel_pid: int | None) -> int:
    if kernel_pid is not None:
        with contextlib.suppress(OSError):
            return len(os.sched_getaffinity(kernel_pid))
    return os.cpu_count() or 1


def _used_bytes(workspace: Path) -> int:
    try:
        st = os.statvfs(workspace)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


__all__ = ["MetricsSampler"]
