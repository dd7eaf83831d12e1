"""Framing for the session channels: a 4-byte big-endian length, then that many bytes of JSON.

Part of the cell contract (:mod:`sandcell.backends.cell`): used between the host and the
in-sandbox kernel (``_kernel.py`` speaks the same framing) on every rung, and between the CLI and
a session server. The decoder is incremental and bounded: whatever the other
end sends, it never buffers more than ``max_bytes`` for one message, and anything that is not a
JSON object is a :class:`ChannelError`.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from collections.abc import Iterator

from sandcell.errors import InfraError

MAX_KERNEL_MESSAGE = 1024 * 1024
"""The largest message accepted from a kernel (its replies are small; a cell may forge others)."""


class ChannelError(InfraError):
    """The other end broke the framing or closed the channel in the middle of a message."""


def encode(message: dict[str, object]) -> bytes:
    """One framed message."""
    body = json.dumps(message, ensure_ascii=False).encode("utf-8")
    return len(body).to_bytes(4, "big") + body


class FrameDecoder:
    """Bytes in, messages out: ``feed(chunk)`` then iterate :meth:`messages`."""

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk

    def messages(self) -> Iterator[dict[str, object]]:
        while len(self._buf) >= 4:
            size = int.from_bytes(self._buf[:4], "big")
            if size > self.max_bytes:
                raise ChannelError(f"a message of {size} bytes is over the {self.max_bytes} cap")
            if len(self._buf) < 4 + size:
                return
            body = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            try:
                msg = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ChannelError(f"a message is not JSON: {exc}") from None
            if not isinstance(msg, dict):
                raise ChannelError("a message is not a JSON object")
            yield msg

    @property
    def pending(self) -> bool:
        """Part of a message is buffered."""
        return bool(self._buf)


def send_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking descriptor."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_message(sock: socket.socket, message: dict[str, object]) -> None:
    sock.sendall(encode(message))


def recv_message(
    sock: socket.socket, *, max_bytes: int, timeout_s: float | None = None
) -> dict[str, object]:
    """One message from a stream socket; ChannelError when it closes first or times out."""
    decoder = FrameDecoder(max_bytes=max_bytes)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        for msg in decoder.messages():
            return msg
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise ChannelError(f"no answer within {timeout_s:g} s")
        chunk = sock.recv(65536)
        if not chunk:
            raise ChannelError("the other end closed the channel")
        decoder.feed(chunk)


__all__ = [
    "MAX_KERNEL_MESSAGE",
    "ChannelError",
    "FrameDecoder",
    "encode",
    "recv_message",
    "send_all",
    "send_message",
]
