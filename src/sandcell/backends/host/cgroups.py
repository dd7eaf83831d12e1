"""cgroups: memory, process and CPU accounting for the whole process tree of a run.

Two host shapes are supported: cgroup v2 (most hosts today; needs root or a delegated subtree) and
cgroup v1 (older hosts, and this project's CI machine). The settings of a run are a pure plan,
:func:`plan_settings`; :class:`RunCgroup` creates the group, applies the plan, moves the sandbox
into it before any untrusted code runs, reads usage and removes the group.

Swap is closed on both: ``memory.swap.max = 0`` on v2, ``memory.memsw.limit_in_bytes`` equal to the
memory limit on v1 (or ``memory.swappiness = 0`` where swap accounting is off), so a run cannot
escape its memory limit into swap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import IsolationUnavailable

GROUP_PREFIX = "sandcell"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupHost:
    """Where this host lets sandcell create cgroups."""

    version: int
    bases: Mapping[str, Path]
    """Controller name (``"unified"`` on v2) to the directory run groups are created under."""
    freezer: Path | None = None
    """cgroup v1: where freezer groups are created, when the freezer controller is mounted and
    writable (on v2 every group has ``cgroup.freeze``). Only warm runs ask for one
    (:meth:`RunCgroup.freeze`), so a cold run pays no extra attach."""

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 at {self.bases['unified']}"
        return "cgroup v1 (" + ", ".join(sorted(self.bases)) + ")"


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupSetting:
    """One file write: ``<controller base>/<group>/<file> = value``."""

    controller: str
    file: str
    value: str
    optional: bool = False
    """Skip silently when the file does not exist (a kernel without that knob)."""


def _mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of every mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            parts = left.split()
            rparts = right.split()
            if len(parts) >= 5 and len(rparts) >= 3:
                out.append((parts[4], rparts[0], rparts[2]))
    return out


def _own_v2_path() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line.strip()[3:]
    return "/"


def detect() -> CgroupHost | IsolationUnavailable:
    """Where run cgroups can be created here, or why they cannot (never raises)."""
    mounts = _mountinfo()
    v1: dict[str, Path] = {}
    unified: Path | None = None
    for point, fstype, opts in mounts:
        if fstype == "cgroup2" and unified is None:
            unified = Path(point)
        elif fstype == "cgroup":
            for ctrl in opts.split(","):
                if ctrl in V1_CONTROLLERS and ctrl not in v1:
                    v1[ctrl] = Path(point)
    explicit = os.environ.get("SANDCELL_CGROUP")
    # A hybrid host mounts v2 only for bookkeeping: it has no controllers, v1 does the work.
    if unified is not None and not v1:
        base = Path(explicit) if explicit else unified / GROUP_PREFIX
        if not explicit:
            own = unified / _own_v2_path().lstrip("/")
            if os.geteuid() != 0:
                base = own.parent / GROUP_PREFIX if own != unified else base
        problem = _check_v2_base(base)
        if problem:
            return problem
        return CgroupHost(version=2, bases={"unified": base})
    if set(V1_CONTROLLERS) <= set(v1):
        bases = {c: v1[c] / GROUP_PREFIX for c in V1_CONTROLLERS}
        for ctrl, base in bases.items():
            root = v1[ctrl]
            if not os.access(base if base.exists() else root, os.W_OK):
                return IsolationUnavailable(
                    "cgroups",
                    f"cgroup v1 controller {ctrl} at {root} is not writable by uid {os.geteuid()}",
                    "run as root, or ask for the weaker mode by name (--isolation rlimits), "
                    "or move the host to cgroup v2 with a delegated subtree",
                )
        return CgroupHost(version=1, bases=bases, freezer=_v1_freezer())
    missing = sorted(set(V1_CONTROLLERS) - set(v1))
    return IsolationUnavailable(
        "cgroups",
        "no cgroup v2 hierarchy and cgroup v1 lacks " + ", ".join(missing)
        if v1 or unified is None
        else "no usable cgroup hierarchy",
        "mount cgroup v2 (or the v1 memory, pids and cpuacct controllers)",
    )


def _v1_freezer() -> Path | None:
    for point, fstype, opts in _mountinfo():
        if fstype == "cgroup" and "freezer" in opts.split(","):
            base = Path(point) / GROUP_PREFIX
            return base if os.access(base if base.exists() else point, os.W_OK) else None
    return None


def _check_v2_base(base: Path) -> IsolationUnavailable | None:
    parent = base if base.exists() else base.parent
    if not os.access(parent, os.W_OK):
        return IsolationUnavailable(
            "cgroups",
            f"cgroup v2 directory {parent} is not writable by uid {os.geteuid()} (no delegation)",
            "run as root, or start sandcell in a delegated cgroup (for example "
            "`systemd-run --user -p Delegate=yes --scope sandcell ...`) and set SANDCELL_CGROUP "
            "to a directory inside it, or ask for the weaker mode by name (--isolation rlimits)",
        )
    controllers_file = parent / "cgroup.controllers"
    try:
        available = set(controllers_file.read_text().split())
    except OSError:
        available = set()
    missing = {"memory", "pids"} - available
    if missing:
        return IsolationUnavailable(
            "cgroups",
            f"cgroup v2 at {parent} does not offer the {', '.join(sorted(missing))} controller",
            "enable the controllers in the parent's cgroup.subtree_control",
        )
    return None


def plan_settings(
    version: int, *, memory_bytes: int, max_pids: int, swap_accounting: bool
) -> tuple[CgroupSetting, ...]:
    """The writes that set a run's limits (pure)."""
    if version == 2:
        return (
            CgroupSetting(controller="unified", file="memory.max", value=str(memory_bytes)),
            CgroupSetting(controller="unified", file="memory.swap.max", value="0", optional=True),
            CgroupSetting(controller="unified", file="memory.oom.group", value="1", optional=True),
            CgroupSetting(controller="unified", file="pids.max", value=str(max_pids)),
        )
    settings = [
        CgroupSetting(controller="memory", file="memory.limit_in_bytes", value=str(memory_bytes)),
    ]
    if swap_accounting:
        settings.append(
            CgroupSetting(
                controller="memory", file="memory.memsw.limit_in_bytes", value=str(memory_bytes)
            )
        )
    settings += [
        CgroupSetting(controller="memory", file="memory.swappiness", value="0", optional=True),
        CgroupSetting(controller="pids", file="pids.max", value=str(max_pids)),
    ]
    return tuple(settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupUsage:
    cpu_ms: float | None
    peak_memory_bytes: int | None
    oom_killed: bool
    pids_limit_hit: bool


class RunCgroup:
    """The cgroup(s) of one run: create, limit, attach, read, freeze, remove."""

    def __init__(self, host: CgroupHost, name: str, *, freezer: bool = False) -> None:
        self.host = host
        self.name = name
        self.dirs: dict[str, Path] = {c: base / name for c, base in host.bases.items()}
        if freezer and host.version == 1 and host.freezer is not None:
            self.dirs["freezer"] = host.freezer / name
        # The control files are read and written as strings through os.open: a warm run touches
        # about a dozen of them, and pathlib's joins and text-mode opens were a visible part of
        # the host's CPU per run (bench/PROFILE.md).
        self._at: dict[str, str] = {c: os.fspath(d) for c, d in self.dirs.items()}

    @property
    def can_freeze(self) -> bool:
        """Whether :meth:`freeze` can stop this group (v2 from kernel 5.2, or a v1 group made
        with a freezer)."""
        if self.host.version == 2:
            return (self.dirs["unified"] / "cgroup.freeze").exists()
        return "freezer" in self.dirs

    def freeze(self, timeout_s: float = 1.0) -> bool:
        """Stop every process of the group and return once all are stopped (True), or False
        when they were not within ``timeout_s`` or the group cannot be frozen. A frozen task is
        parked outside any system call, so a frozen group writes nothing more."""
        if self.host.version == 2:
            d = self._at["unified"]
            request, state, done = f"{d}/cgroup.freeze", f"{d}/cgroup.events", "frozen 1"
            value = "1"
        elif "freezer" in self._at:
            request = state = f"{self._at['freezer']}/freezer.state"
            value = done = "FROZEN"
        else:
            return False
        deadline = time.monotonic() + timeout_s
        try:
            _write(request, value)
            pause = 0.00005
            while True:
                # Reading the v1 state is what moves FREEZING to FROZEN once every task is.
                if done in _read(state).splitlines():
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.005)
        except OSError:
            return False

    def thaw(self) -> None:
        """Let a frozen group run again (a killed one then dies)."""
        if self.host.version == 2:
            target, value = f"{self._at['unified']}/cgroup.freeze", "0"
        elif "freezer" in self._at:
            target, value = f"{self._at['freezer']}/freezer.state", "THAWED"
        else:
            return
        with contextlib.suppress(OSError):
            _write(target, value)

    def create(self, settings: Sequence[CgroupSetting]) -> None:
        try:
            for ctrl, d in self.dirs.items():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d.parent)
                if self.host.version == 2 and ctrl == "unified":
                    _enable_v2_controllers(d.parent)
                os.mkdir(self._at[ctrl])
            for s in settings:
                path = f"{self._at[s.controller]}/{s.file}"
                try:
                    _write(path, s.value)
                except FileNotFoundError:
                    if not s.optional:
                        raise
        except OSError as exc:
            self.remove()
            raise IsolationUnavailable(
                "cgroups",
                f"could not set up cgroup {self.name}: {exc}",
                "check that the cgroup hierarchy is writable (see `sandcell doctor`)",
            ) from exc

    def attach(self, pid: int) -> None:
        """Move a process into every controller's group (before it runs untrusted code)."""
        for d in self._at.values():
            _write(f"{d}/cgroup.procs", str(pid))

    def usage(self) -> CgroupUsage:
        if self.host.version == 2:
            d = self._at["unified"]
            cpu = _read_kv(f"{d}/cpu.stat").get("usage_usec")
            events = _read_kv(f"{d}/memory.events")
            peak = _read_int(f"{d}/memory.peak")
            pid_events = _read_kv(f"{d}/pids.events")
            return CgroupUsage(
                cpu_ms=cpu / 1000 if cpu is not None else None,
                peak_memory_bytes=peak,
                oom_killed=(events.get("oom_kill") or 0) > 0,
                pids_limit_hit=(pid_events.get("max") or 0) > 0,
            )
        mem = self._at["memory"]
        ns = _read_int(f"{self._at['cpuacct']}/cpuacct.usage")
        oom = _read_kv(f"{mem}/memory.oom_control").get("oom_kill")
        pid_events = _read_kv(f"{self._at['pids']}/pids.events")
        return CgroupUsage(
            cpu_ms=ns / 1e6 if ns is not None else None,
            peak_memory_bytes=_read_int(f"{mem}/memory.max_usage_in_bytes"),
            oom_killed=(oom or 0) > 0,
            pids_limit_hit=(pid_events.get("max") or 0) > 0,
        )

    def memory_now(self) -> int | None:
        """Bytes the group is charged for now, as its memory limit counts them (page cache
        included, so a tmpfs workspace's files count); None where it cannot be read."""
        if self.host.version == 2:
            return _read_int(f"{self._at['unified']}/memory.current")
        return _read_int(f"{self._at['memory']}/memory.usage_in_bytes")

    def kill_all(self) -> None:
        """SIGKILL every process left in the group, frozen ones included (they are thawed
        after the signal, so they die without running another instruction of their own)."""
        if self.host.version == 2:
            try:
                _write(f"{self._at['unified']}/cgroup.kill", "1")
            except OSError:
                pass  # no cgroup.kill before kernel 5.14: signal each process, as on v1
            else:
                self.thaw()
                return
        for d in self._at.values():
            for pid in _read_pids(d):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
        self.thaw()

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Remove the groups, killing stragglers; True when nothing is left."""
        deadline = time.monotonic() + timeout_s
        ok = True
        for d in self._at.values():
            # The group empties a moment after the sandbox's last process is reaped: retry with
            # a short, growing pause rather than a fixed one.
            pause = 0.0002
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        ok = False
                        break
                    self.kill_all()
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)
        return ok


def prime_attach(host: CgroupHost) -> None:
    """Move this process into the cgroup it is already in (a no-op), to start the kernel's grace
    period that the first ``cgroup.procs`` write after a quiet spell waits for (about 10 ms with
    the global threadgroup lock in its fast mode). Run on a thread at the start of a run, it
    overlaps that wait with the sandbox's setup, so the real attach finds the lock ready. Hosts
    mounted with ``favordynmods`` do not wait at all."""
    controller = "unified" if host.version == 2 else "memory"
    base = host.bases[controller].parent
    with contextlib.suppress(OSError):
        own = _own_path(controller if host.version == 1 else "")
        (base / own.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))


def _own_path(controller: str) -> str:
    """This process's cgroup path in a v1 controller's hierarchy ("" for v2)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (controller and controller in controllers.split(",")) or (
                not controller and not controllers
            ):
                return path
    return "/"


def _enable_v2_controllers(parent: Path) -> None:
    control = parent / "cgroup.subtree_control"
    with contextlib.suppress(OSError):
        enabled = set(control.read_text().split())
        for ctrl in ("memory", "pids", "cpu"):
            if ctrl not in enabled:
                with contextlib.suppress(OSError):
                    control.write_text(f"+{ctrl}")


def _read(path: str) -> str:
    """A control file's whole text."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _write(path: str, value: str) -> None:
    """One write of ``value`` to an existing control file (cgroupfs takes each write whole)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_int(path: str) -> int | None:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_kv(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = _read(path)
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _read_pids(d: str) -> list[int]:
    try:
        return [int(p) for p in _read(f"{d}/cgroup.procs").split()]
    except (OSError, ValueError):
        return []


def swap_accounting(host: CgroupHost) -> bool:
    """Whether v1 swap accounting (``memory.memsw.*``) exists on this host."""
    if host.version != 1:
        return True
    base = host.bases["memory"]
    root = base.parent
    return (root / "memory.memsw.limit_in_bytes").exists()


def stale_groups(host: CgroupHost) -> list[tuple[str, Path]]:
    """Run groups left behind by a supervisor that died (for the sweep)."""
    out: list[tuple[str, Path]] = []
    bases = dict(host.bases)
    if host.freezer is not None:
        bases["freezer"] = host.freezer
    for ctrl, base in bases.items():
        if base.is_dir():
            out.extend((ctrl, d) for d in base.iterdir() if d.is_dir())
    return out
