"""Any replica answers for what another holds: two real ``sandcell serve`` replicas sharing one
PostgreSQL database, A holding a session, a run or an E2B sandbox, and every request for it
sent to B (which forwards it to A, :mod:`sandcell.service.forwarding`).

An HTTP session opened on A is driven entirely through B; a run on A is followed, streamed and
cancelled through B; an E2B sandbox made through A's ``/e2b`` is used through B's with the
official SDK; listings (``GET /v1/sessions``, E2B's sandbox list) show the tenant's sessions on
both replicas, and leave out a replica that does not answer; a replica that holds something and
does not answer gets a 503 with Retry-After, and once it is known dead what it held is not
found. The last test kills A.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx2
import pytest
from tests.pg_server import PostgresServer
from tests.service.replicas import Cluster, cluster_in, eventually, finished
from tests.service.server import ServiceProcess, sse_events

from sandcell.db.replicas import ReplicaState

_DEAD_AFTER_S = "4"
"""How soon B takes a silent replica for dead (it beats every third of that itself)."""
_FORWARDED = "X-Sandcell-Forwarded"

Pair = tuple[ServiceProcess, ServiceProcess]


@pytest.fixture(scope="module")
def cluster(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with cluster_in(postgres_server, tmp_path_factory) as made:
        yield made


@pytest.fixture(scope="module")
def pair(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("forwarding")
    a, b = cluster.replicas(root / "a", root / "b", SANDCELL_REPLICA_DEAD_AFTER_S=_DEAD_AFTER_S)
    yield a, b
    a_code, b_code = a.stop(), b.stop()
    assert a_code in (-signal.SIGTERM, -signal.SIGKILL)  # the last test kills A
    assert b_code == -signal.SIGTERM


def _session(client: httpx2.Client) -> str:
    created = client.post("/v1/sessions", json={"idle_timeout_s": 300})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _listed(client: httpx2.Client) -> set[str]:
    got = client.get("/v1/sessions")
    assert got.status_code == 200, got.text
    return {s["id"] for s in got.json()}


def test_a_session_opened_on_a_is_driven_through_b(cluster: Cluster, pair: Pair) -> None:
    a, b = pair
    key = cluster.tenant(a.home, "driver", profiles=("analysis",))
    with a.client(key) as ca, b.client(key) as cb:
        sid = _session(ca)
        assert cb.get(f"/v1/sessions/{sid}").json()["id"] == sid
        first = cb.post(f"/v1/sessions/{sid}/cells", json={"code": "x = 41"})
        assert first.status_code == 200 and first.json()["outcome"] == "ok", first.text
        second = cb.post(f"/v1/sessions/{sid}/cells", json={"code": "print(x + 1)"}).json()
        assert second["stdout"] == "42\n" and second["session_id"] == sid
        data = b"a,b\n1,2\n" * 1000
        put = cb.put(f"/v1/sessions/{sid}/files/in.csv", content=data)
        assert put.status_code == 200, put.text
        read = cb.post(
            f"/v1/sessions/{sid}/cells", json={"code": "print(len(open('in.csv').read()))"}
        ).json()
        assert read["stdout"] == f"{len(data)}\n", read
        got = cb.get(f"/v1/sessions/{sid}/files/in.csv")
        assert got.status_code == 200 and got.content == data
        # Marked forwarded, a request is answered where it lands: B does not hold the session.
        assert cb.get(f"/v1/sessions/{sid}", headers={_FORWARDED: "elsewhere"}).status_code == 404
        closed = cb.post(f"/v1/sessions/{sid}/close", json={})
        assert closed.status_code == 200, closed.text
        for c in (ca, cb):
            assert c.post(f"/v1/sessions/{sid}/cells", json={"code": "1"}).status_code == 404


def test_a_run_on_a_is_followed_and_streamed_through_b(cluster: Cluster, pair: Pair) -> None:
    a, b = pair
    key = cluster.tenant(a.home, "follower")
    code = (
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
    )
    with a.client(key) as ca, b.client(key) as cb:
        got = ca.post("/v1/runs", json={"code": code, "wait": False})
        assert got.status_code == 202, got.text
        run_id = got.json()["id"]
        seen = cb.get(f"/v1/runs/{run_id}")
        assert seen.status_code == 200, seen.text
        assert seen.json()["status"] in ("queued", "running", "finished")
        with cb.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            assert stream.status_code == 200
            events: list[tuple[str, dict[str, Any]]] = list(sse_events(stream))
        assert events[-1][0] == "result", events
        result = events[-1][1]["result"]
        assert result["outcome"] == "ok" and result["stdout"] == "line 0\nline 1\nline 2\n"
        body = eventually("the run to be finished", finished(cb, run_id))
        assert body["result"]["stdout"] == result["stdout"]  # type: ignore[index]


def test_a_run_on_a_streams_live_and_is_cancelled_through_b(cluster: Cluster, pair: Pair) -> None:
    a, b = pair
    key = cluster.tenant(a.home, "canceller")
    code = (
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n"
        "time.sleep(60)\n"
    )
    with a.client(key) as ca, b.client(key) as cb, b.client(key) as control:
        got = ca.post("/v1/runs", json={"code": code, "wait": False, "limits": {"wall_time_s": 60}})
        assert got.status_code == 202, got.text
        run_id = got.json()["id"]
        seen: list[tuple[str, dict[str, Any]]] = []
        with cb.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            for kind, data in sse_events(stream):
                seen.append((kind, data))
                if kind == "stdout" and "line 2" in str(data["text"]):
                    # Live: the run sleeps a minute after this line, still running.
                    assert control.get(f"/v1/runs/{run_id}").json()["status"] == "running"
                    assert control.post(f"/v1/runs/{run_id}/cancel").status_code == 202
        assert seen[-1][0] == "result", seen
        result = seen[-1][1]["result"]
        assert result["outcome"] == "killed" and str(result["reason"]).startswith("cancelled")
        out = "".join(str(d["text"]) for k, d in seen if k == "stdout")
        assert out == result["stdout"] == "line 0\nline 1\nline 2\n"
        body = eventually("the run to be finished", finished(cb, run_id))
        assert body["result"]["outcome"] == "killed"  # type: ignore[index]


@contextmanager
def _silent_replica(cluster: Cluster) -> Iterator[tuple[ReplicaState, Callable[[], None]]]:
    """A replica alive in the directory whose address does not answer (a port bound and not
    listening: connections to it are refused), beating until the block ends."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        state = ReplicaState(cluster.url, address=f"http://127.0.0.1:{port}")
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(0.3):
                state.heartbeat()

        state.heartbeat()
        beating = threading.Thread(target=beat, daemon=True)
        beating.start()
        try:
            yield state, state.heartbeat
        finally:
            stop.set()
            beating.join()
            state.leave()
            state.close()


def test_listings_cover_both_replicas_and_leave_out_a_silent_one(
    cluster: Cluster, pair: Pair
) -> None:
    a, b = pair
    key = cluster.tenant(a.home, "lister")
    other = cluster.tenant(a.home, "neighbour")
    with a.client(key) as ca, b.client(key) as cb, b.client(other) as ob:
        on_a, on_b = _session(ca), _session(cb)
        try:
            for c in (ca, cb):
                assert _listed(c) == {on_a, on_b}
            assert _listed(ob) == set()  # the tenant's own, from every replica
            # A forwarded listing is the replica's own part only.
            own = cb.get("/v1/sessions", headers={_FORWARDED: "elsewhere"})
            assert {s["id"] for s in own.json()} == {on_b}
            with _silent_replica(cluster) as (silent, beat):
                silent.place_session("sx-silent", tenant="lister", node="nowhere", profile="strict")
                beat()
                refused = cb.get("/v1/sessions/sx-silent")
                assert refused.status_code == 503, refused.text
                assert int(refused.headers["Retry-After"]) >= 1
                beat()
                assert _listed(cb) == {on_a, on_b}  # the silent replica is left out
        finally:
            for c, sid in ((ca, on_a), (cb, on_b)):
                assert c.post(f"/v1/sessions/{sid}/close", json={}).status_code == 200


def _e2b_ids(url: str, key: str, job: dict[str, str], **kwargs: Any) -> list[str]:
    from e2b import SandboxQuery
    from e2b_code_interpreter import Sandbox  # type: ignore[import-untyped]

    paginator = Sandbox.list(query=SandboxQuery(metadata=job), api_key=key, api_url=url, **kwargs)
    found: list[str] = []
    while paginator.has_next:
        found += [s.sandbox_id for s in paginator.next_items()]
    return found


def test_an_e2b_sandbox_made_through_a_is_used_through_b(cluster: Cluster, pair: Pair) -> None:
    if os.geteuid() != 0:
        pytest.skip("the E2B tests run sandboxes as root; run as root")
    pytest.importorskip("e2b_code_interpreter")
    from e2b_code_interpreter import Sandbox

    a, b = pair
    key = cluster.tenant(a.home, "e2b", profiles=("strict", "unchecked"))
    at_a, at_b = f"{a.url}/e2b", f"{b.url}/e2b"
    job = {"job": "forwarding"}
    on_a = Sandbox.create(metadata=job, api_key=key, api_url=at_a, sandbox_url=at_a)
    on_b = Sandbox.create(metadata=job, api_key=key, api_url=at_b, sandbox_url=at_b)
    try:
        through = Sandbox.connect(on_a.sandbox_id, api_key=key, api_url=at_b, sandbox_url=at_b)
        ran = through.commands.run("echo from-b > /home/user/note.txt && cat /home/user/note.txt")
        assert ran.exit_code == 0 and ran.stdout == "from-b\n"
        through.files.write("/home/user/written.txt", "written through B")
        assert on_a.files.read("/home/user/written.txt") == "written through B"
        assert through.run_code("x = 6 * 7\nx").text == "42"
        assert on_a.run_code("x + 1").text == "43"  # one interpreter, wherever reached
        both = [on_a.sandbox_id, on_b.sandbox_id]  # in start order, oldest first
        for url in (at_a, at_b):
            assert _e2b_ids(url, key, job) == both
            assert _e2b_ids(url, key, job, limit=1) == both  # pages go on across replicas
            assert _e2b_ids(url, key, job, order="desc") == both[::-1]
            v1 = httpx2.get(f"{url}/sandboxes", headers={"X-API-Key": key}, timeout=60)
            assert v1.status_code == 200, v1.text
            assert {s["sandboxID"] for s in v1.json()} == set(both)
        through.kill()
        assert _e2b_ids(at_b, key, job) == [on_b.sandbox_id]
    finally:
        for sbx in (on_a, on_b):
            sbx.kill()


class _RoundRobin(httpx2.AsyncHTTPTransport):
    """A load balancer with no affinity: each request goes to the next replica in turn."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self.ports = ports
        self.sent: list[int] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[len(self.sent) % len(self.ports)]
        self.sent.append(port)
        request.url = request.url.copy_with(port=port)
        return await super().handle_async_request(request)


def test_an_mcp_client_behind_a_balancer_without_affinity(cluster: Cluster, pair: Pair) -> None:
    """The official MCP client's requests alternate between A and B: the connection lives on
    the replica that answered its initialize, and the other forwards to it."""
    import asyncio

    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import TextContent

    a, b = pair
    key = cluster.tenant(a.home, "mcp-balanced", profiles=("strict",))
    balancer = _RoundRobin([a.port, b.port])

    async def scenario() -> list[str]:
        said = []
        async with (
            httpx2.AsyncClient(
                transport=balancer,
                headers={"Authorization": f"Bearer {key}"},
                timeout=httpx2.Timeout(30, read=120),
            ) as http,
            streamable_http_client(f"{a.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for n in range(4):
                ran = await session.call_tool("run_python", {"code": f"print({n} * 7)"})
                assert not ran.is_error, ran.content
                said.append("".join(c.text for c in ran.content if isinstance(c, TextContent)))
        return said

    said = asyncio.run(scenario())
    assert all(str(n * 7) in text for n, text in enumerate(said)), said
    assert set(balancer.sent) == {a.port, b.port}, balancer.sent


def test_a_killed_replica_s_session_is_not_found_once_it_is_known_dead(
    cluster: Cluster, pair: Pair
) -> None:
    """Last: it kills A. Until B takes A for dead, a request for A's session is answered 503
    with Retry-After (A does not answer); then 404, and the listing leaves it out."""
    a, b = pair
    key = cluster.tenant(a.home, "bereaved")
    with a.client(key) as ca, b.client(key) as cb:
        sid = _session(ca)
        assert _listed(cb) == {sid}
        a.stop(signal.SIGKILL)

        def gone() -> bool | None:
            got = cb.get(f"/v1/sessions/{sid}")
            if got.status_code == 503:
                assert int(got.headers["Retry-After"]) >= 1
                return None
            assert got.status_code == 404, got.text
            return True

        eventually("B to take A for dead", gone)
        assert _listed(cb) == set()
        assert cb.post(f"/v1/sessions/{sid}/cells", json={"code": "1"}).status_code == 404
