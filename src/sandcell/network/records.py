"""What the egress proxy keeps of a run: one frozen record per connection attempt."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Method = Literal["CONNECT", "SOCKS", "HTTP", "INVALID", "UNREAD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionRecord:
    """One attempt to leave the sandbox through the proxy, allowed or refused."""

    seq: int
    """Order of arrival in the run, from 1."""
    method: Method
    """``CONNECT`` (a tunnel), ``SOCKS`` (a tunnel asked for over SOCKS5), ``HTTP`` (a plain
    request), ``INVALID`` (no valid request could be read), ``UNREAD`` (refused by a connection
    cap before reading anything)."""
    host: str
    """The host the program asked for, as normalised (the raw text, escaped, when it was not a
    valid host)."""
    port: int
    """The port it asked for; 0 when no request could be read."""
    address: str | None
    """The address the proxy connected to; None when it did not connect."""
    allowed: bool
    """Whether the proxy let traffic through (a tunnel opened, a request forwarded)."""
    reason: str
    """Why it was refused, or how an allowed connection ended (``closed``, a cap reached...)."""
    status: int | None
    """The HTTP status the proxy itself answered (200 for an open tunnel; a refusal's code; for
    SOCKS, the HTTP status of the same outcome); None when it answered nothing (a plain request
    relays the server's own answer)."""
    sni: str | None = None
    """The server name of the tunnel's ClientHello, when one was read."""
    bytes_up: int = 0
    """Bytes relayed from the program to the server."""
    bytes_down: int = 0
    """Bytes relayed from the server to the program."""
    started_at: float
    """Wall-clock time (Unix seconds) the connection was accepted."""
    ended_at: float
    """Wall-clock time it was closed."""

    def to_record(self) -> dict[str, object]:
        """The record as plain JSON-ready data, for the run record."""
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyReport:
    """Everything the proxy saw in one run, returned when it stops."""

    profile: str
    """The profile whose allowlist applied."""
    records: tuple[ConnectionRecord, ...]
    """Attempts in the order they ended: every one that reached the outside, and refused ones
    up to the cap on refused records."""
    refused_dropped: int = 0
    """Refused attempts past that cap: counted, not listed."""
    bytes_up: int = 0
    """Total bytes relayed from the program."""
    bytes_down: int = 0
    """Total bytes relayed to the program."""

    @property
    def refused(self) -> tuple[ConnectionRecord, ...]:
        """The refused attempts."""
        return tuple(r for r in self.records if not r.allowed)

    def to_record(self) -> dict[str, object]:
        """The report as plain JSON-ready data, for the run record."""
        return {
            "profile": self.profile,
            "connections": [r.to_record() for r in self.records],
            "refused_dropped": self.refused_dropped,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }
