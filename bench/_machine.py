"""The machine a benchmark ran on, and what processes cost in memory (Linux ``/proc``)."""

from __future__ import annotations

import datetime as dt
import os
import platform
from collections.abc import Iterable

__all__ = [
    "cpu_time_ticks",
    "descendants",
    "machine_info",
    "parse_cpu_model",
    "parse_pss_kib",
    "pss_kib",
]


def parse_cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` text (ARM kernels may only give a part id)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return "unknown"


def parse_pss_kib(smaps_rollup: str) -> int:
    """The ``Pss:`` line of ``/proc/PID/smaps_rollup`` text, in KiB."""
    for line in smaps_rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise ValueError("no 'Pss:' line in smaps_rollup: a kernel before 4.14 lacks smaps_rollup")


def pss_kib(pid: int) -> int:
    """Proportional set size of one process: shared pages count divided among their sharers."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return parse_pss_kib(f.read())


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces and parentheses: split after its closing one.
        return f.read().rsplit(")", 1)[1].split()


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children, ...), from a /proc scan."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(name))[1])
        except (OSError, IndexError, ValueError):
            continue  # exited while scanning
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(out)


def cpu_time_ticks(pids: Iterable[int]) -> int:
    """User + system CPU ticks of the given processes (those that exited count as zero)."""
    total = 0
    for pid in pids:
        try:
            f = _stat_fields(pid)
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            continue
    return total


def machine_info() -> dict[str, str]:
    """Date, CPU model, cores, kernel and load: what a reader needs to weigh the numbers."""
    try:
        with open("/proc/cpuinfo") as f:
            model = parse_cpu_model(f.read())
    except OSError:
        model = platform.processor() or "unknown"
    usable = len(os.sched_getaffinity(0))
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": model,
        "cores": f"{usable} usable of {os.cpu_count()}",
        "memory": f"{mem:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load average at start": load,
    }
