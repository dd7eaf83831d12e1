"""Run directories on the host: the size-capped workspace, the control files, and the sweep.

Layout, under the runs root (``$SANDCELL_RUNS``, default ``$TMPDIR/sandcell-<uid>``, mode 0700)::

    <owner>/<run_id>/work       the writable /work: a tmpfs of the run's workspace size
    <owner>/<run_id>/control    read-only /sandcell: boot script, Landlock plan, the program
    etc/                        synthetic /etc files shared by all runs (read-only in sandboxes)

``<owner>`` names the supervisor process (pid and start time). A supervisor that died (even by
SIGKILL) leaves its owner directory behind; the next start of sandcell sweeps every owner directory
whose process is gone: mounts are detached, directories removed, cgroups killed and removed.

The workspace is a tmpfs so its size is enforced by the kernel (ENOSPC), not by polling. As root it
is mounted on the host directly; an ordinary user cannot mount on the host, so the mount is made by
a small helper in a private user and mount namespace (see ``_mount_helper``), which holds the mount
until the supervisor has collected the exports.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import tempfile
from pathlib import Path

from sandcell.backends.host.layout import ETC_FILES
from sandcell.errors import InfraError

MOUNT_HELPER = Path(__file__).with_name("_mount_helper.py")
"""The workspace helper of an ordinary user: it mounts the workspace tmpfs in a private user and
mount namespace and runs the sandbox (bwrap or runsc) there."""

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2


@functools.cache
def _libc() -> ctypes.CDLL:
    # The process's own symbols, libc's among them (as elsewhere in sandcell): not
    # ctypes.util.find_library, which runs `ldconfig -p` in a child process on every command
    # line run.
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(target: Path, *, size_bytes: int, inodes: int, mode: int = 0o755) -> None:
    """Mount a size-capped tmpfs (nosuid, nodev) on ``target``."""
    opts = f"size={size_bytes},nr_inodes={inodes},mode={mode:o}".encode()
    rc = _libc().mount(b"tmpfs", str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Detach a mount (lazily, so a busy mount never blocks cleanup)."""
    rc = _libc().umount2(str(target).encode(), MNT_DETACH)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def runs_root() -> Path:
    explicit = os.environ.get("SANDCELL_RUNS")
    return Path(explicit) if explicit else Path(tempfile.gettempdir()) / f"sandcell-{os.geteuid()}"


def _start_time(pid: int, *, live: bool = False) -> str | None:
    """The start time of ``pid``; None if there is none (or, with ``live``, if it is a zombie:
    a supervisor killed under a parent that does not reap it holds nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    fields = stat.rpartition(")")[2].split()
    if live and fields[0] in ("Z", "X"):
        return None
    return fields[19]


@functools.cache
def owner_tag() -> str:
    """This supervisor's identity: pid and start time, so a reused pid is not mistaken for it."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    pid_text, _, start = tag.partition("-")
    if not pid_text.isdigit():
        return False
    return _start_time(int(pid_text), live=True) == start


def prepare_root() -> Path:
    """Create the runs root and the shared synthetic /etc (idempotent)."""
    root = runs_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.lstat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise InfraError(
            f"runs directory {root} is not private to uid {os.geteuid()}; remove it or set "
            "SANDCELL_RUNS to a directory only you can write"
        )
    etc = root / "etc"
    if not etc.is_dir():
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".etc-"))
        for name, text in ETC_FILES.items():
            (tmp / name).write_text(text)
            (tmp / name).chmod(0o644)
        tmp.chmod(0o755)
        try:
            tmp.rename(etc)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _mounts_under(path: Path) -> list[Path]:
    prefix = str(path).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                found.append(Path(point))
    # Deepest first, so nested mounts come off before their parents.
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """Detach every mount below ``path``, then delete it."""
    for mnt in _mounts_under(path):
        with contextlib.suppress(OSError):
            unmount(mnt)
    shutil.rmtree(path, ignore_errors=True)


def sweep_runs() -> list[Path]:
    """Remove run directories of supervisors that are gone. Returns what was removed."""
    root = runs_root()
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        if entry.name == "etc" or entry.name.startswith(".") or not entry.is_dir():
            continue
        if owner_alive(entry.name):
            continue
        remove_tree(entry)
        removed.append(entry)
    return removed


def list_files(root: Path) -> list[str]:
    """The regular files under ``root`` (a workspace as the host sees it), as sorted relative
    paths; no link is followed or listed."""
    found: list[str] = []
    for dirpath, _dirs, names in os.walk(root, followlinks=False):
        for name in names:
            full = Path(dirpath) / name
            if full.is_file() and not full.is_symlink():
                found.append(str(full.relative_to(root)))
    return sorted(found)
