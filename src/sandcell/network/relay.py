"""Moving bytes between the program and a server, within the run's caps.

Each connection has a :class:`Flow`: its byte counts and the time of its last byte either way.
A read or a write that waits longer than the idle timeout since that last byte ends the
connection; so does reaching the run's byte cap in either direction (the bytes past the cap are
not relayed).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from sandcell.errors import SandcellError
from sandcell.network.caps import Budget
from sandcell.network.http_head import HeadError

CHUNK = 256 * 1024
MAX_CHUNK_LINE = 4096
MAX_TRAILER_LINES = 100
_CHUNK_SIZE = re.compile(rb"^[0-9A-Fa-f]{1,15}$")

End = Literal["closed", "idle", "cap", "error"]
_T = TypeVar("_T")


@dataclass(slots=True)
class Flow:
    """The mutable state of one connection (confined to the proxy's event loop)."""

    idle_s: float
    bytes_up: int = 0
    bytes_down: int = 0
    last: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        """Seconds until the connection counts as idle."""
        return self.idle_s - (time.monotonic() - self.last)


class Stop(SandcellError):
    """The relay ended early; ``end`` says why, ``up`` in which direction (for a cap)."""

    def __init__(self, end: End, *, up: bool = True) -> None:
        super().__init__(end)
        self.end: End = end
        self.up = up


def abort(writer: asyncio.StreamWriter) -> None:
    """Close at once, dropping anything unsent."""
    # CPython 3.11: a transport whose close() has finished flushing has let go of its loop,
    # and abort() then fails on it; such a transport needs nothing more.
    with contextlib.suppress(AttributeError):
        writer.transport.abort()


def describe(end: End, budget: Budget, up: bool) -> str:
    """A record's reason for how a connection ended."""
    if end == "cap":
        way, cap = (
            ("upload", budget.limits.max_bytes_up)
            if up
            else ("download", budget.limits.max_bytes_down)
        )
        return f"the run's {way} cap of {cap} bytes was reached"
    if end == "idle":
        return f"idle for {budget.limits.idle_timeout_s:g} s"
    return {"closed": "closed", "error": "the connection failed"}[end]


async def _idle_wait(flow: Flow, step: Callable[[], Awaitable[_T]]) -> _T:
    """Await ``step()``, ending with Stop("idle") once the flow has been idle too long.

    A deadline on the running task (no task per read: this is the relay's hot path). When it
    passes while the other direction was busy, the step is simply started again: a cancelled
    read or drain of a stream loses nothing.
    """
    while True:
        remaining = flow.remaining()
        if remaining <= 0:
            raise Stop("idle")
        try:
            async with asyncio.timeout(remaining):
                return await step()
        except TimeoutError:
            continue


async def read(reader: asyncio.StreamReader, flow: Flow, count: int) -> bytes:
    """Up to ``count`` bytes (b"" at end of stream), within the idle timeout."""
    return await _idle_wait(flow, lambda: reader.read(count))


async def read_exactly(reader: asyncio.StreamReader, flow: Flow, count: int) -> bytes:
    """Exactly ``count`` bytes, within the idle timeout.

    Raises:
        Stop: ``closed`` when the stream ends first.
    """
    try:
        return await _idle_wait(flow, lambda: reader.readexactly(count))
    except asyncio.IncompleteReadError:
        raise Stop("closed") from None


async def read_head(
    reader: asyncio.StreamReader, flow: Flow, *, what: str = "request head"
) -> bytes:
    """Bytes up to and including the empty line ending an HTTP head.

    The reader's limit bounds the head. Raises:
        HeadError: 431 (a request) or 502 (a response) when the head is too large; 400 or
        502 when the stream ends inside it.
        Stop: ``closed`` when the stream ends before any byte, ``idle`` on the idle timeout.
    """
    response = what != "request head"
    try:
        return await _idle_wait(flow, lambda: reader.readuntil(b"\r\n\r\n"))
    except asyncio.LimitOverrunError:
        raise HeadError(502 if response else 431, f"the {what} is too large") from None
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            if response:
                raise HeadError(502, "the server closed the connection without answering") from None
            raise Stop("closed") from None
        raise HeadError(502 if response else 400, f"the stream ended inside the {what}") from None


async def read_line(reader: asyncio.StreamReader, flow: Flow) -> bytes:
    """One CRLF-terminated line of at most :data:`MAX_CHUNK_LINE` bytes.

    Raises:
        HeadError: 400 when the line is longer, or the stream ends inside it.
    """
    try:
        line = await _idle_wait(flow, lambda: reader.readuntil(b"\r\n"))
    except asyncio.LimitOverrunError:
        raise HeadError(400, "a chunk line is too long") from None
    except asyncio.IncompleteReadError:
        raise HeadError(400, "the body ended inside a chunk line") from None
    if len(line) > MAX_CHUNK_LINE:
        raise HeadError(400, "a chunk line is too long")
    return line


async def send(
    writer: asyncio.StreamWriter, data: bytes, *, flow: Flow, budget: Budget, up: bool
) -> None:
    """Write ``data`` in the direction ``up``, counting it against the run's cap.

    Raises:
        Stop: ``cap`` when the data would pass the cap (nothing past it is written), ``idle``
        when the receiver stops reading, ``error`` when it has gone.
    """
    if len(data) > budget.allowance(up):
        raise Stop("cap", up=up)
    budget.spend(up, len(data))
    if up:
        flow.bytes_up += len(data)
    else:
        flow.bytes_down += len(data)
    flow.last = time.monotonic()
    try:
        writer.write(data)
        await _idle_wait(flow, writer.drain)
    except (ConnectionError, OSError):
        raise Stop("error") from None
    flow.last = time.monotonic()


async def pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    flow: Flow,
    budget: Budget,
    up: bool,
) -> End:
    """Copy until end of stream; then half-close ``writer`` so the peer sees the end too."""
    try:
        while True:
            # Read one byte past the allowance, so that a stream ending exactly at the cap
            # ends as closed, and one going on ends as capped.
            data = await read(reader, flow, min(CHUNK, budget.allowance(up) + 1))
            if not data:
                break
            await send(writer, data, flow=flow, budget=budget, up=up)
    except Stop as stop:
        return stop.end
    except (ConnectionError, OSError):
        return "error"
    try:
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        return "error"
    return "closed"


async def pump_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    chunked: bool,
    length: int,
    flow: Flow,
    budget: Budget,
) -> None:
    """Copy exactly one request body, as framed, and nothing after it.

    Raises:
        HeadError: 400 for bad chunk framing or a body cut short.
        Stop: as :func:`send`.
    """
    if not chunked:
        await _copy_exactly(reader, writer, length, flow=flow, budget=budget)
        return
    while True:
        # The size line is rewritten in its plainest form, extensions dropped, so that the
        # server cannot read a size other than the one the proxy read.
        size_text = (await read_line(reader, flow))[:-2].split(b";", 1)[0]
        if not _CHUNK_SIZE.match(size_text):
            raise HeadError(400, "a chunk size is not plain hexadecimal")
        size = int(size_text, 16)
        await send(writer, b"%x\r\n" % size, flow=flow, budget=budget, up=True)
        if size == 0:
            break
        await _copy_exactly(reader, writer, size, flow=flow, budget=budget)
        if await read_line(reader, flow) != b"\r\n":
            raise HeadError(400, "a chunk is not followed by CRLF")
        await send(writer, b"\r\n", flow=flow, budget=budget, up=True)
    for _ in range(MAX_TRAILER_LINES):  # trailer fields are read and dropped
        if await read_line(reader, flow) == b"\r\n":
            await send(writer, b"\r\n", flow=flow, budget=budget, up=True)
            return
    raise HeadError(400, f"more than {MAX_TRAILER_LINES} trailer lines")


async def _copy_exactly(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    count: int,
    *,
    flow: Flow,
    budget: Budget,
) -> None:
    while count > 0:
        data = await read(reader, flow, min(CHUNK, count))
        if not data:
            raise HeadError(400, "the request body ended early")
        await send(writer, data, flow=flow, budget=budget, up=True)
        count -= len(data)
