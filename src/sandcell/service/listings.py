"""A tenant's listings cover every live replica: ``GET /v1/sessions`` and E2B's sandbox list.

A live session (an E2B sandbox) is held by the replica that opened it, which alone lists it.
Behind a load balancer the listing may reach any replica, so the replica it reaches asks every
other live replica (:meth:`~sandcell.db.replicas.ReplicaState.live_peers`) for its own part,
with the client's headers (each authenticates the client itself) and ``X-Sandcell-Forwarded``
(so that it answers its own part only), and answers the union. A replica that does not answer
in time, or answers anything but a listing, is left out (and logged): a listing is never
refused because one replica is down, whose sessions are then as good as gone anyway.

E2B's pages merge exactly: a page's token is a position in the order of all sandboxes (a start
time and an id, :func:`sandcell.e2b.listing.merge_pages`), so every replica's page starts
there and the merged page is the first ``limit`` of their union.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.errors import SandcellError
from sandcell.service.forwarding import request_target

if TYPE_CHECKING:
    from sandcell.db.replicas import Owner, ReplicaState

__all__ = ["PEER_TIMEOUT_S", "is_listing", "merged_listing"]

log = logging.getLogger("sandcell.service")

PEER_TIMEOUT_S = 5.0
"""How long a listing waits for another replica's part before leaving it out."""
_SESSIONS = "/v1/sessions"
_E2B = frozenset({"/e2b/sandboxes", "/e2b/v2/sandboxes"})


def is_listing(scope: Scope) -> bool:
    """Whether the request asks for a listing that covers every replica."""
    path = str(scope.get("path", "")).rstrip("/")
    return scope.get("method") == "GET" and (path == _SESSIONS or path in _E2B)


@dataclass(frozen=True, slots=True)
class _Part:
    """One replica's answer to the listing: its items and its next page's token."""

    items: list[Mapping[str, Any]]
    next_token: str | None


async def merged_listing(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    replica: ReplicaState,
    headers: Sequence[tuple[str, str]],
) -> None:
    """Answer the listing with this replica's part and every other live replica's.
    ``headers``: the client's, as passed on to another replica."""
    # What the peers are asked is taken first: the app changes its scope (a mount sets
    # root_path) while it answers.
    target = request_target(scope)
    params = _params(scope)
    sessions = str(scope["path"]).rstrip("/") == _SESSIONS
    # This replica answers first: a request it refuses (no key, a bad query) is answered as
    # it refused it, and never sent on to every other replica.
    start, body = await _answer_here(app, dict(scope), receive)
    own = _part(start, body)
    if own is None:
        await _send(send, start, body)
        return
    try:
        peers = await asyncio.to_thread(replica.live_peers)
    except SandcellError as exc:
        log.warning("listing: the other replicas are unknown (%s); this one's part only", exc)
        peers = []
    parts = await asyncio.gather(*(_ask(peer, target, headers) for peer in peers))
    found = [own, *(p for p in parts if p is not None)]
    if sessions:
        merged = _merge_sessions(found)
        token = None
    else:
        from sandcell.e2b.listing import merge_pages

        merged, token = merge_pages(params, [(p.items, p.next_token) for p in found])
    payload = json.dumps(merged, separators=(",", ":")).encode()
    kept = [
        (k, v)
        for k, v in start.get("headers", [])
        if k.lower() not in (b"content-length", b"x-next-token")
    ]
    kept.append((b"content-length", str(len(payload)).encode()))
    if token is not None:
        kept.append((b"x-next-token", token.encode("latin-1")))
    await _send(send, {**start, "headers": kept}, payload)


def _merge_sessions(parts: Sequence[_Part]) -> list[Mapping[str, Any]]:
    seen: dict[str, Mapping[str, Any]] = {}
    for part in parts:
        for item in part.items:
            seen.setdefault(str(item["id"]), item)
    return sorted(seen.values(), key=lambda s: (str(s.get("created_at", "")), str(s["id"])))


def _params(scope: Scope) -> dict[str, str]:
    from urllib.parse import parse_qsl

    query = scope.get("query_string", b"").decode("latin-1")
    return dict(parse_qsl(query, keep_blank_values=True))


async def _answer_here(app: ASGIApp, scope: Scope, receive: Receive) -> tuple[Message, bytes]:
    """This replica's own answer, whole (a listing is small)."""
    start: Message = {}
    chunks: list[bytes] = []

    async def keep(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, keep)
    return start, b"".join(chunks)


def _part(start: Message, body: bytes) -> _Part | None:
    """The listing in an answer, or None where the answer is not one."""
    headers = {k.lower(): v for k, v in start.get("headers", [])}
    if start.get("status") != 200 or b"content-encoding" in headers:
        return None
    items = _items(body)
    if items is None:
        return None
    token = headers.get(b"x-next-token")
    return _Part(items, None if token is None else token.decode("latin-1"))


def _items(body: bytes) -> list[Mapping[str, Any]] | None:
    try:
        loaded = json.loads(body)
    except ValueError:
        return None
    if not isinstance(loaded, list) or not all(isinstance(i, dict) for i in loaded):
        return None
    return loaded


async def _ask(peer: Owner, target: str, headers: Sequence[tuple[str, str]]) -> _Part | None:
    """Another replica's own part of the listing, or None (logged) where it gives none."""
    import httpx2

    url = peer.address.rstrip("/") + target
    try:
        async with httpx2.AsyncClient(timeout=PEER_TIMEOUT_S) as client:
            response = await client.get(url, headers=list(headers))
    except httpx2.HTTPError as exc:
        log.warning("listing: replica %s did not answer, left out: %r", peer.replica, exc)
        return None
    items = _items(response.content) if response.status_code == 200 else None
    if items is None:
        log.warning(
            "listing: replica %s answered %s, not a listing: left out",
            peer.replica,
            response.status_code,
        )
        return None
    return _Part(items, response.headers.get("x-next-token"))


async def _send(send: Send, start: Message, body: bytes) -> None:
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
