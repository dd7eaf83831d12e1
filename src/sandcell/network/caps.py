"""The per-run caps of the egress proxy, and the counters that enforce them."""

from __future__ import annotations

from dataclasses import dataclass

from sandcell.errors import ConfigError
from sandcell.spec import MiB


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyLimits:
    """How much one run may do through its proxy. Every cap ends or refuses, never queues."""

    max_concurrent: int = 32
    """Connections open at once; one more is answered ``503``."""
    max_connections: int = 1024
    """Connections in the whole run; one more is answered ``429``."""
    max_bytes_up: int = 64 * MiB
    """Bytes the program may send, over the run; reaching it closes the connection."""
    max_bytes_down: int = 512 * MiB
    """Bytes the program may receive, over the run; reaching it closes the connection."""
    idle_timeout_s: float = 30.0
    """A connection with no byte either way for this long is closed; so is a request head
    not complete by then."""
    connect_timeout_s: float = 10.0
    """How long connecting to the server may take; then ``504``."""
    max_head_bytes: int = 32 * 1024
    """The largest request head (request line and headers); a larger one is answered ``431``."""
    max_headers: int = 100
    """The most header lines in a request head; more is answered ``431``."""
    max_refused_records: int = 2048
    """Refused attempts kept in the report; later refused ones are only counted. Allowed
    attempts are always kept (they are bounded by ``max_connections``), so that a flood of
    refusals cannot push a connection that reached the outside out of the record."""

    def __post_init__(self) -> None:
        for name in (
            "max_concurrent",
            "max_connections",
            "max_bytes_up",
            "max_bytes_down",
            "max_head_bytes",
            "max_headers",
            "max_refused_records",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"proxy limit {name} must be a positive integer, got {value!r}")
        for name in ("idle_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"proxy limit {name} must be a positive number, got {value!r}")
        if self.max_head_bytes < 1024:
            raise ConfigError("proxy limit max_head_bytes must be at least 1024")


class Budget:
    """The run's counters. Used only from the proxy's event loop, so it needs no lock."""

    def __init__(self, limits: ProxyLimits) -> None:
        self.limits = limits
        self.open = 0
        self.accepted = 0
        self.bytes_up = 0
        self.bytes_down = 0

    def admit(self) -> tuple[int, str] | None:
        """Count a new connection, or give the HTTP status and reason refusing it (and do not
        count it): 429 past the run's total, 503 past the connections at once."""
        if self.accepted >= self.limits.max_connections:
            return 429, f"the run's cap of {self.limits.max_connections} connections is reached"
        if self.open >= self.limits.max_concurrent:
            return 503, (
                f"the run's cap of {self.limits.max_concurrent} connections at once is reached"
            )
        self.accepted += 1
        self.open += 1
        return None

    def release(self) -> None:
        """A connection admitted by :meth:`admit` has ended."""
        self.open -= 1

    def allowance(self, up: bool) -> int:
        """How many more bytes may go in that direction."""
        if up:
            return self.limits.max_bytes_up - self.bytes_up
        return self.limits.max_bytes_down - self.bytes_down

    def spend(self, up: bool, count: int) -> None:
        """Count ``count`` bytes relayed in that direction."""
        if up:
            self.bytes_up += count
        else:
            self.bytes_down += count
