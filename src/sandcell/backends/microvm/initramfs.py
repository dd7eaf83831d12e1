"""The guest's initramfs: busybox, the virtio modules and a short /init, as a newc cpio archive.

The stock Debian cloud kernel builds virtio-mmio, virtio-blk and virtio-console as modules, so the
root filesystem (an ext4 image on a read-only virtio-blk disk) cannot be mounted by the kernel
itself. /init loads the modules, mounts the image read-only and hands over to the guest agent.

The archive is written by :func:`cpio_newc` from pure data (no ``cpio`` binary needed) and is
uncompressed: under TCG, decompressing costs more than reading a few hundred kilobytes.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable
from dataclasses import dataclass

MODULE_ORDER = ("virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "virtio_console")
"""Load order (each needs the ones before it)."""
AGENT_PATH = "/opt/sandcell/agent.py"
"""The guest agent inside the root image."""
GUEST_PYTHON = "/usr/bin/python3"
"""Started as the agent's interpreter (the image puts the runtime's base interpreter there)."""
FAILED_MARK = "sandcell-init-failed:"
"""Printed on the console when /init cannot hand over; the host quotes the line."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One archive member: a directory, a regular file, a symlink or a character device."""

    path: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def init_script(*, agent_python: str = GUEST_PYTHON) -> str:
    """The text of /init (busybox sh): modules, root image, then the agent as pid 1."""
    mods = " ".join(MODULE_ORDER)
    return f"""#!/bin/busybox sh
B=/bin/busybox
fail() {{ echo "{FAILED_MARK} $*" > /dev/console; $B poweroff -f; }}
$B mount -t devtmpfs dev /dev || fail devtmpfs
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in {mods}; do $B insmod /lib/modules/$m.ko || fail "insmod $m"; done
n=0
while [ ! -b /dev/vda ]; do
    n=$((n + 1)); [ $n -gt 500 ] && fail "no root disk /dev/vda"; $B usleep 10000
done
$B mount -t ext4 -o ro,noload,nodev /dev/vda /root || fail "mount root image"
$B mount --move /dev /root/dev
$B mount --move /proc /root/proc
$B mount --move /sys /root/sys
exec $B switch_root /root {agent_python} -I -S {AGENT_PATH}
"""


def entries(busybox: bytes, modules: dict[str, bytes]) -> list[Entry]:
    """The archive's members for ``busybox`` (a static binary) and the named module files."""
    missing = [m for m in MODULE_ORDER if m not in modules]
    if missing:
        raise ValueError(f"missing kernel modules: {', '.join(missing)}")
    out = [
        Entry("dev", stat.S_IFDIR | 0o755),
        Entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
        Entry("bin", stat.S_IFDIR | 0o755),
        Entry("bin/busybox", stat.S_IFREG | 0o755, busybox),
        Entry("proc", stat.S_IFDIR | 0o755),
        Entry("sys", stat.S_IFDIR | 0o755),
        Entry("root", stat.S_IFDIR | 0o755),
        Entry("lib", stat.S_IFDIR | 0o755),
        Entry("lib/modules", stat.S_IFDIR | 0o755),
    ]
    out += [Entry(f"lib/modules/{m}.ko", stat.S_IFREG | 0o644, modules[m]) for m in MODULE_ORDER]
    out.append(Entry("init", stat.S_IFREG | 0o755, init_script().encode()))
    return out


def cpio_newc(members: Iterable[Entry]) -> bytes:
    """A newc ("070701") cpio archive of ``members``, owned by root, with the trailer."""
    parts: list[bytes] = []
    ino = 1
    for e in [*members, Entry("TRAILER!!!", 0)]:
        name = e.path.encode() + b"\x00"
        fields = (
            ino,
            e.mode,
            0,  # uid
            0,  # gid
            1 if not stat.S_ISDIR(e.mode) else 2,
            0,  # mtime: fixed, so the same inputs give the same bytes
            len(e.data),
            0,
            0,
            e.rdev[0],
            e.rdev[1],
            len(name),
            0,
        )
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        parts.append(header + name)
        parts.append(b"\x00" * (-(len(header) + len(name)) % 4))
        parts.append(e.data)
        parts.append(b"\x00" * (-len(e.data) % 4))
        ino += 1
    archive = b"".join(parts)
    return archive + b"\x00" * (-len(archive) % 512)


__all__ = ["AGENT_PATH", "FAILED_MARK", "GUEST_PYTHON", "MODULE_ORDER", "cpio_newc", "entries"]
