"""The host side of the channel to the guest agent: a handshake, then length-prefixed frames.

The byte stream is a virtio-serial port (QEMU's chardev socket on the host). Bytes written while a
restored VM is still loading its device state can be lost, so the stream starts with a line
handshake the guest can resynchronise on: the host repeats ``SCHELLO <nonce>`` until the guest
echoes it, sends ``SCGO <nonce>``, and frames start after the guest's ``SCREADY <nonce>`` line.

A frame is one type byte, a 4-byte big-endian length and at most :data:`MAX_FRAME` bytes of
payload. Everything read from the guest is hostile: a length over the cap, an unknown type or a
stream that ends mid-frame is a protocol error (:class:`ChannelError`), never trusted.
The guest agent (``guest/port.py``) carries its own copy of these few lines, as it imports
nothing of sandcell.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import TYPE_CHECKING

from sandcell.errors import SandcellError

if TYPE_CHECKING:
    from sandcell.backends.microvm.relay import Pump

MAX_FRAME = 1 << 20
HEADER = struct.Struct(">cI")

# host -> guest
JOB = b"J"
INPUT = b"F"
DATA = b"D"
STDIN = b"S"
GO = b"G"
KILL = b"K"
WARM = b"P"
# guest -> host
STDOUT = b"O"
STDERR = b"E"
EXIT = b"X"
FILE = b"F"
SKIPPED = b"L"
DONE = b"Z"
FAILED = b"W"
WARMED = b"p"
GUEST_TYPES = frozenset({STDOUT, STDERR, EXIT, FILE, DATA, SKIPPED, DONE, FAILED, WARMED})


class ChannelError(SandcellError):
    """The guest broke the protocol or the stream ended; the message says how."""


class ChannelTimeout(ChannelError):
    """Nothing arrived before the deadline."""


def encode(kind: bytes, payload: bytes = b"") -> bytes:
    if len(kind) != 1 or len(payload) > MAX_FRAME:
        raise ValueError(f"frame {kind!r} of {len(payload)} bytes is not sendable")
    return HEADER.pack(kind, len(payload)) + payload


def chunks(kind: bytes, data: bytes) -> list[bytes]:
    """``data`` as frames of at most :data:`MAX_FRAME` bytes (none for empty data)."""
    return [encode(kind, data[i : i + MAX_FRAME]) for i in range(0, len(data), MAX_FRAME)]


class FrameReader:
    """Parses frames out of bytes as they arrive; bounded buffer."""

    def __init__(self, allowed: frozenset[bytes] = GUEST_TYPES) -> None:
        self.buf = bytearray()
        self.allowed = allowed

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.buf += data
        out: list[tuple[bytes, bytes]] = []
        while len(self.buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self.buf)
            if kind not in self.allowed:
                raise ChannelError(f"the guest sent an unknown frame type {kind!r}")
            if length > MAX_FRAME:
                raise ChannelError(f"the guest sent a frame of {length} bytes (cap {MAX_FRAME})")
            end = HEADER.size + length
            if len(self.buf) < end:
                break
            out.append((kind, bytes(self.buf[HEADER.size : end])))
            del self.buf[:end]
        return out


class Channel:
    """A connected stream socket to the agent, with the handshake and framed I/O."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.reader = FrameReader()
        self.pending: list[tuple[bytes, bytes]] = []
        self.closed = False
        self.pump: Pump | None = None
        """Set while a relay thread owns the socket (a run with sockets, ``relay.py``)."""

    def greet(self, deadline: float, *, interval_s: float = 0.02) -> None:
        """Greet the agent until it answers, without starting the frames: the agent is then
        booted, its runner ready, and it waits for the rest of the handshake (a VM to save)."""
        nonce = os.urandom(8).hex()
        hello = f"SCHELLO {nonce}\n".encode()
        buf = bytearray()
        next_hello = 0.0
        t0 = time.monotonic()
        while hello not in buf:
            now = time.monotonic()
            if now >= deadline:
                raise ChannelTimeout("the guest agent did not answer")
            if now >= next_hello:
                self.send_raw(hello)
                next_hello = now + (interval_s if now - t0 < 1.0 else 0.25)
            data = self._read(max(min(deadline, next_hello) - now, 0.0))
            if data is not None:
                buf += data
                if len(buf) > 1 << 20:
                    raise ChannelError("the guest sent too much before the handshake")

    def handshake(self, deadline: float, *, interval_s: float = 0.02) -> None:
        """Greet the agent until it answers, then switch to frames (see module docstring)."""
        nonce = os.urandom(8).hex()
        hello, ready = f"SCHELLO {nonce}\n".encode(), f"SCREADY {nonce}\n".encode()
        buf = bytearray()
        answered = False
        next_hello = 0.0
        t0 = time.monotonic()
        while True:
            now = time.monotonic()
            if not answered and now >= next_hello:
                self.send_raw(hello)
                # Often while a restored guest resumes; rarely while a cold one boots (each
                # greeting waits in the port until the agent reads and answers it).
                next_hello = now + (interval_s if now - t0 < 1.0 else 0.25)
            wait = min(deadline, next_hello) - now if not answered else deadline - now
            if now >= deadline:
                raise ChannelTimeout("the guest agent did not answer")
            data = self._read(max(wait, 0.0))
            if data is None:
                continue
            buf += data
            if len(buf) > 1 << 20:
                raise ChannelError("the guest sent too much before the handshake")
            if not answered and hello in buf:
                answered = True
                self.send_raw(f"SCGO {nonce}\n".encode())
            at = buf.find(ready)
            if answered and at >= 0:
                rest = bytes(buf[at + len(ready) :])
                self.pending = self.reader.feed(rest)
                return

    def _read(self, timeout: float) -> bytes | None:
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return None
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise ChannelError(f"the channel failed: {exc}") from None
        if not data:
            self.closed = True
            raise ChannelError("the guest closed the channel")
        return data

    def send_raw(self, data: bytes) -> None:
        if self.pump is not None:
            self.pump.send(data)
            return
        view = memoryview(data)
        while view:
            try:
                n = self.sock.send(view)
            except BlockingIOError:
                select.select([], [self.sock], [], 1.0)
                continue
            except OSError as exc:
                raise ChannelError(f"the channel failed: {exc}") from None
            view = view[n:]

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        self.send_raw(encode(kind, payload))

    def recv(self, deadline: float) -> tuple[bytes, bytes]:
        """The next frame; ChannelTimeout at the deadline."""
        if self.pump is not None:
            return self.pump.recv(deadline)
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("no frame before the deadline")
            data = self._read(left)
            if data is not None:
                self.pending = self.reader.feed(data)
        return self.pending.pop(0)

    def close(self) -> None:
        if self.pump is not None:
            self.pump.stop()
        self.sock.close()


def connect(path: str, deadline: float) -> socket.socket:
    """Connect to QEMU's chardev socket once QEMU has created it."""
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() >= deadline:
                raise ChannelTimeout(f"QEMU did not open its channel socket {path}") from None
            time.sleep(0.005)


__all__ = [
    "Channel",
    "ChannelError",
    "ChannelTimeout",
    "FrameReader",
    "chunks",
    "connect",
    "encode",
]
