"""One connection from the program to the proxy: read a request, check it, relay or refuse.

Two kinds of request are served, one per connection:

- ``CONNECT host:port``: a tunnel for TLS. After the ``200``, the first bytes must be a
  ClientHello whose server name is ``host`` (:mod:`sandcell.network.sni`); otherwise the tunnel
  is closed with a TLS ``unrecognized_name`` alert before any byte reaches the server.
- ``GET http://host/path`` (any method, absolute form): forwarded as one request with
  ``Connection: close``; a ``Host`` header naming another host or port than the URL is refused.
  The request body is relayed exactly as framed and nothing after it, so a second request
  cannot ride on the same connection unchecked.

A refusal is an HTTP response whose reason phrase and body both carry the reason, so that the
program sees it whichever part its client shows.

A connection whose first byte is 5 speaks SOCKS5 (:mod:`sandcell.network.socks`) and gets a
tunnel under the same checks as ``CONNECT``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from sandcell.network import socks
from sandcell.network.allowlist import HostError, IPAddress, normalise_host
from sandcell.network.caps import Budget
from sandcell.network.http_head import (
    HeadError,
    RequestHead,
    body_framing,
    close_response_head,
    end_to_end,
    forward_head,
    parse_request_head,
    split_absolute_url,
    split_authority,
    with_header,
)
from sandcell.network.records import ConnectionRecord, Method
from sandcell.network.relay import (
    End,
    Flow,
    Stop,
    abort,
    describe,
    pump,
    pump_body,
    read,
    read_exactly,
    read_head,
    send,
)
from sandcell.network.sni import MAX_HELLO_BYTES, Hello, read_hello
from sandcell.network.targets import Connected, Gate, Refusal, Target

# A fatal TLS alert, unrecognized_name (112): the client reports a name problem, not a reset.
TLS_ALERT_UNRECOGNIZED_NAME = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70])
_LINGER_S = 1.0
_LINGER_BYTES = 256 * 1024
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


@dataclass(slots=True)
class Attempt:
    """What is known so far about one connection; becomes a :class:`ConnectionRecord`."""

    seq: int
    flow: Flow
    started_at: float
    method: Method = "INVALID"
    host: str = ""
    port: int = 0
    address: str | None = None
    allowed: bool = False
    reason: str = "closed before a request was read"
    status: int | None = None
    sni: str | None = None

    def finish(self) -> ConnectionRecord:
        """The frozen record, ended now."""
        return ConnectionRecord(
            seq=self.seq,
            method=self.method,
            host=self.host[:255],
            port=self.port,
            address=self.address,
            allowed=self.allowed,
            reason=self.reason,
            status=self.status,
            sni=self.sni,
            bytes_up=self.flow.bytes_up,
            bytes_down=self.flow.bytes_down,
            started_at=self.started_at,
            ended_at=time.time(),
        )


async def refuse(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    attempt: Attempt,
    status: int,
    reason: str,
) -> None:
    """Answer ``status`` with ``reason`` in the status line and body, and record it.

    Then linger briefly (at most :data:`_LINGER_S` and :data:`_LINGER_BYTES`) reading and
    dropping what the program still sends.
    """
    attempt.allowed, attempt.status, attempt.reason = False, status, reason
    phrase = "".join(c if " " <= c <= "~" else "?" for c in reason)[:300]
    body = f"sandcell egress proxy: {phrase}\n".encode("ascii")
    writer.write(
        f"HTTP/1.1 {status} {phrase or _REASONS.get(status, 'Refused')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode("ascii")
        + body
    )
    try:
        await asyncio.wait_for(writer.drain(), _LINGER_S)
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(_discard(reader), _LINGER_S)
    except (TimeoutError, ConnectionError, OSError):
        return


async def _discard(reader: asyncio.StreamReader) -> None:
    """Read what the program is still sending, so that closing does not reset the connection
    before it has read the refusal (a client still writing its request would see EPIPE)."""
    left = _LINGER_BYTES
    while left > 0 and (data := await reader.read(min(left, 65536))):
        left -= len(data)


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    gate: Gate,
    budget: Budget,
    attempt: Attempt,
) -> None:
    """Serve one connection to its end, filling in ``attempt``."""
    try:
        first = await read_exactly(reader, attempt.flow, 1)
        if first[0] == socks.VERSION:  # no HTTP method starts with this byte
            attempt.method = "SOCKS"
            await _socks(reader, writer, gate=gate, budget=budget, attempt=attempt)
            return
        raw = first + await read_head(reader, attempt.flow)
        head = parse_request_head(raw, max_headers=budget.limits.max_headers)
        attempt.method = "CONNECT" if head.method == "CONNECT" else "HTTP"
        if head.method == "CONNECT":
            await _tunnel(reader, writer, head, gate=gate, budget=budget, attempt=attempt)
        else:
            await _forward(reader, writer, head, gate=gate, budget=budget, attempt=attempt)
    except HeadError as exc:
        await refuse(reader, writer, attempt, exc.status, exc.message)
    except Refusal as exc:
        await refuse(reader, writer, attempt, exc.status, exc.reason)
    except Stop as stop:
        unanswered = attempt.status is None and not attempt.allowed
        if unanswered and stop.end == "idle":
            await refuse(reader, writer, attempt, 408, "the request did not arrive in time")
        elif not (unanswered and stop.end == "closed"):
            attempt.reason = describe(stop.end, budget, up=stop.up)


async def _tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    head: RequestHead,
    *,
    gate: Gate,
    budget: Budget,
    attempt: Attempt,
) -> None:
    authority = split_authority(head.target, default_port=None)
    attempt.host, attempt.port = authority.host, authority.port
    target = gate.check(authority.host, authority.port)
    attempt.host = target.shown
    server = await gate.connect(target)
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await _carry_tunnel(reader, writer, target, server, budget=budget, attempt=attempt)


async def _socks(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    gate: Gate,
    budget: Budget,
    attempt: Attempt,
) -> None:
    try:
        authority = await socks.read_request(reader, writer, attempt.flow)
        attempt.host, attempt.port = authority.host, authority.port
        target = gate.check(authority.host, authority.port)
        attempt.host = target.shown
        server = await gate.connect(target)
    except socks.SocksError as exc:
        attempt.status, attempt.reason = exc.status, exc.message
        if exc.code is not None:
            writer.write(socks.reply(exc.code))
        return
    except Refusal as exc:
        attempt.status, attempt.reason = exc.status, exc.reason
        writer.write(socks.reply(socks.reply_for(exc.status)))
        return
    writer.write(socks.reply(socks.SUCCEEDED))
    await _carry_tunnel(reader, writer, target, server, budget=budget, attempt=attempt)


async def _carry_tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: Target,
    server: Connected,
    *,
    budget: Budget,
    attempt: Attempt,
) -> None:
    """Check the ClientHello of an opened tunnel, then relay both ways."""
    attempt.address = str(server.address)
    try:
        attempt.status = 200
        hello_bytes, hello = await _read_hello(reader, attempt.flow)
        problem = _hello_problem(target, hello)
        attempt.sni = hello.server_name
        if problem is not None:
            attempt.reason = problem
            if hello.problem is None:
                writer.write(TLS_ALERT_UNRECOGNIZED_NAME)
                await asyncio.wait_for(writer.drain(), 5)
            return
        attempt.allowed = True
        await send(server.writer, hello_bytes, flow=attempt.flow, budget=budget, up=True)
        attempt.reason = await _both_ways(reader, writer, server, attempt.flow, budget)
    except Stop as stop:
        attempt.reason = describe(stop.end, budget, up=stop.up)
    except (TimeoutError, ConnectionError, OSError):
        attempt.reason = "the connection failed"
    finally:
        abort(server.writer)


async def _read_hello(reader: asyncio.StreamReader, flow: Flow) -> tuple[bytes, Hello]:
    data = b""
    while True:
        chunk = await read(reader, flow, MAX_HELLO_BYTES - len(data))
        if not chunk:
            return data, Hello(problem="the program closed the tunnel before a ClientHello")
        data += chunk
        hello = read_hello(data)
        if not hello.incomplete:
            return data, hello


def _hello_problem(target: Target, hello: Hello) -> str | None:
    if hello.problem is not None:
        return f"the tunnel did not start with a TLS ClientHello ({hello.problem})"
    if not isinstance(target.host, str):
        if hello.server_name is not None:
            return (
                f"the ClientHello names {hello.server_name} but CONNECT asked for the "
                f"address {target.host}, which has no name"
            )
        return None
    if hello.server_name is None:
        return (
            f"the ClientHello names no server (no SNI), but CONNECT asked for {target.host}; "
            "a tunnel to a host name must say which host it wants"
        )
    if hello.server_name != target.host:
        return f"the ClientHello names {hello.server_name} but CONNECT asked for {target.host}"
    return None


async def _both_ways(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    server: Connected,
    flow: Flow,
    budget: Budget,
) -> str:
    up = asyncio.ensure_future(pump(reader, server.writer, flow=flow, budget=budget, up=True))
    down = asyncio.ensure_future(pump(server.reader, writer, flow=flow, budget=budget, up=False))
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        first = done.pop()
        end: End = first.result()
        if end == "closed" and first is up:
            # The program finished sending; the server may still be answering.
            return describe(await down, budget, up=False)
        return describe(end, budget, up=first is up)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


async def _forward(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    head: RequestHead,
    *,
    gate: Gate,
    budget: Budget,
    attempt: Attempt,
) -> None:
    authority, path = split_absolute_url(head.target)
    attempt.host, attempt.port = authority.host, authority.port
    target = gate.check(authority.host, authority.port)
    attempt.host = target.shown
    # Checked and framed as forwarded: a header the program's Connection header removes
    # must not count here and then be missing upstream.
    head = end_to_end(head)
    hosts = head.values("host")
    if len(hosts) > 1:
        raise HeadError(400, "the request has more than one Host header")
    if hosts:
        named = split_authority(hosts[0], default_port=80)
        try:
            other: str | IPAddress | None = normalise_host(named.host)
        except HostError:
            other = None
        if other != target.host or named.port != target.port:
            raise HeadError(
                400,
                f"the Host header names {hosts[0][:80]!a} but the URL names "
                f"{target.shown} port {target.port}",
            )
    framing = body_framing(head)
    if not hosts:  # HTTP/1.0 may leave it out; the server is told the host the URL named
        name = f"[{target.host}]" if ":" in target.shown else target.shown
        head = with_header(head, "Host", name if target.port == 80 else f"{name}:{target.port}")
    outgoing = forward_head(head, path)
    server = await gate.connect(target)
    attempt.address, attempt.allowed = str(server.address), True
    flow = attempt.flow
    try:
        await send(server.writer, outgoing, flow=flow, budget=budget, up=True)
        body = asyncio.ensure_future(
            pump_body(
                reader,
                server.writer,
                chunked=framing.chunked,
                length=framing.length,
                flow=flow,
                budget=budget,
            )
        )
        answer = asyncio.ensure_future(_relay_response(server, writer, flow, budget))
        try:
            done, _ = await asyncio.wait({body, answer}, return_when=asyncio.FIRST_COMPLETED)
            if body in done:
                body.result()  # a malformed or capped body ends the exchange here
            attempt.reason = await answer
        finally:
            for task in (body, answer):
                task.cancel()
            await asyncio.gather(body, answer, return_exceptions=True)
    except HeadError as exc:
        attempt.allowed = False
        if flow.bytes_down == 0:
            await refuse(reader, writer, attempt, exc.status, exc.message)
        else:
            attempt.reason = exc.message
    finally:
        abort(server.writer)


async def _relay_response(
    server: Connected, writer: asyncio.StreamWriter, flow: Flow, budget: Budget
) -> str:
    raw = await read_head(server.reader, flow, what="response head")
    await send(writer, close_response_head(raw), flow=flow, budget=budget, up=False)
    return describe(
        await pump(server.reader, writer, flow=flow, budget=budget, up=False), budget, up=False
    )
