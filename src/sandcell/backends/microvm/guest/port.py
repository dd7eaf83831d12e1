"""The agent's end of the virtio-serial port named ``sandcell``: handshake and frames.

A frame is a one-byte kind and a big-endian 32-bit length, then the payload (at most
:data:`MAX_FRAME` bytes; a longer payload goes as several frames of the same kind). The host's
side is ``microvm/channel.py``; this is the guest's own copy of those few lines, as the guest
imports nothing of sandcell.
"""

from __future__ import annotations

import os
import select
import struct
import time

MAX_FRAME = 1 << 20
HEADER = struct.Struct(">cI")
PORT_NAME = "sandcell"


def find_port() -> str:
    """The device of the port named ``sandcell`` (waiting up to 5 s for it to appear)."""
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        try:
            for dev in os.listdir(base):
                with open(f"{base}/{dev}/name") as f:
                    if f.read().strip() == PORT_NAME:
                        return f"/dev/{dev}"
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("no virtio-serial port named sandcell")


class Port:
    """The port, non-blocking: frames out (:meth:`send`) and in (:meth:`frames`).

    ``early`` holds frames already read that a later step must handle first (what came with
    the job: inputs, stdin, go); :meth:`frames` returns them before reading more.
    """

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.buf = bytearray()
        self.early: list[tuple[bytes, bytes]] = []

    def read_some(self, timeout: float) -> bool:
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            # No host connected yet (or it went away): a restored VM waits for its new host.
            time.sleep(0.005)
            return False
        self.buf += data
        return True

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                select.select([], [self.fd], [], 1.0)
                continue
            view = view[n:]

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        for i in range(0, max(len(payload), 1), MAX_FRAME):
            part = payload[i : i + MAX_FRAME]
            self.write(HEADER.pack(kind, len(part)) + part)

    def handshake(self) -> None:
        """Answer the host's ``SCHELLO nonce`` and ``SCGO nonce`` lines (anything else on the
        port before them, console noise included, is skipped)."""
        nonce = None
        while True:
            while b"\n" not in self.buf:
                self.read_some(1.0)
                if len(self.buf) > 1 << 16:
                    del self.buf[: -(1 << 12)]
            line, _, rest = bytes(self.buf).partition(b"\n")
            self.buf = bytearray(rest)
            words = line.split()
            if len(words) == 2 and words[0].endswith(b"SCHELLO"):
                nonce = words[1]
                self.write(b"SCHELLO " + nonce + b"\n")
            elif len(words) == 2 and words[0].endswith(b"SCGO") and words[1] == nonce:
                self.write(b"SCREADY " + nonce + b"\n")
                return

    def frames(self, timeout: float) -> list[tuple[bytes, bytes]]:
        """Complete frames available now (waiting up to ``timeout`` for more bytes). Every
        frame returned must be handled: none is kept for a later call."""
        out, self.early = self.early, []
        if not out:
            self.read_some(timeout)
        while len(self.buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self.buf)
            if length > MAX_FRAME:
                raise RuntimeError("oversized frame from the host")
            end = HEADER.size + length
            if len(self.buf) < end:
                break
            out.append((kind, bytes(self.buf[HEADER.size : end])))
            del self.buf[:end]
        return out
