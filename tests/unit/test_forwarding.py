""":class:`~sandcell.service.forwarding.OwnerForwarding` in front of an app, with the directory
of two replicas on a real PostgreSQL: what a request names (``owned_key``), and the loop guard
(a request marked ``X-Sandcell-Forwarded`` is answered where it lands, never forwarded again,
and a listing so marked is that replica's own part only)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import httpx2
import pytest
from starlette.types import Receive, Scope, Send

from sandcell.db.replicas import ReplicaState
from sandcell.service.forwarding import FORWARDED_HEADER, OwnerForwarding, owned_key


def _scope(path: str, **headers: str) -> Scope:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }


@pytest.mark.parametrize(
    ("path", "headers", "key"),
    [
        ("/v1/sessions/s1/cells", {}, ("session", "s1")),
        ("/v1/sessions/s1", {}, ("session", "s1")),
        ("/v1/runs/r1/events", {}, ("run", "r1")),
        ("/e2b/v2/sandboxes/sbx1/connect", {}, ("session", "sbx1")),
        ("/e2b/sandboxes/sbx1", {}, ("session", "sbx1")),
        ("/e2b/execute", {"e2b_sandbox_id": "sbx2"}, ("session", "sbx2")),
        ("/", {"host": "49999-abcdef0123.e2b.example"}, ("session", "abcdef0123")),
        ("/mcp", {"mcp_session_id": "m1"}, ("mcp", "m1")),
        ("/v1/sessions", {}, None),
        ("/e2b/v2/sandboxes", {}, None),
        ("/v1/runs", {}, None),
        ("/other/mcp", {"mcp_session_id": "m1"}, None),
    ],
)
def test_owned_key_names_what_a_request_is_for(
    path: str, headers: dict[str, str], key: tuple[str, str] | None
) -> None:
    assert owned_key(_scope(path, **headers)) == key


@pytest.fixture
def states(postgres_url: str) -> Iterator[tuple[ReplicaState, ReplicaState]]:
    """This replica and another, alive, whose address refuses connections (a port bound and
    not listening)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        here = ReplicaState(postgres_url, address="http://127.0.0.1:9")
        there = ReplicaState(postgres_url, address=f"http://127.0.0.1:{closed.getsockname()[1]}")
        for state in (here, there):
            state.register()
        yield here, there
        for state in (here, there):
            state.close()


def test_a_forwarded_request_is_answered_where_it_lands(
    states: tuple[ReplicaState, ReplicaState], caplog: pytest.LogCaptureFixture
) -> None:
    here, there = states
    caplog.set_level(logging.WARNING, logger="sandcell.service")
    there.place_session("s1", tenant="t", node="n", profile="strict")
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(str(scope["path"]))
        body = b"[]" if scope["path"] == "/v1/sessions" else b"{}"
        status = 401 if (b"x-refuse", b"1") in scope["headers"] else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    forwarding = OwnerForwarding(app, replica=here, holds=lambda kind, key: False)

    async def ask(path: str, **headers: str) -> httpx2.Response:
        transport = httpx2.ASGITransport(app=forwarding)
        async with httpx2.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.get(path, headers=headers)

    async def scenario() -> None:
        # Unmarked: for the other replica's session, which does not answer: 503, not here.
        refused = await ask("/v1/sessions/s1")
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert reached == [] and forwarding.forwarded == 1
        # Marked: answered here, whoever holds it.
        marked = await ask("/v1/sessions/s1", **{FORWARDED_HEADER: "another"})
        assert marked.status_code == 200 and reached == ["/v1/sessions/s1"]
        assert forwarding.forwarded == 1
        # A listing: unmarked, the other replica is asked (and left out, it does not answer);
        # marked, this replica's own part only. Both answered here.
        for headers in ({}, {FORWARDED_HEADER: "another"}):
            listed = await ask("/v1/sessions", **headers)
            assert listed.status_code == 200 and listed.json() == []
        assert reached[1:] == ["/v1/sessions", "/v1/sessions"]
        asked = [r for r in caplog.records if "listing: replica" in r.getMessage()]
        assert len(asked) == 1 and there.id in asked[0].getMessage()
        # A listing this replica refuses (no key, say) is answered so, and sent on to no one.
        refused = await ask("/v1/sessions", **{"x-refuse": "1"})
        assert refused.status_code == 401
        assert len([r for r in caplog.records if "listing: replica" in r.getMessage()]) == 1

    asyncio.run(scenario())
