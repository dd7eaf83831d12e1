"""A session VM's saved state (issue 23): QEMU's own snapshot of RAM and devices, or the
workspace's files, in a directory the session owns, and the VM brought back from it.

Memory (:func:`save_memory`): the VM is stopped and its whole migration stream (RAM and devices)
goes through a pipe into a helper QEMU started with the same command line, paused with
``-incoming``, whose RAM is a file in the state directory mapped shared (``ram``, sparse: pages
the guest never wrote stay holes). The helper then saves its devices with ``x-ignore-shared``
(``state``, small: the RAM is already in the file) and is killed; it never runs the guest. One
path for every way a session VM started (cold with anonymous RAM, a pool clone mapping the pool's
snapshot privately, a VM restored from a state), and the RAM is written once. The saved VM is
resumed (``cont``) when it keeps running (a fork, a snapshot of a live session), else left
stopped for the session's teardown.

:func:`restore_memory` starts a QEMU that maps ``ram`` private (copy-on-write: copies restored
from one state share its unchanged pages through the page cache, and none writes to the file),
loads ``state`` with ``x-ignore-shared`` and resumes it. QEMU checks little itself, so the state's
detail keeps the exact command line (without per-VM paths), the QEMU version, the image's hash
and the limits the guest enforces, and a restore that differs in any of them is refused. The
session gives the guest fresh entropy and the wall clock next (``session.py``).

Files (:func:`copy_workspace`, :func:`workspace_frames`): the files the guest sent through the
bounded transfer (``transfer.FileSink``) are copied into ``files/`` (regular files and
directories only, nothing followed), and a restore sends them into the new VM's workspace before
its kernel starts.

Limitation: QEMU 7.2 opens a private RAM file read-write, so the jail lets the restored QEMU
open ``ram`` writable although it only maps it private; a write through a compromised QEMU
changes the file's bytes, and the session's hashes refuse the state on its next use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from sandcell.backends.microvm import channel, machine, qemu
from sandcell.backends.microvm.qmp import QMP
from sandcell.backends.microvm.vm import VM
from sandcell.errors import ConfigError, InfraError
from sandcell.spec import Limits

STATE = "state"
"""The device state (QEMU's migration stream without the RAM)."""
RAM = "ram"
"""The guest's RAM, sparse."""
FILES = "files"
"""The workspace's files (``files`` mode)."""
FORMAT = "microvm-qemu-1"
SAVE_TIMEOUT_S = 180.0
"""For the whole save (the stream of a guest of some hundred MiB and a sync, on a busy host)."""
RESTORE_TIMEOUT_S = 60.0
_IGNORE_SHARED = "x-ignore-shared"
_UNLIMITED = 1 << 40
"""Bytes per second: no limit that matters."""
_HOST_ONLY_LIMITS = ("wall_time_s",)
"""Limits the host enforces per cell, free to differ on restore; the rest are in the guest's
saved memory (its cgroup, the kernel's rlimits, the workspace's tmpfs)."""


def limits_doc(limits: Limits) -> str:
    """The guest-enforced limits, as the detail keeps them."""
    doc = {k: v for k, v in dataclasses.asdict(limits).items() if k not in _HOST_ONLY_LIMITS}
    return json.dumps(doc, sort_keys=True)


def _caps(q: QMP, on: bool, deadline: float) -> None:
    q.execute(
        "migrate-set-capabilities",
        capabilities=[{"capability": _IGNORE_SHARED, "state": on}],
        deadline=deadline,
    )


def _qmp(vm: VM, deadline: float) -> QMP:
    if vm.qmp is None:
        if vm.plan is None or vm.plan.qmp is None:
            raise InfraError("this session's VM was started without its control socket")
        vm.qmp = QMP(str(vm.plan.qmp), deadline, alive=vm.alive)
    return vm.qmp


def save_memory(
    vm: VM, state_dir: Path, *, guest: machine.Guest, limits: Limits, keep_running: bool
) -> dict[str, str]:
    """Save the VM's RAM and devices into ``state_dir`` (see module); returns the detail."""
    vplan = vm.plan
    if vplan is None or vm.image_sha256 is None:
        raise InfraError("this session's VM has no recorded command line to save with")
    deadline = time.monotonic() + SAVE_TIMEOUT_S
    q = _qmp(vm, deadline)
    ram = state_dir / RAM
    helper_dir = machine.new_run_dir("save")
    hplan = dataclasses.replace(
        vplan,
        channel=helper_dir / "chan.sock",
        qmp=helper_dir / "qmp.sock",
        ram_file=ram,
        ram_shared=True,
        incoming=True,
    )
    read_end, write_end = os.pipe()
    helper: VM | None = None
    stopped = False
    try:
        helper = machine.start(guest, hplan, helper_dir, pass_fds=[read_end], rw=[state_dir])
        # The helper holds the read end under the same number (``pass_fds``).
        helper_fd = read_end
        os.close(read_end)
        read_end = -1
        assert hplan.qmp is not None
        hq = QMP(str(hplan.qmp), deadline, alive=helper.alive)
        helper.qmp = hq
        # Both sides carry the RAM in the stream: the source's may be private (a clone), and
        # the helper's shared file must be filled from it.
        _caps(hq, False, deadline)
        hq.execute("migrate-incoming", uri=f"fd:{helper_fd}", deadline=deadline)
        _caps(q, False, deadline)
        # QEMU rate-limits a migration (128 MiB/s by default) for a live guest's sake; this
        # one is stopped, and the stream goes to a local pipe.
        q.execute("migrate-set-parameters", deadline=deadline, **{"max-bandwidth": _UNLIMITED})
        t0 = time.monotonic()
        q.execute("stop", deadline=deadline)
        stopped = True
        q.send_fd("sandcell-save", write_end, deadline=deadline)
        os.close(write_end)
        write_end = -1
        q.execute("migrate", uri="fd:sandcell-save", deadline=deadline)
        q.wait_migration(deadline)
        hq.wait_migration(deadline)
        stream_s = time.monotonic() - t0
        if keep_running:
            # The parent goes on as before: its channel was never touched.
            q.execute("cont", deadline=deadline)
            stopped = False
        _caps(hq, True, deadline)
        fd = os.open(state_dir / STATE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            hq.send_fd("sandcell-state", fd, deadline=deadline)
        finally:
            os.close(fd)
        hq.execute("migrate", uri="fd:sandcell-state", deadline=deadline)
        hq.wait_migration(deadline)
    except BaseException:
        if stopped and keep_running:
            with contextlib.suppress(InfraError, OSError):
                q.execute("cont", deadline=time.monotonic() + 10)
        raise
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        if helper is not None:
            helper.destroy()
        else:
            shutil.rmtree(helper_dir, ignore_errors=True)
    os.chmod(ram, 0o600)
    # Durable before the save counts as done: a paused session must outlive a host restart.
    for path in (ram, state_dir / STATE):
        _fsync(path)
    _fsync_dir(state_dir)
    return {
        "format": FORMAT,
        "qemu_version": guest.qemu.version,
        "identity": json.dumps(qemu.snapshot_identity(vplan)),
        "machine": qemu.MACHINE,
        "cpu": qemu.CPU if vplan.accel == "tcg" else "host",
        "accel": vplan.accel,
        "memory_mib": str(vplan.memory_mib),
        "append": vplan.append,
        "image_sha256": vm.image_sha256,
        "limits": limits_doc(limits),
        "stream_ms": f"{stream_s * 1000:.0f}",
    }


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore_plan(
    guest: machine.Guest, detail: dict[str, str], state_dir: Path, run_dir: Path
) -> qemu.VMPlan:
    """The restoring QEMU's plan: the saved one's memory and kernel command line."""
    try:
        memory_mib = int(detail["memory_mib"])
        append = detail["append"]
    except (KeyError, ValueError):
        raise ConfigError("the saved state's detail is incomplete: refused") from None
    vplan = machine.plan(
        guest,
        run_dir,
        memory_mib=memory_mib,
        ram_file=state_dir / RAM,
        ram_shared=False,
        incoming=True,
        with_qmp=True,
    )
    return dataclasses.replace(vplan, append=append)


def check(
    detail: dict[str, str], *, guest: machine.Guest, vplan: qemu.VMPlan, limits: Limits
) -> None:
    """Refuse a state this VM would not restore exactly (ConfigError saying which fact differs)."""
    if detail.get("format") != FORMAT:
        raise ConfigError(f"the saved state is of format {detail.get('format')!r}, not {FORMAT}")
    if detail.get("qemu_version") != guest.qemu.version:
        raise ConfigError(
            f"the state was saved with QEMU {detail.get('qemu_version')}, this host runs "
            f"{guest.qemu.version}: refused (QEMU does not check this itself)"
        )
    if detail.get("image_sha256") != guest.files.manifest.image_sha256:
        raise ConfigError(
            "the state was saved in another build of the guest image (sandcell vm build since): "
            "refused; a files-mode state restores into any image"
        )
    if detail.get("identity") != json.dumps(qemu.snapshot_identity(vplan)):
        raise ConfigError(
            "the state was saved with another QEMU command line (machine, CPU, memory, devices, "
            "kernel or accelerator): refused"
        )
    if detail.get("limits") != limits_doc(limits):
        raise ConfigError(
            "the state was saved under other limits, which its guest still enforces: refused; "
            "restore it with the limits it was saved with"
        )


def restore_memory(
    guest: machine.Guest, detail: dict[str, str], state_dir: Path, *, name: str, limits: Limits
) -> VM:
    """A VM resumed from ``state_dir`` (see module), its channel connected; nothing sent yet."""
    run_dir = machine.new_run_dir(name)
    try:
        vplan = restore_plan(guest, detail, state_dir, run_dir)
        check(detail, guest=guest, vplan=vplan, limits=limits)
        state = state_dir / STATE
        ram = state_dir / RAM
        st = os.lstat(ram)
        if not stat.S_ISREG(st.st_mode) or st.st_size != vplan.memory_mib << 20:
            raise ConfigError("the saved state's RAM file is not the size it was saved with")
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(run_dir)
        raise
    deadline = time.monotonic() + RESTORE_TIMEOUT_S
    fd = os.open(state, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        # QEMU 7.2 opens a private RAM file read-write (see module); state is read-only.
        vm = machine.start(guest, vplan, run_dir, pass_fds=[fd], rw=[ram], ro=[state])
    finally:
        os.close(fd)
    try:
        assert vplan.qmp is not None
        q = QMP(str(vplan.qmp), deadline, alive=vm.alive)
        vm.qmp = q
        _caps(q, True, deadline)
        q.execute("migrate-incoming", uri=f"fd:{fd}", deadline=deadline)
        q.wait_migration(deadline)
        # Connected before the guest runs: what it sends first is not lost.
        vm.connect(deadline)
        q.execute("cont", deadline=deadline)
    except BaseException:
        vm.destroy()
        raise
    return vm


# -- files ---------------------------------------------------------------------------------


def copy_workspace(src: Path, dest: Path, *, skip: set[str]) -> int:
    """Copy the regular files and directories under ``src`` (the transfer's host copy) into
    ``dest``, new; links, sockets and FIFOs (the transfer's stand-ins, ``skip``) are dropped
    and nothing is followed. Returns the bytes copied."""
    dest.mkdir(mode=0o700)
    total = 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        for name in list(dirnames):
            path = Path(dirpath) / name
            if not stat.S_ISDIR(os.lstat(path).st_mode) or str(rel / name) in skip:
                dirnames.remove(name)
                continue
            (dest / rel / name).mkdir(mode=0o700)
        for name in filenames:
            if str(rel / name) in skip:
                continue
            total += _copy_file(Path(dirpath) / name, dest / rel / name)
    return total


def _copy_file(src: Path, dest: Path) -> int:
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return 0  # a link or special file: dropped
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        out = os.open(
            dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        total = 0
        try:
            while data := os.read(fd, 1 << 20):
                os.write(out, data)
                total += len(data)
            os.fsync(out)
        finally:
            os.close(out)
        return total
    finally:
        os.close(fd)


def workspace_frames(root: Path, *, max_bytes: int, max_entries: int) -> Iterator[bytes]:
    """The ``F``/``D`` frames that recreate the saved files under the guest's workspace (area
    ``workspace``), parents first; nothing under ``root`` is followed."""
    entries = 0
    left = max_bytes
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root)
        for name in list(dirnames):
            if not stat.S_ISDIR(os.lstat(Path(dirpath) / name).st_mode):
                dirnames.remove(name)
                continue
            entries += 1
            meta = {"area": "workspace", "path": str(rel / name), "type": "dir", "size": 0}
            yield channel.encode(channel.INPUT, json.dumps(meta).encode())
        for name in sorted(filenames):
            try:
                fd = os.open(
                    Path(dirpath) / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                )
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                entries += 1
                left -= st.st_size
                if entries > max_entries or left < 0:
                    raise ConfigError("the saved files are over the workspace's limits")
                meta = {
                    "area": "workspace",
                    "path": str(rel / name),
                    "type": "file",
                    "size": st.st_size,
                }
                yield channel.encode(channel.INPUT, json.dumps(meta).encode())
                remaining = st.st_size
                while remaining > 0:
                    data = os.read(fd, min(channel.MAX_FRAME, remaining))
                    if not data:
                        # Shrunk while read (it should not: the state is the session's): pad.
                        data = b"\x00" * min(channel.MAX_FRAME, remaining)
                    remaining -= len(data)
                    yield channel.encode(channel.DATA, data)
            finally:
                os.close(fd)


__all__ = [
    "FILES",
    "FORMAT",
    "RAM",
    "STATE",
    "check",
    "copy_workspace",
    "limits_doc",
    "restore_memory",
    "save_memory",
    "workspace_frames",
]
