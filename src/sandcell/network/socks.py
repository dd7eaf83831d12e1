"""SOCKS5 (RFC 1928), CONNECT without authentication: another way to ask for a tunnel.

It gets exactly the checks of an HTTP ``CONNECT`` (allowlist, pinned resolution, a ClientHello
naming the host). SOCKS has no room for a message, so a refusal is a reply code (``2``,
connection not allowed by ruleset, for an allowlist refusal); the reason is in the record.
Only the command ``CONNECT`` exists here: ``BIND`` and ``UDP ASSOCIATE`` are answered
"command not supported".
"""

from __future__ import annotations

import asyncio
import ipaddress

from sandcell.errors import SandcellError
from sandcell.network.http_head import Authority
from sandcell.network.relay import Flow, read_exactly

VERSION = 0x05
_NO_AUTH, _NO_METHOD = 0x00, 0xFF
_CONNECT = 0x01
_IPV4, _DOMAIN, _IPV6 = 0x01, 0x03, 0x04

SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02
HOST_UNREACHABLE = 0x04
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_NOT_SUPPORTED = 0x08


class SocksError(SandcellError):
    """A SOCKS request the proxy will not serve: ``code`` is the reply (None: no reply fits,
    just close), ``status`` the HTTP status of the same refusal (for the record)."""

    def __init__(self, code: int | None, status: int, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


def reply(code: int) -> bytes:
    """A reply with an all-zero bound address (the program has no use for the proxy's)."""
    return bytes([VERSION, code, 0x00, _IPV4, 0, 0, 0, 0, 0, 0])


def reply_for(status: int) -> int:
    """The reply code of a refusal the HTTP side would answer with ``status``."""
    return {403: NOT_ALLOWED, 502: HOST_UNREACHABLE, 504: TTL_EXPIRED}.get(status, GENERAL_FAILURE)


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flow: Flow
) -> Authority:
    """Negotiate (no authentication) and read the CONNECT request; the version byte has been
    read already.

    Raises:
        SocksError: for anything but a CONNECT without authentication.
        Stop: when the program goes idle or closes.
    """
    methods = await read_exactly(reader, flow, (await read_exactly(reader, flow, 1))[0])
    if _NO_AUTH not in methods:
        writer.write(bytes([VERSION, _NO_METHOD]))
        raise SocksError(None, 400, "SOCKS5 without authentication is the only method offered")
    writer.write(bytes([VERSION, _NO_AUTH]))
    version, command, _, kind = await read_exactly(reader, flow, 4)
    if version != VERSION:
        raise SocksError(GENERAL_FAILURE, 400, f"SOCKS request of version {version}")
    if command != _CONNECT:
        raise SocksError(COMMAND_NOT_SUPPORTED, 400, f"SOCKS command {command}: only CONNECT")
    if kind == _IPV4:
        host = str(ipaddress.IPv4Address(await read_exactly(reader, flow, 4)))
    elif kind == _IPV6:
        host = str(ipaddress.IPv6Address(await read_exactly(reader, flow, 16)))
    elif kind == _DOMAIN:
        raw = await read_exactly(reader, flow, (await read_exactly(reader, flow, 1))[0])
        if not raw or not raw.isascii():
            raise SocksError(GENERAL_FAILURE, 400, "a SOCKS host name that is not ASCII")
        host = raw.decode("ascii")
    else:
        raise SocksError(ADDRESS_NOT_SUPPORTED, 400, f"SOCKS address type {kind}")
    port = int.from_bytes(await read_exactly(reader, flow, 2), "big")
    if port == 0:
        raise SocksError(GENERAL_FAILURE, 400, "SOCKS port 0")
    return Authority(host=host, port=port)
