"""Where the microVM backend keeps its files on the host (pure path decisions).

The guest kernel and image are built once and shared by every user of the host, so they live in a
system-wide directory that ordinary users can read::

    $SANDCELL_VM_DIR, else /var/lib/sandcell/vm when it exists (what scripts/install-vm creates
    as root), else ~/.local/share/sandcell/vm (a user's own install)
        kernel/vmlinuz, config, release, modules/*.ko     scripts/install-vm
        image/root.ext4, initrd.cpio, manifest.json        sandcell vm build (runtime default)
        image-<runtime>/ (the same files)                  sandcell vm build --runtime NAME

Per-run state (QEMU's sockets, console log) lives in ``$TMPDIR/sandcell-vm-<uid>/<owner>/<run>``
and snapshots (the guest RAM file and its device state) in ``/dev/shm/sandcell-vm-<uid>/<owner>-
<id>``, where ``<owner>`` names the supervisor process (pid and start time) so that a later start
can sweep what a killed supervisor left.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

from sandcell.runtimes.store.locks import check_name
from sandcell.spec import DEFAULT_RUNTIME

SYSTEM_DIR = Path("/var/lib/sandcell/vm")
SHM_ROOT = Path("/dev/shm")


def vm_dir() -> Path:
    """The directory holding the guest kernel and image (see module docstring)."""
    explicit = os.environ.get("SANDCELL_VM_DIR")
    if explicit:
        return Path(explicit)
    if SYSTEM_DIR.is_dir():
        return SYSTEM_DIR
    return platformdirs.user_data_path("sandcell") / "vm"


def kernel_dir(base: Path | None = None) -> Path:
    return (base or vm_dir()) / "kernel"


def image_dir(base: Path | None = None, runtime: str | None = None) -> Path:
    """The guest image built from ``runtime`` (None or ``default``: ``image``, as before named
    runtimes existed; a named one: ``image-<name>``)."""
    if runtime is None or runtime == DEFAULT_RUNTIME:
        return (base or vm_dir()) / "image"
    # The name becomes a path: refuse one that is not a runtime name before it does.
    return (base or vm_dir()) / f"image-{check_name(runtime)}"


def runs_root() -> Path:
    """Per-run host state of this user's VMs (mode 0700)."""
    return Path(tempfile.gettempdir()) / f"sandcell-vm-{os.geteuid()}"


def snapshots_root() -> Path:
    """Snapshots of this user's VMs: RAM files must sit on a shared-memory filesystem."""
    return SHM_ROOT / f"sandcell-vm-{os.geteuid()}"


def owner_tag() -> str:
    """This supervisor: its pid and start time, so a reused pid is not taken for it."""
    return f"{os.getpid()}-{_start_time(os.getpid())}"


def owner_alive(tag: str) -> bool:
    """Whether the supervisor named by ``tag`` (from :func:`owner_tag`) still runs."""
    pid_text, _, start = tag.partition("-")
    if not pid_text.isdigit():
        return False
    return _start_time(int(pid_text), live=True) == start


def _start_time(pid: int, *, live: bool = False) -> str:
    """The start time of ``pid``; ``gone`` if there is none (or, with ``live``, if it is a
    zombie: a supervisor killed under a parent that does not reap it holds nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return "gone"
    # The command name may hold spaces and parentheses: fields count from the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if live and fields and fields[0] in (b"Z", b"X"):
        return "gone"
    return fields[19].decode() if len(fields) > 19 else "unknown"


__all__ = [
    "image_dir",
    "kernel_dir",
    "owner_alive",
    "owner_tag",
    "runs_root",
    "snapshots_root",
    "vm_dir",
]
