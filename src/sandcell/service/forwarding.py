"""Any replica answers for what another replica holds: requests forwarded to the owner.

A live session (an HTTP session, an E2B sandbox) and a run in flight are held in the memory of
the replica that started them, with their sandbox on that replica's node. Behind a load
balancer the next request for them may reach any replica: :class:`OwnerForwarding` finds the
thing's id in the request, and when this replica does not hold it but a live replica does
(the directory in PostgreSQL, :meth:`~sandcell.db.replicas.ReplicaState.owner`), it passes the
request there and streams the answer back unchanged (Server-Sent Events and Connect streams
included). The owner authenticates the request itself, with the client's own key: forwarding
grants nothing. A request is forwarded at most once (``X-Sandcell-Forwarded``), so two replicas
that disagree about an owner cannot pass it back and forth.

What is forwarded: ``/v1/sessions/{id}...``, ``/v1/runs/{id}...`` (while the run is in
flight; a finished run is answered from its record by any replica), E2B traffic naming a
sandbox (``/e2b/sandboxes/{id}``, ``/e2b/v2/sandboxes/{id}``, the ``E2b-Sandbox-Id`` header,
a ``PORT-ID.domain`` host), and MCP requests carrying an ``Mcp-Session-Id`` (the replica that
answered the connection's ``initialize`` holds it: the id it answers with is noted then, and
forgotten when the client ends the connection). An id no live replica holds is answered here,
as on one machine: a session whose replica died is not found. A replica that holds it and does
not answer (dead, not yet known dead) gets a 503 with ``Retry-After``.

Listings of live sessions (``GET /v1/sessions``, E2B's sandbox list) are answered with every
live replica's part (:mod:`sandcell.service.listings`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.errors import SandcellError
from sandcell.service.port_proxy import HOP_BY_HOP

if TYPE_CHECKING:
    from sandcell.db.replicas import Owner, ReplicaState

__all__ = ["FORWARDED_HEADER", "OwnerForwarding", "owned_key", "passed_headers", "request_target"]

log = logging.getLogger("sandcell.service")

FORWARDED_HEADER = "x-sandcell-forwarded"
MCP_SESSION_HEADER = "mcp-session-id"
MCP_PATH = "/mcp"
_HOP = HOP_BY_HOP | {"content-length"}
"""Not passed on: hop-by-hop headers, and the length (the body is streamed again)."""
_SESSION = re.compile(r"^/v1/sessions/([A-Za-z0-9_.-]+)(?:/|$)")
_RUN = re.compile(r"^/v1/runs/([A-Za-z0-9_.-]+)(?:/|$)")
_E2B_PATH = re.compile(r"^/e2b(?:/v2)?/sandboxes/([A-Za-z0-9_.-]+)(?:/|$)")
_E2B_HOST = re.compile(r"^\d{1,5}-([0-9a-z]{8,64})\.", re.ASCII)


def owned_key(scope: Scope) -> tuple[str, str] | None:
    """``(kind, id)`` of what the request is for, when it names something a replica holds."""
    path = str(scope.get("path", ""))
    found = _SESSION.match(path)
    if found is not None:
        return "session", found.group(1)
    found = _RUN.match(path)
    if found is not None:
        return "run", found.group(1)
    found = _E2B_PATH.match(path)
    if found is not None:
        return "session", found.group(1)
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    mcp = headers.get(MCP_SESSION_HEADER)
    if mcp and path == MCP_PATH:
        return "mcp", mcp
    sandbox = headers.get("e2b-sandbox-id")
    if sandbox:
        return "session", sandbox
    host = _E2B_HOST.match(headers.get("host", "").lower())
    if host is not None:
        return "session", host.group(1)
    return None


class OwnerForwarding:
    """ASGI middleware (see the module)."""

    def __init__(
        self, app: ASGIApp, *, replica: ReplicaState, holds: Callable[[str, str], bool]
    ) -> None:
        """``holds(kind, id)``: whether this replica holds it (answered without the
        database, so that requests for what is here cost nothing more)."""
        self.app = app
        self.replica = replica
        self.holds = holds
        self.forwarded = 0
        self._mcp: set[str] = set()
        """The MCP connections this replica holds (their Mcp-Session-Id)."""

    def _held(self, kind: str, key: str) -> bool:
        return key in self._mcp if kind == "mcp" else self.holds(kind, key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = owned_key(scope)
        # An MCP request without a connection id (an initialize) or with one held here.
        if scope.get("path") == MCP_PATH and (
            key is None or (key[0] == "mcp" and key[1] in self._mcp)
        ):
            await self.app(scope, receive, self._noting_mcp(scope, send))
            return
        if key is None and not _was_forwarded(scope):
            from sandcell.service.listings import is_listing, merged_listing

            if is_listing(scope):
                headers = passed_headers(scope, self.replica.id)
                await merged_listing(
                    self.app, scope, receive, send, replica=self.replica, headers=headers
                )
                return
        if key is None or self._held(*key) or _was_forwarded(scope):
            await self.app(scope, receive, send)
            return
        try:
            owner = await asyncio.to_thread(self.replica.owner, *key)
        except SandcellError:
            owner = None  # the directory is unreachable: answered here (the 503 follows)
        if owner is None:
            await self.app(scope, receive, send)
            return
        self.forwarded += 1
        await self._forward(scope, receive, send, owner)

    def _noting_mcp(self, scope: Scope, send: Send) -> Send:
        """``send`` that notes the Mcp-Session-Id this replica answers an initialize with (so
        the others forward that connection here), and forgets one the client ended."""
        ended = scope.get("method") == "DELETE"
        asked = dict(scope["headers"]).get(MCP_SESSION_HEADER.encode())

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message.get("status", 0))
                given = dict(message.get("headers", [])).get(MCP_SESSION_HEADER.encode())
                if given is not None and not ended and status < 400:
                    mcp_id = given.decode("latin-1")
                    if mcp_id not in self._mcp:
                        self._mcp.add(mcp_id)
                        await self._directory(self.replica.place_mcp, mcp_id)
                elif ended and asked is not None and status < 400:
                    mcp_id = asked.decode("latin-1")
                    self._mcp.discard(mcp_id)
                    await self._directory(self.replica.mcp_ended, mcp_id)
            await send(message)

        return noting

    @staticmethod
    async def _directory(call: Callable[[str], None], mcp_id: str) -> None:
        try:
            await asyncio.to_thread(call, mcp_id)
        except SandcellError as exc:
            # Unreachable just now: the connection still works on this replica.
            log.warning("MCP connection %s: the directory was not updated: %s", mcp_id, exc)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, owner: Owner) -> None:
        import httpx2

        url = owner.address.rstrip("/") + request_target(scope)
        headers = passed_headers(scope, self.replica.id)

        async def body() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return

        async with httpx2.AsyncClient(timeout=None) as client:
            request = client.build_request(
                str(scope["method"]), url, headers=headers, content=body()
            )
            try:
                response = await client.send(request, stream=True)
            except httpx2.HTTPError as exc:
                log.warning("forwarding to replica %s failed: %s", owner.replica, exc)
                await _unavailable(send)
                return
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [
                            (k.encode("latin-1"), v.encode("latin-1"))
                            for k, v in response.headers.multi_items()
                            if k.lower() not in _HOP
                        ],
                    }
                )
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                await response.aclose()


def request_target(scope: Scope) -> str:
    """The request's path and query, as they follow another replica's address."""
    query = scope.get("query_string", b"").decode("latin-1")
    target = str(scope.get("root_path", "")) + str(scope["path"])
    return f"{target}?{query}" if query else target


def passed_headers(scope: Scope, replica_id: str) -> list[tuple[str, str]]:
    """The request's headers as passed on to another replica: all but the hop-by-hop ones,
    marked forwarded by ``replica_id``. The Host header travels unchanged: E2B's port hosts
    name the sandbox in it."""
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in scope["headers"]
        if k.decode("latin-1").lower() not in _HOP
    ]
    headers.append((FORWARDED_HEADER, replica_id))
    return headers


def _was_forwarded(scope: Scope) -> bool:
    return any(k.lower() == FORWARDED_HEADER.encode() for k, _ in scope["headers"])


async def _unavailable(send: Send) -> None:
    body = (
        b'{"type":"about:blank","title":"Service Unavailable","status":503,'
        b'"detail":"the replica holding it did not answer; retry shortly"}'
    )
    start: Message = {
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/problem+json"),
            (b"retry-after", b"2"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
