"""What a run may have left on the host: processes, mounts, cgroups, run directories.

Read straight from /proc and /sys (no psutil), so the integration tests can say precisely what
leaked. Zombies are reported separately: a zombie holds no memory, mounts or descriptors, and an
orphaned one is reaped by the host's init, not by sandcell.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.host import cgroups

V1_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    comm: str
    cmdline: str

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_proc(pid: int) -> Proc | None:
    """One process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat.rpartition(")")[2].split()
    cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return Proc(pid=pid, ppid=int(fields[1]), state=fields[0], comm=comm, cmdline=cmdline)


def all_procs() -> list[Proc]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            p = read_proc(int(entry))
            if p is not None:
                out.append(p)
    return out


def live_procs_matching(*needles: str) -> list[Proc]:
    """Processes (not zombies) whose command line contains any of ``needles``."""
    return [p for p in all_procs() if not p.zombie and any(n in p.cmdline for n in needles if n)]


def children_of(pid: int) -> list[Proc]:
    """Direct children of ``pid``, zombies included (an unreaped child is a leak of its parent)."""
    return [p for p in all_procs() if p.ppid == pid]


def unreaped_sandboxes(pid: int) -> list[Proc]:
    """Children of ``pid`` a finished run must not leave: zombies, and any bwrap but a warm
    template's, a jailed VM's waiting in the microVM pool or a sandbox waiting in the wasm pool
    or the namespaces Node pool (the session-wide warm executors of tests/conftest.py keep
    theirs by design; what a warm executor leaves after ``close`` is tested in
    test_template_isolation.py, test_microvm.py, test_wasm.py and test_node_pool.py)."""
    return [
        p
        for p in children_of(pid)
        if p.zombie or (p.comm == "bwrap" and not waiting_in_a_pool(p.cmdline))
    ]


def waiting_in_a_pool(cmdline: str) -> bool:
    """A bwrap of a sandbox that a warm executor keeps waiting (namespaces template, microVM
    jail, the wasm pool's ``runner.mjs ... pooled``, the namespaces Node pool's
    ``node_runner.mjs [typescript] pooled``), by its command line."""
    return (
        "zygote.pyc" in cmdline
        or "qemu-system" in cmdline
        or ("runner.mjs" in cmdline and cmdline.endswith(" pooled"))
    )


def alive(pid: int) -> bool:
    p = read_proc(pid)
    return p is not None and not p.zombie


def start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[19]


def owner_tag_of(pid: int) -> str:
    """The tag sandcell names a supervisor's run directories and cgroups by (pid-starttime)."""
    return f"{pid}-{start_time(pid)}"


def _mountinfo_points(path: str) -> list[str]:
    points = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) > 4:
                    points.append(parts[4].replace("\\040", " "))
    except OSError:  # gone, or a zombie (EINVAL)
        pass
    return points


def mounts_under(root: Path, *, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points strictly below ``root`` in one mount namespace (this process's by default)."""
    prefix = str(root).rstrip("/") + "/"
    return [m for m in _mountinfo_points(mountinfo) if m.startswith(prefix)]


def mounts_under_anywhere(root: Path) -> dict[int, list[str]]:
    """Mounts below ``root`` in the mount namespace of any process on the host (by pid).

    An ordinary user's workspace tmpfs lives in the workspace helper's private namespace, where
    /proc/self/mountinfo cannot see it.
    """
    found: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ms = mounts_under(root, mountinfo=f"/proc/{entry}/mountinfo")
            if ms:
                found[int(entry)] = ms
    return found


def cgroup_bases() -> list[Path]:
    """Where sandcell creates run cgroups on this host (empty when it cannot)."""
    host = cgroups.detect()
    if isinstance(host, cgroups.CgroupHost):
        # The v1 freezer groups of warm runs are run cgroups too.
        return [*host.bases.values(), *([host.freezer] if host.freezer is not None else [])]
    return []


def cgroups_of(owner: str, *, include_warm: bool = False) -> list[Path]:
    """Run cgroups named after supervisor ``owner`` (``<owner>.<run_id>``), in every controller.

    Cgroups of warm pools belong to the session-wide warm executors of tests/conftest.py and are
    left out unless asked for: the namespaces pool's (``<owner>.w<template>-<id>``; a cold run's
    id is hexadecimal, so it never starts with ``w``), the wasm pool's (``<owner>.wasmpool-<id>``)
    and the namespaces Node pool's (``<owner>.nodepool-<id>``) sandboxes, the gVisor pool's
    sandboxes (``<owner>.gv-<n>-pool-gvisor-pool-<id>``) and jailed VMs (``<owner>.vm-<id>``,
    waiting in the microVM pool; the microVM backend's own tests check what its runs leave)."""
    out: list[Path] = []
    for base in cgroup_bases():
        if base.is_dir():
            out.extend(
                d
                for d in base.iterdir()
                if d.is_dir()
                and d.name.startswith(owner + ".")
                and (include_warm or not _warm_pool_group(owner, d.name))
            )
    return sorted(out)


def _warm_pool_group(owner: str, name: str) -> bool:
    rest = name[len(owner) + 1 :]
    # A cold run keeps the name of the spare group it took (``<owner>.w<id>-cold-<id>``): that
    # is a run's group, not a warm pool's.
    if rest.startswith("w") and "-cold-" in rest:
        return False
    return rest.startswith(("w", "vm-", "nodepool-")) or (
        rest.startswith("gv-") and "-pool-gvisor-pool-" in rest
    )


def open_fds() -> list[str]:
    """This process's open descriptors, as what they point at."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
    return sorted(out)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def describe(procs: Iterable[Proc]) -> str:
    return "\n".join(f"  {p.pid} (ppid {p.ppid}, {p.state}) {p.cmdline[:200]}" for p in procs)


def runs_dir_leftovers(runs: Path) -> list[str]:
    """Everything under the runs root except the shared ``etc`` and empty owner directories."""
    left = []
    for entry in sorted(runs.iterdir()):
        if entry.name == "etc":
            continue
        if entry.is_dir() and not entry.is_symlink() and not any(entry.iterdir()):
            continue
        for p in [entry, *sorted(entry.rglob("*"))] if entry.is_dir() else [entry]:
            left.append(str(p.relative_to(runs)))
    return left


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def pid_namespace_members(pid: int) -> list[Proc]:
    """Every live process in the pid namespace of ``pid`` (a sandbox, if it is in one)."""
    ns = pid_namespace(pid)
    if ns is None or ns == pid_namespace(os.getpid()):
        return []
    return [p for p in all_procs() if not p.zombie and pid_namespace(p.pid) == ns]
