"""The server name a TLS client asks for, read from the first bytes of a CONNECT tunnel.

The input is hostile: whatever a sandboxed program sends after ``CONNECT``. :func:`read_hello`
looks at at most :data:`MAX_HELLO_BYTES`, never trusts a length field beyond the bytes it has,
and answers one of three things: the ClientHello is not complete yet (read more), the bytes are
not a well-formed ClientHello (refuse), or here is the server name (None when there is none).

Decisions the proxy builds on:

- A ClientHello without a server name is refused for a tunnel to a name: it would let the
  program reach a server by address while the record names a host. (A tunnel to an IP literal
  has no name to send, RFC 6066 §3, and needs none.)
- A ClientHello with the encrypted_client_hello extension is refused: its outer name is a
  front, the real one is hidden.
- Two server_name extensions, or two host names in one, are malformed, not a choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandcell.errors import SandcellError

MAX_HELLO_BYTES = 64 * 1024
"""The most bytes of the tunnel read to find the ClientHello (records with their headers)."""

_RECORD_HANDSHAKE = 0x16
_HANDSHAKE_CLIENT_HELLO = 0x01
_MAX_RECORD = 2**14 + 2048  # TLSCiphertext's bound; a plaintext hello is far smaller
_EXT_SERVER_NAME = 0x0000
_EXT_ENCRYPTED_CLIENT_HELLO = 0xFE0D
_NAME_TYPE_HOST = 0x00
_HOST = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """The outcome of :func:`read_hello`. Exactly one of the three states holds."""

    incomplete: bool = False
    """The bytes so far are a valid prefix: read more (up to :data:`MAX_HELLO_BYTES`)."""
    problem: str | None = None
    """Why the bytes are not an acceptable ClientHello."""
    server_name: str | None = None
    """The lower-case host name the client asked for; None when it sent none."""


class _Malformed(SandcellError):
    """Raised inside the parser; becomes ``Hello.problem``."""


class _Short(SandcellError):
    """The data ended inside a structure that claims to continue."""


def read_hello(data: bytes) -> Hello:
    """Parse the start of a TLS connection up to the end of its ClientHello."""
    try:
        return _read(data[:MAX_HELLO_BYTES])
    except _Short:
        if len(data) >= MAX_HELLO_BYTES:
            return Hello(problem=f"no complete ClientHello within {MAX_HELLO_BYTES} bytes")
        return Hello(incomplete=True)
    except _Malformed as exc:
        return Hello(problem=f"not a TLS ClientHello: {exc}")


def _read(data: bytes) -> Hello:
    handshake = bytearray()
    offset = 0
    while True:
        header = _take(data, offset, 5)
        if header[0] != _RECORD_HANDSHAKE:
            raise _Malformed(f"record type {header[0]} is not a handshake")
        if header[1] != 3:
            raise _Malformed("the record version is not TLS")
        length = int.from_bytes(header[3:5], "big")
        if not 0 < length <= _MAX_RECORD:
            raise _Malformed(f"a record of {length} bytes")
        offset += 5
        body = data[offset : offset + length]
        handshake += body
        offset += len(body)
        if len(handshake) >= 4:
            if handshake[0] != _HANDSHAKE_CLIENT_HELLO:
                raise _Malformed(f"handshake message type {handshake[0]} is not a ClientHello")
            size = int.from_bytes(handshake[1:4], "big")
            if size + 4 > MAX_HELLO_BYTES:
                raise _Malformed(f"a ClientHello of {size} bytes")
            if len(handshake) >= size + 4:
                return _client_hello(bytes(handshake[4 : 4 + size]))
        if len(body) < length:
            raise _Short


def _client_hello(body: bytes) -> Hello:
    reader = _Reader(body)
    reader.take(2 + 32)  # legacy_version, random
    reader.vector(1, maximum=32)  # legacy_session_id
    suites = reader.vector(2)
    if not suites or len(suites) % 2:
        raise _Malformed("bad cipher suite list")
    if not reader.vector(1):
        raise _Malformed("empty compression method list")
    if reader.done():
        return Hello()  # no extensions at all: no server name
    extensions = _Reader(reader.vector(2))
    if not reader.done():
        raise _Malformed("bytes after the extensions")
    seen: set[int] = set()
    name: str | None = None
    while not extensions.done():
        kind = int.from_bytes(extensions.take(2), "big")
        data = extensions.vector(2)
        if kind in seen:
            raise _Malformed(f"extension {kind} appears twice")
        seen.add(kind)
        if kind == _EXT_ENCRYPTED_CLIENT_HELLO:
            return Hello(problem="an encrypted ClientHello hides the server name")
        if kind == _EXT_SERVER_NAME:
            name = _server_name(data)
    return Hello(server_name=name)


def _server_name(data: bytes) -> str:
    names = _Reader(_Reader(data).vector(2, exact=True))
    host: str | None = None
    while not names.done():
        kind = names.take(1)[0]
        value = names.vector(2)
        if kind != _NAME_TYPE_HOST:
            continue
        if host is not None:
            raise _Malformed("two host names in server_name")
        try:
            text = value.decode("ascii").lower()
        except UnicodeDecodeError:
            raise _Malformed("a server name that is not ASCII") from None
        text = text[:-1] if text.endswith(".") else text
        if len(text) > 253 or not _HOST.match(text):
            raise _Malformed(f"server name {text[:80]!a} is not a host name")
        host = text
    if host is None:
        raise _Malformed("a server_name extension without a host name")
    return host


def _take(data: bytes, offset: int, count: int) -> bytes:
    if offset + count > len(data):
        raise _Short
    return data[offset : offset + count]


class _Reader:
    """Reads a complete structure: running out of bytes here is malformed, not short."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def take(self, count: int) -> bytes:
        if self._at + count > len(self._data):
            raise _Malformed("a length runs past the end of its structure")
        chunk = self._data[self._at : self._at + count]
        self._at += count
        return chunk

    def vector(self, width: int, *, maximum: int | None = None, exact: bool = False) -> bytes:
        length = int.from_bytes(self.take(width), "big")
        if maximum is not None and length > maximum:
            raise _Malformed(f"a field of {length} bytes where at most {maximum} fit")
        value = self.take(length)
        if exact and not self.done():
            raise _Malformed("bytes after a length-delimited list")
        return value

    def done(self) -> bool:
        return self._at >= len(self._data)
