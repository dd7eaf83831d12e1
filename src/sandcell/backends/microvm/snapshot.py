"""Snapshots: a guest booted once with its agent ready and the preload imported, saved, and
restored copy-on-write for each run.

:func:`take` boots a VM whose RAM is a file under ``/dev/shm`` mapped shared, waits until its
agent answers (runner started, preload imported, nothing of any run inside), stops it and saves
the device state with ``x-ignore-shared`` (the RAM is already in the file) through a descriptor
(``migrate fd:``, so QEMU never spawns a process). :func:`restore` starts a clone that maps the
RAM file private (copy-on-write: it reads only the pages it touches, and writes stay its own),
loads the state and resumes; the clone's agent then completes the handshake with its new host.

A snapshot is refused (InfraError) when the clone's command line or QEMU version differs from the
one it was taken with (QEMU does not reject every mismatch itself), when the state file's sha256
changed, or when the RAM file's inode, size or times changed since it was saved (tampering).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sandcell.backends.microvm import layout, machine, qemu
from sandcell.backends.microvm.qmp import QMP
from sandcell.backends.microvm.vm import VM
from sandcell.errors import InfraError

RESTORE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """A saved guest: its RAM file and device state, and what it was taken with."""

    id: str
    dir: Path
    memory_mib: int
    preload: tuple[str, ...]
    identity: tuple[str, ...]
    """:func:`qemu.snapshot_identity` of the saved VM's plan."""
    qemu_version: str
    state_sha256: str
    ram_key: tuple[int, ...]
    image_sha256: str

    @property
    def ram(self) -> Path:
        return self.dir / "ram"

    @property
    def state(self) -> Path:
        return self.dir / "state"


def _ram_key(path: Path) -> tuple[int, ...]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def take(
    guest: machine.Guest, *, memory_mib: int, preload: tuple[str, ...], timeout_s: float
) -> Snapshot:
    """Boot, wait until ready, save; the saving VM is destroyed (see module)."""
    root = layout.snapshots_root()
    root.mkdir(mode=0o700, exist_ok=True)
    snap_id = uuid.uuid4().hex[:8]
    d = root / f"tmp-{layout.owner_tag()}-{snap_id}"
    d.mkdir(mode=0o700)
    try:
        return _take(guest, d, snap_id, memory_mib=memory_mib, preload=preload, timeout_s=timeout_s)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise


def _take(
    guest: machine.Guest,
    d: Path,
    snap_id: str,
    *,
    memory_mib: int,
    preload: tuple[str, ...],
    timeout_s: float,
) -> Snapshot:
    run_dir = machine.new_run_dir(f"snapshot-{snap_id}")
    vplan = machine.plan(
        guest,
        run_dir,
        memory_mib=memory_mib,
        preload=preload,
        ram_file=d / "ram",
        ram_shared=True,
        with_qmp=True,
    )
    deadline = time.monotonic() + timeout_s
    vm = machine.start(guest, vplan, run_dir, rw=[d])
    try:
        machine.wait_ready(vm, deadline, greet_only=True)
        assert vplan.qmp is not None
        q = QMP(str(vplan.qmp), deadline)
        try:
            caps = [{"capability": "x-ignore-shared", "state": True}]
            q.execute("migrate-set-capabilities", capabilities=caps, deadline=deadline)
            q.execute("stop", deadline=deadline)
            fd = os.open(d / "state", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                q.send_fd("state", fd, deadline=deadline)
            finally:
                os.close(fd)
            q.execute("migrate", uri="fd:state", deadline=deadline)
            q.wait_migration(deadline)
        finally:
            q.close()
    finally:
        vm.destroy()
    snap = Snapshot(
        id=snap_id,
        dir=d,
        memory_mib=memory_mib,
        preload=preload,
        identity=tuple(qemu.snapshot_identity(vplan)),
        qemu_version=guest.qemu.version,
        state_sha256=_sha256(d / "state"),
        ram_key=_ram_key(d / "ram"),
        image_sha256=guest.files.manifest.image_sha256,
    )
    meta = {**asdict(snap), "dir": str(d)}
    (d / "meta.json").write_text(json.dumps(meta, indent=1))
    return snap


def _key(guest: machine.Guest, memory_mib: int, preload: tuple[str, ...]) -> str:
    probe = machine.plan(
        guest, Path("/"), memory_mib=memory_mib, preload=preload, ram_file=Path("RAM")
    )
    doc = json.dumps([qemu.snapshot_identity(probe), guest.qemu.version])
    return hashlib.sha256(doc.encode()).hexdigest()[:20]


def _load(d: Path) -> Snapshot | None:
    try:
        doc = json.loads((d / "meta.json").read_text())
        doc["dir"] = d
        doc["preload"] = tuple(doc["preload"])
        doc["identity"] = tuple(doc["identity"])
        doc["ram_key"] = tuple(doc["ram_key"])
        return Snapshot(**doc)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def cached(
    guest: machine.Guest, *, memory_mib: int, preload: tuple[str, ...], timeout_s: float
) -> Snapshot:
    """The snapshot for this guest and preload, shared by this user's processes: taken once,
    kept under ``/dev/shm`` (``cache-<key>``, the key a hash of the command line and QEMU's
    version) and reused while it passes :func:`check`. One that fails it is replaced."""
    root = layout.snapshots_root()
    root.mkdir(mode=0o700, exist_ok=True)
    final = root / f"cache-{_key(guest, memory_mib, preload)}"
    found = _load(final)
    if found is None and final.exists() and not in_use(final):
        # Half-written or of an older format: it could never be used, nor replaced in place.
        stale = root / f"stale-{layout.owner_tag()}-{uuid.uuid4().hex[:6]}"
        with contextlib.suppress(OSError):
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
    if found is not None:
        probe = machine.plan(
            guest,
            Path("/"),
            memory_mib=memory_mib,
            preload=preload,
            ram_file=found.ram,
            incoming=True,
        )
        try:
            check(found, guest, probe)
            return found
        except InfraError:
            stale = root / f"stale-{layout.owner_tag()}-{uuid.uuid4().hex[:6]}"
            with contextlib.suppress(OSError):
                os.rename(final, stale)
                shutil.rmtree(stale, ignore_errors=True)
    fresh = take(guest, memory_mib=memory_mib, preload=preload, timeout_s=timeout_s)
    try:
        os.rename(fresh.dir, final)
    except OSError:
        # Another process of this user saved the same snapshot first: use that one.
        remove(fresh)
        other = _load(final)
        if other is None:
            raise InfraError(f"the shared snapshot {final} is unreadable") from None
        return other
    moved = dataclasses.replace(fresh, dir=final)
    (final / "meta.json").write_text(json.dumps({**asdict(moved), "dir": str(final)}, indent=1))
    return moved


def remove_stale(image: Path, image_sha256: str) -> list[str]:
    """Remove this user's shared snapshots of the guest image at ``image`` that were taken of
    another build of it (``sandcell vm build`` of that image's VM directory). Snapshots of other
    images (another ``$SANDCELL_VM_DIR``) are not this build's to remove, and one that a live
    QEMU still maps stays until that QEMU is gone (:func:`cached` replaces it then)."""
    removed: list[str] = []
    root = layout.snapshots_root()
    if not root.is_dir():
        return removed
    for d in root.glob("cache-*"):
        snap = _load(d)
        if snap is None or snap.image_sha256 == image_sha256:
            continue
        taken_of = image_path(snap)
        if taken_of is None or not _same_file_path(taken_of, image) or in_use(d):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


def image_path(snap: Snapshot) -> Path | None:
    """The guest image the snapshot's VM had as its root disk (from its command line)."""
    for arg in snap.identity:
        if arg.startswith("id=root,file="):
            return Path(arg[len("id=root,file=") :].split(",", 1)[0])
    return None


def _same_file_path(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def qemus_naming(path: Path) -> list[int]:
    """The pids of live QEMU processes (or their jails) whose command line names a file under
    ``path``."""
    needle = str(path).encode() + b"/"
    found: list[int] = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in cmdline and needle in cmdline:
            found.append(int(pid_dir.name))
    return found


def in_use(d: Path) -> bool:
    """Whether a live QEMU (or its jail) names a file of the snapshot directory ``d``."""
    return bool(qemus_naming(d))


def check(snap: Snapshot, guest: machine.Guest, vplan: qemu.VMPlan) -> None:
    """Refuse a snapshot that does not match this clone or was changed (see module)."""
    if guest.qemu.version != snap.qemu_version:
        raise InfraError(
            f"snapshot {snap.id} was taken with QEMU {snap.qemu_version}, not "
            f"{guest.qemu.version}: refused"
        )
    if tuple(qemu.snapshot_identity(vplan)) != snap.identity:
        raise InfraError(f"snapshot {snap.id} was taken with another QEMU command line: refused")
    if guest.files.manifest.image_sha256 != snap.image_sha256:
        raise InfraError(f"snapshot {snap.id} was taken with another guest image: refused")
    try:
        key = _ram_key(snap.ram)
        state_sha = _sha256(snap.state)
    except OSError as exc:
        raise InfraError(f"snapshot {snap.id} is incomplete ({exc}): refused") from None
    if key != snap.ram_key or state_sha != snap.state_sha256:
        raise InfraError(f"snapshot {snap.id} was changed after it was saved (tampered): refused")


def restore(
    guest: machine.Guest,
    snap: Snapshot,
    *,
    name: str,
    started: Callable[[VM], None] | None = None,
) -> VM:
    """A clone of ``snap``, resumed, its agent through the handshake and waiting for a job.
    ``started`` is called with the VM as soon as QEMU runs: a pool closing meanwhile kills it
    there, and the restore then fails at once instead of finishing a clone nobody will use."""
    run_dir = machine.new_run_dir(name)
    vplan = machine.plan(
        guest,
        run_dir,
        memory_mib=snap.memory_mib,
        preload=snap.preload,
        ram_file=snap.ram,
        ram_shared=False,
        incoming=True,
        with_qmp=True,
    )
    try:
        check(snap, guest, vplan)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    deadline = time.monotonic() + RESTORE_TIMEOUT_S
    fd = os.open(snap.state, os.O_RDONLY)
    try:
        # The RAM file must be opened read-write by QEMU even though the clone maps it private.
        vm = machine.start(guest, vplan, run_dir, pass_fds=[fd], rw=[snap.ram], ro=[snap.state])
    finally:
        os.close(fd)
    try:
        if started is not None:
            started(vm)
        assert vplan.qmp is not None
        q = QMP(str(vplan.qmp), deadline, alive=vm.alive)
        vm.qmp = q
        caps = [{"capability": "x-ignore-shared", "state": True}]
        q.execute("migrate-set-capabilities", capabilities=caps, deadline=deadline)
        q.execute("migrate-incoming", uri=f"fd:{fd}", deadline=deadline)
        q.wait_migration(deadline)
        q.execute("cont", deadline=deadline)
        machine.wait_ready(vm, deadline)
    except BaseException:
        vm.destroy()
        raise
    return vm


def remove(snap: Snapshot) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(snap.dir)


def find_cached(
    guest: machine.Guest, *, memory_mib: int, preload: tuple[str, ...]
) -> Snapshot | None:
    """The shared snapshot :func:`cached` keeps for this guest and preload, if one is there and
    passes :func:`check`. Never takes one: a caller without a pool (a session's VM) restores
    what another process saved, or boots cold."""
    found = _load(layout.snapshots_root() / f"cache-{_key(guest, memory_mib, preload)}")
    if found is None:
        return None
    probe = machine.plan(
        guest, Path("/"), memory_mib=memory_mib, preload=preload, ram_file=found.ram, incoming=True
    )
    try:
        check(found, guest, probe)
    except InfraError:
        return None
    return found


__all__ = [
    "Snapshot",
    "cached",
    "check",
    "find_cached",
    "image_path",
    "in_use",
    "remove",
    "remove_stale",
    "restore",
    "take",
]
