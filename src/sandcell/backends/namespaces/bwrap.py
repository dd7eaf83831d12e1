"""bubblewrap: finding the binary, and the argument list for one run, as pure data.

The argument list is the filesystem and namespace half of the security argument, so it is built by
one pure function, :func:`build_argv`, and unit-tested without privileges. Order matters in bwrap
(later mounts cover earlier ones), and the order below is: private ``/tmp``, ``/proc``, ``/dev``,
the workspace, the run's read-only control directory, inputs, packages, the run's socket
directory, synthetic ``/etc``, and the runtime read-only last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.host.layout import (
    PACKAGES_DIR,
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_HOSTNAME,
    SANDBOX_UID,
    SANDBOX_WORKDIR,
    SOCKETS_DIR,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BwrapPlan:
    """Everything :func:`build_argv` needs; no I/O happens while building the argument list."""

    bwrap: str
    ro_dirs: Sequence[str]
    """Runtime directories, bound read-only at the same path."""
    mounts: Sequence[tuple[str, str]] = ()
    """(host path, sandbox path): the runtime's neutral view, bound read-only after ``ro_dirs``."""
    files: Sequence[tuple[Path, str]] = ()
    """(host file, sandbox path): the runtime's synthetic files, bound after ``mounts``."""
    symlinks: Sequence[tuple[str, str]]
    workspace: Path
    """Host directory that becomes the writable working directory."""
    control_dir: Path
    """Host directory with the boot, plan and program, bound read-only at ``/sandcell``."""
    etc_dir: Path
    """Host directory with synthetic passwd, group and hosts files."""
    inputs: Sequence[tuple[Path, str]]
    """(host path, name): bound read-only at ``/inputs/<name>``."""
    packages: Sequence[Path] = ()
    """Host directories of cache packages: bound read-only at ``/packages/<name>``."""
    sockets_dir: Path | None = None
    """The run's socket directory (``run_sockets``): bound read-only at ``/run/sandcell``."""
    env: Mapping[str, str]
    tmp_bytes: int
    seccomp_fd: int | None
    info_fd: int
    block_fd: int | None
    """bwrap waits on it before it builds the sandbox, until the host has put the init in its
    cgroup and set its rlimits; None when both were in place before bwrap started (a spawner
    in the run's cgroup, limited ahead: ``spawner.py``)."""
    command: Sequence[str]
    as_pid_1: bool = False
    """Run ``command`` as the sandbox's pid 1, without bwrap's own reaper there: one process
    fewer to start and to wake at the end. Only for a command that reaps every child and
    reports its program's status itself (the cold path's boot)."""


def build_argv(plan: BwrapPlan) -> list[str]:
    """The bwrap command line for one run."""
    a: list[str] = [plan.bwrap]
    # Every namespace, explicitly (not --unshare-all, whose user namespace is only "try").
    a += ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    a += ["--unshare-uts", "--unshare-cgroup"]
    if plan.as_pid_1:
        a += ["--as-pid-1"]
    a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", SANDBOX_HOSTNAME]
    # No nested user namespaces (the usual first step of a kernel exploit), no capabilities, a new
    # session so the code has no controlling terminal to inject keystrokes into, and the whole
    # sandbox dies with its supervisor.
    a += ["--disable-userns", "--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    a += ["--clearenv"]
    for key in sorted(plan.env):
        a += ["--setenv", key, plan.env[key]]
    a += ["--perms", "1777", "--size", str(plan.tmp_bytes), "--tmpfs", "/tmp"]
    a += ["--proc", "/proc", "--dev", "/dev"]
    # /dev/shm sized like /tmp: the tmpfs of --dev has the kernel default (half the host's memory),
    # which only a memory cgroup would bound, and the rlimits mode has none.
    a += ["--perms", "1777", "--size", str(plan.tmp_bytes), "--tmpfs", "/dev/shm"]
    a += ["--bind", str(plan.workspace), SANDBOX_WORKDIR]
    a += ["--bind", str(plan.workspace), SANDBOX_HOME]
    a += ["--ro-bind", str(plan.control_dir), "/sandcell"]
    for host_path, name in plan.inputs:
        a += ["--ro-bind", str(host_path), f"/inputs/{name}"]
    for pkg in plan.packages:
        a += ["--ro-bind", str(pkg), f"{PACKAGES_DIR}/{pkg.name}"]
    if plan.sockets_dir is not None:
        a += ["--ro-bind", str(plan.sockets_dir), SOCKETS_DIR]
    for name in ("passwd", "group", "hosts", "nsswitch.conf"):
        a += ["--ro-bind", str(plan.etc_dir / name), f"/etc/{name}"]
    # The runtime last: a venv that lives under a path the sandbox also uses (a virtualenv in
    # /tmp, say) stays visible instead of being covered by the sandbox's own mount.
    for d in plan.ro_dirs:
        a += ["--ro-bind", d, d]
    for host, dest in plan.mounts:
        a += ["--ro-bind", host, dest]
    for host_file, dest in plan.files:
        a += ["--ro-bind", str(host_file), dest]
    for link, target in plan.symlinks:
        a += ["--symlink", target, link]
    a += ["--remount-ro", "/"]
    a += ["--chdir", SANDBOX_WORKDIR]
    if plan.seccomp_fd is not None:
        a += ["--seccomp", str(plan.seccomp_fd)]
    a += ["--info-fd", str(plan.info_fd)]
    if plan.block_fd is not None:
        a += ["--block-fd", str(plan.block_fd)]
    a += ["--", *plan.command]
    return a


def args_via_fd(argv: Sequence[str], fd: int) -> tuple[list[str], bytes]:
    """``argv`` with its options moved to descriptor ``fd`` (bwrap's ``--args``): the short
    command line, and the bytes to put in ``fd``. bwrap stays the sandbox's pid 1, and its
    command line, readable there, would name every host path it binds. The sandbox's command
    (after ``--``) stays on the line: bwrap reads only options from the descriptor."""
    end = list(argv).index("--")
    data = b"".join(arg.encode() + b"\0" for arg in argv[1:end])
    return [argv[0], "--args", str(fd), *argv[end:]], data
