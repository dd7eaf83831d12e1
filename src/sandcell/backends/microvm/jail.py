"""The jailer: QEMU itself runs confined, as Firecracker's jailer confines Firecracker.

Each QEMU process is started by bubblewrap in new user, mount, pid, ipc, uts, cgroup and network
namespaces (no network at all: not even the host's loopback), seeing only what it needs read-only
(``/usr`` for its binary, libraries and firmware, the guest kernel, initramfs and image, the
snapshot's files) and its own run directory read-write (its sockets); it dies with its
supervisor. QEMU's own seccomp filter is on (``-sandbox on`` with obsolete system calls,
privilege changes, process spawning and resource control denied), and where the host has
cgroups the whole jail is placed in a cgroup of its own with a memory limit (guest RAM plus
QEMU's overhead) and a pids limit.

:class:`Jail` builds the bwrap arguments as pure data (:func:`jail_argv`); :class:`Jailed` holds
one VM's cgroup.

Security limitations: as root, bubblewrap maps root into the jail's user namespace, so the jailed
QEMU still owns the files it can see as root would (it can see only those listed above). Without
cgroups (an ordinary user without delegation) the jail has no memory or pids limit of its own;
the guest's RAM size still bounds it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.host import cgroups, workspace
from sandcell.backends.host.bubblewrap import find_bwrap
from sandcell.backends.microvm import qemu
from sandcell.errors import IsolationUnavailable

QEMU_OVERHEAD_BYTES = 384 << 20
"""Memory QEMU needs beyond the guest's RAM (TCG translation cache, device state, libraries)."""
QEMU_MAX_PIDS = 64
SANDBOX_OPTS = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"


def jail_argv(
    *,
    bwrap: str,
    qemu_argv: Sequence[str],
    ro_paths: Sequence[Path],
    rw_paths: Sequence[Path],
    root_links: Sequence[tuple[str, str]],
    kvm: bool,
) -> list[str]:
    """bwrap's argument list around ``qemu_argv`` (pure)."""
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for link, target in root_links:
        argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if kvm:
        argv += ["--dev-bind", "/dev/kvm", "/dev/kvm"]
    for p in ro_paths:
        argv += ["--ro-bind", str(p), str(p)]
    for p in rw_paths:
        argv += ["--bind", str(p), str(p)]
    argv += ["--chdir", "/", "--", *qemu_argv, "-sandbox", SANDBOX_OPTS]
    return argv


def _root_links() -> list[tuple[str, str]]:
    return [
        (p, os.readlink(p))
        for p in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
        if os.path.islink(p)
    ]


@dataclass(slots=True)
class Jailed:
    """One jailed VM's cgroup (None without cgroups)."""

    cgroup: cgroups.RunCgroup | None

    def attach(self, pid: int) -> None:
        if self.cgroup is not None:
            self.cgroup.attach(pid)

    def remove(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill_all()
            self.cgroup.remove()


class Jail:
    """Wraps each VM's QEMU in bubblewrap (and a cgroup where the host has them)."""

    def __init__(self) -> None:
        self.bwrap = find_bwrap()
        host = cgroups.detect()
        self.cgroup_host = host if isinstance(host, cgroups.CgroupHost) else None
        self.links = _root_links()

    def describe(self) -> str:
        cg = (
            f"{self.cgroup_host.describe()} memory and pids limits"
            if self.cgroup_host is not None
            else "no cgroup (none delegated to this user)"
        )
        return (
            f"bubblewrap {self.bwrap.version_text}: QEMU in its own user, pid, mount, ipc, uts "
            f"and network namespaces, only its own files; QEMU seccomp ({SANDBOX_OPTS}); {cg}"
        )

    def wrap(
        self,
        qemu_argv: Sequence[str],
        plan: qemu.VMPlan,
        run_dir: Path,
        *,
        ro: Sequence[Path] = (),
        rw: Sequence[Path] = (),
    ) -> tuple[list[str], Jailed]:
        argv = jail_argv(
            bwrap=self.bwrap.path,
            qemu_argv=qemu_argv,
            ro_paths=[plan.kernel, plan.initrd, plan.image, *ro],
            rw_paths=[run_dir, *rw],
            root_links=self.links,
            kvm=plan.accel == "kvm",
        )
        cg: cgroups.RunCgroup | None = None
        if self.cgroup_host is not None:
            name = f"{workspace.owner_tag()}.vm-{uuid.uuid4().hex[:12]}"
            cg = cgroups.RunCgroup(self.cgroup_host, name)
            cg.create(
                cgroups.plan_settings(
                    self.cgroup_host.version,
                    memory_bytes=(plan.memory_mib << 20) + QEMU_OVERHEAD_BYTES,
                    max_pids=QEMU_MAX_PIDS,
                    swap_accounting=cgroups.swap_accounting(self.cgroup_host),
                )
            )
        return argv, Jailed(cg)


def plan_jail() -> Jail | None:
    """The jail, or None where bubblewrap cannot run here (:func:`why_not` says why)."""
    with contextlib.suppress(IsolationUnavailable):
        if os.environ.get("SANDCELL_VM_JAIL", "on") != "off":
            return Jail()
    return None


def why_not() -> str:
    if os.environ.get("SANDCELL_VM_JAIL", "on") == "off":
        return "disabled by SANDCELL_VM_JAIL=off"
    try:
        find_bwrap()
    except IsolationUnavailable as exc:
        return f"bubblewrap unavailable ({exc.reason})"
    return "available"


__all__ = ["Jail", "Jailed", "jail_argv", "plan_jail", "why_not"]
