"""The OCI bundle of one gVisor sandbox, as pure data: :func:`build_config` returns config.json.

This is the filesystem, identity and namespace half of the gVisor backend's security argument, so
it is one pure function, unit-tested without privileges (``tests/unit/test_gvisor_plan.py``).

The view matches the namespaces backend's: an empty read-only root (a directory of mount points
and the ``/bin``-style symlinks), the runtime's directories bound read-only at their host paths,
the synthetic ``/etc`` files, the run's control directory read-only at ``/sandcell``, inputs
read-only under ``/inputs``, packages under ``/packages``, the workspace at ``/sandbox`` and a
private ``/tmp`` (gVisor's own tmpfs, sized). The program runs as uid 1000 with no capabilities
and no_new_privs, in fresh pid, network, ipc, uts and mount namespaces of the sentry. The limits
that gVisor enforces inside (open files, file size, processes, address space, core) are
``process.rlimits``; memory, pids and CPU time are the host's (``sandbox.py``). A run that
reaches outside also sees its socket directory read-only at ``/run/sandcell`` (runsc then
allows connecting to, never creating, host Unix sockets: ``runsc.Runsc.argv``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandcell.backends.host.layout import (
    CONTROL_DIR,
    PACKAGES_DIR,
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_HOSTNAME,
    SANDBOX_UID,
    SANDBOX_WORKDIR,
)
from sandcell.run_sockets import SANDBOX_DIR
from sandcell.spec import IsolationMode, Limits

OCI_VERSION = "1.0.2"
ETC_NAMES = ("passwd", "group", "hosts", "nsswitch.conf")
"""Synthetic ``/etc`` files bound read-only (the namespaces backend's, same content)."""
POOL_SOCKETS_PARENT = "/.sandcell"
"""Where a pooled sandbox sees its socket view, empty until a run that reaches outside takes it."""
POOL_SOCKETS_NAME = "run/sandcell"
"""The directory such a run makes in that view; ``/run`` links to its parent, so that a pooled
sandbox that serves no such run has no ``/run`` at all, like a cold one."""
# The hard ceilings of a sandbox created before its request is known (a pooled one): the
# program's own limits are lowered to the request's by the agent before the code runs, and an
# unprivileged process can lower a limit but never raise one.
POOL_CEILINGS: Mapping[str, int] = {
    "RLIMIT_NOFILE": 1 << 16,
    "RLIMIT_FSIZE": 1 << 62,
    "RLIMIT_NPROC": 1 << 16,
    "RLIMIT_AS": 1 << 62,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rlimit:
    """One ``process.rlimits`` entry (soft and hard the same: the program cannot raise it)."""

    name: str
    value: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BundlePlan:
    """Everything :func:`build_config` needs; no I/O happens while building the config."""

    rootfs: Path
    """The empty root: mount points and the runtime's top-level symlinks (read-only)."""
    mounts: Sequence[tuple[str, str]]
    """The runtime's neutral view: (host path, sandbox path), bound read-only in this order."""
    files: Sequence[tuple[Path, str]] = ()
    """(host file, sandbox path): the runtime's synthetic files, bound after ``mounts``."""
    workspace: Path
    """Host directory that becomes the writable working directory."""
    control_dir: Path
    """Host directory with the agent, boot, plan and program, read-only at ``/sandcell``."""
    etc_dir: Path
    """Host directory with the synthetic passwd, group, hosts and nsswitch.conf."""
    inputs: Sequence[tuple[Path, str]] = ()
    """(host path, name): bound read-only at ``/inputs/<name>``."""
    packages: Sequence[Path] = ()
    env: Mapping[str, str]
    command: Sequence[str]
    rlimits: Sequence[Rlimit]
    tmp_bytes: int
    uid: int = SANDBOX_UID
    """The program's uid inside the sentry (rootless: 0, see ``sandbox.Host.sandbox_uid``)."""
    sockets_dir: Path | None = None
    """Host directory shown read-only at ``/run/sandcell``: the run's ways out (its egress and
    tool sockets and their client files; see ``sandbox.GSandbox.attach_sockets``)."""
    sockets_later: bool = False
    """A pooled sandbox: ``sockets_dir`` is shown at :data:`POOL_SOCKETS_PARENT` instead, and
    ``/run`` is a link into it that leads nowhere until a run that reaches outside takes the
    sandbox and makes :data:`POOL_SOCKETS_NAME` there."""


def plan_rlimits(limits: Limits, mode: IsolationMode, *, reserve: int = 0) -> tuple[Rlimit, ...]:
    """The rlimits gVisor applies to the program (pure).

    RLIMIT_CPU is absent on purpose: gVisor does not enforce it, the host does (``sandbox.py``).
    RLIMIT_NPROC is always set: the host's pids cgroup also counts gVisor's own threads, so it is
    a backstop sized above the program's limit, and the program's own count is the sentry's.
    RLIMIT_AS stands in for the memory cgroup only in the ``rlimits`` mode, ``reserve`` bytes
    above the memory limit (the address space Node reserves unused: ``host/node_program.py``).
    """
    plan = [
        Rlimit(name="RLIMIT_NOFILE", value=limits.max_open_files),
        Rlimit(name="RLIMIT_FSIZE", value=limits.max_file_bytes),
        Rlimit(name="RLIMIT_CORE", value=0),
        Rlimit(name="RLIMIT_NPROC", value=limits.max_pids),
    ]
    if mode is IsolationMode.RLIMITS:
        plan.append(Rlimit(name="RLIMIT_AS", value=limits.memory_bytes + reserve))
    return tuple(plan)


def pool_rlimits() -> tuple[Rlimit, ...]:
    """The ceilings of a pooled sandbox, lowered per request by the agent (see POOL_CEILINGS)."""
    return (
        *(Rlimit(name=name, value=value) for name, value in POOL_CEILINGS.items()),
        Rlimit(name="RLIMIT_CORE", value=0),
    )


def mount_points(plan: BundlePlan) -> tuple[str, ...]:
    """Directories the root must hold for the mounts of ``plan`` (the root is read-only, so
    they are made on the host before the sandbox starts): each runtime mount's parent, and
    the mount point itself where the caller finds the source is a directory."""
    points = ["/proc", "/dev", "/sys", "/tmp", "/etc", SANDBOX_WORKDIR, SANDBOX_HOME, CONTROL_DIR]
    points += [str(Path(dest).parent) for _, dest in plan.mounts]
    points += [str(Path(dest).parent) for _, dest in plan.files]
    if plan.inputs:
        points.append("/inputs")
    if plan.packages:
        points.append(PACKAGES_DIR)
    if plan.sockets_dir is not None:
        points.append(socket_mount_point(plan))
    return tuple(dict.fromkeys(points))


def socket_mount_point(plan: BundlePlan) -> str:
    """Where ``plan.sockets_dir`` is bound in the sandbox."""
    return POOL_SOCKETS_PARENT if plan.sockets_later else SANDBOX_DIR


def socket_link(plan: BundlePlan) -> tuple[str, str] | None:
    """(link in the root, its relative target) of a pooled sandbox's ``/run``, else None."""
    if plan.sockets_dir is None or not plan.sockets_later:
        return None
    run = Path(SANDBOX_DIR).parent
    target = Path(POOL_SOCKETS_PARENT.lstrip("/"), POOL_SOCKETS_NAME).parent
    return str(run), str(target)


def _bind(source: Path | str, destination: str, *, writable: bool = False) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": str(source),
        "options": ["rbind", "rw" if writable else "ro", "nosuid", "nodev"],
    }


def build_config(plan: BundlePlan) -> dict[str, Any]:
    """The OCI runtime config (``config.json``) of one sandbox."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={plan.tmp_bytes}"],
        },
        # gVisor's /dev has no sized /dev/shm of its own; sized like /tmp, as in namespaces.
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "noexec", "mode=1777", f"size={plan.tmp_bytes}"],
        },
        # gVisor always mounts its own synthetic sysfs; an empty read-only tmpfs covers it.
        {
            "destination": "/sys",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["ro", "nosuid", "nodev", "noexec", "mode=555", "size=4096"],
        },
        _bind(plan.workspace, SANDBOX_WORKDIR, writable=True),
        _bind(plan.workspace, SANDBOX_HOME, writable=True),
        _bind(plan.control_dir, CONTROL_DIR),
    ]
    mounts += [_bind(host, f"/inputs/{name}") for host, name in plan.inputs]
    mounts += [_bind(pkg, f"{PACKAGES_DIR}/{pkg.name}") for pkg in plan.packages]
    mounts += [_bind(plan.etc_dir / name, f"/etc/{name}") for name in ETC_NAMES]
    # The runtime last, as in the namespaces backend: a runtime under a path the sandbox also
    # uses stays visible.
    mounts += [_bind(host, dest) for host, dest in plan.mounts]
    mounts += [_bind(host_file, dest) for host_file, dest in plan.files]
    if plan.sockets_dir is not None:
        mounts.append(_bind(plan.sockets_dir, socket_mount_point(plan)))
    no_caps: list[str] = []
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": plan.uid, "gid": plan.uid if plan.uid == 0 else SANDBOX_GID},
            "args": list(plan.command),
            "env": [f"{k}={plan.env[k]}" for k in sorted(plan.env)],
            "cwd": SANDBOX_WORKDIR,
            "capabilities": {
                "bounding": no_caps,
                "effective": no_caps,
                "inheritable": no_caps,
                "permitted": no_caps,
                "ambient": no_caps,
            },
            "rlimits": [{"type": r.name, "hard": r.value, "soft": r.value} for r in plan.rlimits],
            "noNewPrivileges": True,
        },
        "root": {"path": str(plan.rootfs), "readonly": True},
        "hostname": SANDBOX_HOSTNAME,
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "network"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
            ],
            # Resources are the host's (a cgroup made and joined before runsc starts), so that
            # root and rootless runs are limited the same way.
            "resources": {},
        },
    }


__all__ = [
    "ETC_NAMES",
    "POOL_CEILINGS",
    "POOL_SOCKETS_NAME",
    "POOL_SOCKETS_PARENT",
    "BundlePlan",
    "Rlimit",
    "build_config",
    "mount_points",
    "plan_rlimits",
    "pool_rlimits",
    "socket_link",
    "socket_mount_point",
]
