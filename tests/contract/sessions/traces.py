"""What a session leaves on the host, per rung, taken while it runs and checked after its end.

Each rung leaves different things: the namespaces backend a sandbox init, its run directory,
mounts under it and the session's cgroup; gVisor a runsc sandbox, its state, mounts, cgroups and
processes named after the session; the microVM a QEMU process (and its jail), the jail's cgroup
and the VM's run directory. :func:`trace` takes the right one; ``assert_gone`` waits until none
of it is left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration import hostscan

from sandcell.backends.host import workspace
from sandcell.sessions import Session

GONE_WITHIN_S = 20.0
"""How long an ended session may take to leave nothing (its teardown runs in the background)."""


@dataclass(frozen=True)
class Trace:
    """Where one session's sandbox lives on the host."""

    rung: str
    session_id: str
    pid: int | None
    run_dir: Path
    cgroups: tuple[Path, ...] = field(default=())
    """The microVM jail's cgroup directories (the other rungs name theirs after the session)."""

    def leftovers(self) -> list[str]:
        """What of the session is on the host now (empty when nothing)."""
        if self.rung == "namespaces":
            return self._namespaces()
        if self.rung == "gvisor":
            return gvisor_leftovers(self.session_id, self.pid, self.run_dir)
        return self._microvm()

    def assert_gone(self) -> None:
        left = self.leftovers
        assert hostscan.wait_until(lambda: not left(), timeout=GONE_WITHIN_S), left()

    def _namespaces(self) -> list[str]:
        left: list[str] = []
        if self.pid is not None and hostscan.alive(self.pid):
            left.append(f"sandbox init {self.pid} alive")
        if self.run_dir.exists():
            left.append(f"run directory {self.run_dir}")
        left += [f"mount {m}" for m in hostscan.mounts_under(self.run_dir)]
        owner = workspace.owner_tag()
        group = f"{owner}.{self.session_id}"
        left += [str(c) for c in hostscan.cgroups_of(owner) if c.name == group]
        return left

    def _microvm(self) -> list[str]:
        left = [f"QEMU {p.pid}" for p in qemus_under(self.run_dir)]
        if self.pid is not None and hostscan.alive(self.pid):
            left.append(f"VM process {self.pid}")
        if self.run_dir.exists():
            left.append(f"run directory {self.run_dir}")
        left += [f"cgroup {c}" for c in self.cgroups if c.exists()]
        return left


def trace(rung: str, s: Session) -> Trace:
    """The host's view of the live session ``s``; it must show something to look for."""
    pid = s.sandbox_pid
    cgroups = tuple(_jail_cgroups(pid)) if rung == "microvm" and pid is not None else ()
    found = Trace(rung=rung, session_id=s.id, pid=pid, run_dir=s.run_dir, cgroups=cgroups)
    if rung == "microvm":
        assert pid is not None and s.run_dir.is_dir() and qemus_under(s.run_dir), "no VM runs"
    assert found.leftovers(), f"the live {rung} session shows nothing to look for"
    return found


def gvisor_state_dir(runs: Path | None = None) -> Path:
    from sandcell.backends.gvisor import runsc

    return (runs or workspace.runs_root()) / runsc.STATE_DIRNAME


def gvisor_leftovers(
    needle: str, pid: int | None = None, run_dir: Path | None = None, runs: Path | None = None
) -> list[str]:
    """What of the gVisor sandboxes whose names contain ``needle`` is left on the host."""
    left: list[str] = []
    if pid is not None and hostscan.alive(pid):
        left.append(f"runsc {pid} alive")
    if run_dir is not None and run_dir.exists():
        left.append(f"run directory {run_dir}")
    with open("/proc/self/mountinfo") as f:
        left += [f"mount {line.split()[4]}" for line in f if needle in line.split()[4]]
    state = gvisor_state_dir(runs)
    if state.is_dir():
        left += [f"runsc state {n}" for n in os.listdir(state) if needle in n]
    for base in hostscan.cgroup_bases():
        if base.is_dir():
            left += [f"cgroup {d}" for d in base.iterdir() if needle in d.name]
    left += [f"process {p.pid}: {p.cmdline}" for p in hostscan.live_procs_matching(needle)]
    return sorted(set(left))


def qemus_under(path: Path) -> list[hostscan.Proc]:
    """The QEMU processes of the VM whose run directory is ``path``."""
    return [p for p in hostscan.live_procs_matching(str(path) + "/") if "qemu" in p.cmdline]


def _jail_cgroups(pid: int) -> list[Path]:
    """The jail's cgroup directories of the VM whose outermost process is ``pid``."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        rel = line.split(":", 2)[-1]
        if ".vm-" in rel:
            found += [base / rel.lstrip("/") for base in hostscan.cgroup_bases()]
    return [p for p in found if p.is_dir()]
