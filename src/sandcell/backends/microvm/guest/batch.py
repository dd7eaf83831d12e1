"""Output on its way to the host: one :class:`Batch` per stream, held briefly and capped."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .port import Port

BATCH_BYTES = 64 << 10
BATCH_DELAY_S = 0.03


class Batch:
    """One output stream on its way to the host, as ``O``/``E`` frames while the program runs.

    At most ``cap`` bytes are sent in all (the host's cap plus one: the host sees it passed).
    Reads of a few bytes (an unbuffered ``print`` per line) are held until :data:`BATCH_BYTES`
    gathered or the oldest is :data:`BATCH_DELAY_S` old, so a chatty program sends a few frames a
    second, not one per write, on the port that also carries the run's socket traffic.
    """

    def __init__(self, port: Port, kind: bytes, cap: int) -> None:
        self.port = port
        self.kind = kind
        self.room = cap
        self.held = bytearray()
        self.since: float | None = None

    def reset(self, cap: int) -> None:
        """A new cell: what is held goes first, then ``cap`` bytes more may go."""
        self.flush()
        self.room = cap

    def add(self, data: bytes) -> None:
        part = data[: self.room]
        self.room -= len(part)
        if not part:
            return
        self.held += part
        if self.since is None:
            self.since = time.monotonic()
        if len(self.held) >= BATCH_BYTES or self.room == 0:
            self.flush()

    def wait(self, now: float) -> float | None:
        """Seconds until what is held must go (None: nothing held)."""
        return None if self.since is None else max(self.since + BATCH_DELAY_S - now, 0.0)

    def flush_due(self, now: float) -> None:
        if self.since is not None and now >= self.since + BATCH_DELAY_S:
            self.flush()

    def flush(self) -> None:
        if self.held:
            self.port.send(self.kind, bytes(self.held))
            self.held.clear()
        self.since = None


def select_timeout(batches: list[Batch], longest: float) -> float:
    """How long a select may wait without holding output past its time."""
    now = time.monotonic()
    waits = [w for w in (b.wait(now) for b in batches) if w is not None]
    return min([longest, *waits])
