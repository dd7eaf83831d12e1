"""What every job sets up before its program: entropy, clock, hostname, inputs, workspace.

A job is the host's JSON document (:data:`Job`); its ``limits`` size the tmpfs mounts.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import time

from .system import GID, MS_BIND, UID, mount, remount_ro, tmpfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .port import Port

    Job = dict[str, Any]

RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207


def reseed(entropy: bytes, *, credit: bool = True) -> None:
    """Add the host's ``entropy`` to the kernel's pool, then force its generator to reseed (a
    VM restored from a snapshot would otherwise draw what every clone draws)."""
    fd = os.open("/dev/urandom", os.O_WRONLY)
    try:
        bits = len(entropy) * 8 if credit else 0
        info = struct.pack("ii", bits, len(entropy)) + entropy
        fcntl.ioctl(fd, RNDADDENTROPY, info)
        fcntl.ioctl(fd, RNDRESEEDCRNG)
    finally:
        os.close(fd)


def set_identity(job: Job) -> None:
    time.clock_settime_ns(time.CLOCK_REALTIME, int(job["time_ns"]))
    socket.sethostname(job["hostname"])


def receive_inputs(port: Port, job: Job) -> bytes:
    """Write the input and package files the host sends, until its ``G`` (go): then the
    workspace is set up and the program's stdin (``S`` frames) returned. Frames that came
    after the ``G`` are left in ``port.early``."""
    lim = job["limits"]
    if job["inputs"]:
        tmpfs("/inputs", job["inputs_bytes"] + (1 << 20), 1 << 20, 0o755)
    if job.get("packages"):
        # Cache packages, verified by the host: root's, read-only before the program starts.
        tmpfs("/packages", job["packages_bytes"] + (1 << 20), 1 << 20, 0o755)
    current = None
    left = 0
    stdin = bytearray()
    while True:
        frames = port.frames(1.0)
        while frames:
            kind, payload = frames.pop(0)
            if kind == b"F":
                meta = json.loads(payload)
                area = "/packages/" if meta.get("area") == "packages" else "/inputs/"
                path = area + meta["path"]
                if meta["type"] == "dir":
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    continue
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                current = os.open(path, flags, 0o444)
                left = meta["size"]
                if left == 0:
                    os.close(current)
                    current = None
            elif kind == b"D" and current is not None:
                os.write(current, payload)
                left -= len(payload)
                if left <= 0:
                    os.close(current)
                    current = None
            elif kind == b"S":
                stdin += payload
            elif kind == b"G":
                start_workspace(job, lim)
                port.early = frames
                return bytes(stdin)
            elif kind == b"K":
                raise SystemExit("killed before the program started")


def start_workspace(job: Job, lim: Job) -> None:
    """Inputs and packages read-only; the workspace, /tmp and /dev/shm fresh and capped; the
    program at ``job["code_path"]`` under a read-only /sandcell."""
    if job["inputs"]:
        remount_ro("/inputs")
    if job.get("packages"):
        remount_ro("/packages")
    tmpfs("/sandbox", lim["workspace_bytes"], lim["workspace_inodes"], 0o755, UID)
    # The workspace again where code written for other sandboxes expects its home (E2B's).
    mount("/sandbox", "/home/user", "", MS_BIND)
    # The image's runtime is under /opt (nothing under /tmp): the run's /tmp hides nothing.
    tmpfs("/tmp", lim["tmp_bytes"], 16384, 0o1777)
    # POSIX shared memory (multiprocessing's locks and queues), capped like /tmp.
    tmpfs("/dev/shm", lim["tmp_bytes"], 16384, 0o1777)
    for name in job["inputs"]:
        os.symlink(f"/inputs/{name}", f"/sandbox/{name}")
        os.lchown(f"/sandbox/{name}", UID, GID)
    tmpfs("/sandcell", 4 * len(job["code"]) + (1 << 16), 16, 0o755)
    with open(job["code_path"], "w", encoding="utf-8") as f:
        f.write(job["code"])
    remount_ro("/sandcell")
