"""The gateway's wire format: one length-prefixed JSON object each way per connection.

A frame is a 4-byte big-endian length then that many bytes of UTF-8 JSON, an object. Requests::

    {"op": "list"}
    {"op": "call", "tool": "tickets.search_tickets", "args": {"query": "refund"}}

Answers: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``. Any other key
in a request is refused, so a program cannot smuggle in fields the gateway might one day read
(``approved``, ``approver``). Everything here treats the peer as hostile.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Literal

from sandcell.errors import SandcellError

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
"""No frame is larger, whatever a tool's limits say."""


class ProtocolError(SandcellError, ValueError):
    """A frame or request the gateway refuses; the message is shown to the program."""


@dataclass(frozen=True, slots=True)
class Request:
    """A request that passed :func:`parse_request`."""

    op: Literal["list", "call"]
    tool: str = ""
    args: dict[str, object] = field(default_factory=dict)


def read_frame(sock: socket.socket, limit: int) -> bytes:
    """One frame's body; at most ``limit`` bytes.

    Raises:
        ProtocolError: the peer closed early or announced a larger frame.
        TimeoutError: the socket's timeout passed.
    """
    (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    if size > limit:
        raise ProtocolError(f"the request is {size} bytes, above the limit of {limit}")
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise ProtocolError("the connection closed in the middle of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_frame(sock: socket.socket, body: bytes) -> None:
    """Send one frame."""
    sock.sendall(_HEADER.pack(len(body)) + body)


def encode(value: object) -> bytes:
    """``value`` as the compact JSON of a frame."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def parse_request(body: bytes) -> Request:
    """Check a request frame's body.

    Raises:
        ProtocolError: saying what is wrong.
    """
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"the request is not UTF-8 JSON: {type(exc).__name__}") from None
    if not isinstance(value, dict):
        raise ProtocolError("the request must be a JSON object")
    op = value.get("op")
    allowed = (
        {"list": {"op"}, "call": {"op", "tool", "args"}}.get(op) if isinstance(op, str) else None
    )
    if allowed is None:
        raise ProtocolError("op must be 'list' or 'call'")
    extra = sorted(set(value) - allowed)
    if extra:
        raise ProtocolError(f"unknown field(s) {', '.join(map(repr, extra))}; refused")
    if op == "list":
        return Request(op="list")
    tool, args = value.get("tool"), value.get("args", {})
    if not isinstance(tool, str) or not tool or len(tool) > 200:
        raise ProtocolError("tool must be a non-empty name")
    if not isinstance(args, dict):
        raise ProtocolError("args must be a JSON object")
    return Request(op="call", tool=tool, args=args)
