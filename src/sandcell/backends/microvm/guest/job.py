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

from .cgroup import cpu_usage_ms, current_memory
from .system import GID, MS_BIND, UID, mount, remount_ro, tmpfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .port import Port

    Job = dict[str, Any]

WORKSPACE = "/sandbox/"
AREAS = {"packages": "/packages/", "workspace": WORKSPACE}
"""Where an ``F`` frame's file goes by its ``area`` (the default: ``/inputs/``)."""
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
                area = AREAS.get(meta.get("area"), "/inputs/")
                if area == WORKSPACE and not job.get("workspace_mounted"):
                    # A session restored from saved files: they go into the workspace itself.
                    tmpfs("/sandbox", lim["workspace_bytes"], lim["workspace_inodes"], 0o755, UID)
                    job["workspace_mounted"] = True
                path = area + meta["path"]
                owner = UID if area == WORKSPACE else 0
                if meta["type"] == "dir":
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    os.lchown(path, owner, owner)
                    continue
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                current = os.open(path, flags, 0o644 if area == WORKSPACE else 0o444)
                os.fchown(current, owner, owner)
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
    if not job.get("workspace_mounted"):
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


def usage_now() -> dict[str, Any]:
    """The session's usage now (the host's ``metrics``): the program cgroup's CPU time and
    memory, and the workspace's bytes."""
    out: dict[str, Any] = {"cpu_ms": cpu_usage_ms(), "mem_bytes": current_memory()}
    try:
        st = os.statvfs("/sandbox")
        out["disk_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    except OSError:
        out["disk_bytes"] = None
    return out
