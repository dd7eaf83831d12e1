"""``sandcell.mcp.streamable_http_app`` served by uvicorn on a free loopback port, driven by the
official MCP SDK's streamable-HTTP client, with real sandboxes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult

from .client import assert_tool_error, names, structured, text

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent


TENANTS = {"key-acme": ["acme", ["strict"]], "key-beta": ["beta", ["analysis", "strict"]]}


@pytest.fixture
def http_server(mcp_home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    yield from _serve(mcp_home)


@pytest.fixture
def tenant_server(mcp_home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    yield from _serve(mcp_home, json.dumps(TENANTS))


def _serve(home: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The app in its own process (so its sandboxes are its descendants); yields the URL and
    the server's process."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "http_app.py"), str(home), str(listener.fileno()), *extra],
        pass_fds=(listener.fileno(),),
        env=env,
    )
    listener.close()
    try:
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
            except FileNotFoundError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _sandbox_processes(pid: int) -> set[int]:
    """The server's descendants, less the namespaces backend's idle spawners (made ahead of
    the next one-shot run, by design, and kept while the server lives)."""
    found = set()
    for child in _descendants(pid):
        cmdline = _cmdlines({child})
        if cmdline and not cmdline[0].startswith(_SPAWNER):
            found.add(child)
    return found


_SPAWNER = "/bin/bash -c read -r _ "


def _cmdlines(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except FileNotFoundError:
            continue
    return out


def test_runs_and_a_session_that_ends_with_its_connection(
    http_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, server = http_server
    server_pid = server.pid

    async def first_connection() -> tuple[str, set[int]]:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            assert "run_python" in names((await s.list_tools()).tools)
            r = await s.call_tool("run_python", {"code": "print(sum(range(10)))"})
            assert structured(r)["stdout"] == "45\n", text(r)

            before = _sandbox_processes(server_pid)
            opened = await s.call_tool(
                "session_open", {"inputs": [{"name": "n.txt", "text": "20"}]}
            )
            assert not opened.is_error, text(opened)
            assert "when this connection closes" in text(opened)
            session_id = str(structured(opened)["session_id"])

            r = await s.call_tool(
                "session_run",
                {
                    "session_id": session_id,
                    "code": "total = int(open('/inputs/n.txt').read()) + 22",
                },
            )
            assert structured(r)["outcome"] == "ok", text(r)
            r = await s.call_tool("session_run", {"session_id": session_id, "code": "total"})
            assert "value:\n42" in text(r)
            assert structured(r)["outputs"][0]["data"]["text/plain"] == "42"
            assert structured(r)["session_id"] == session_id
            return session_id, _sandbox_processes(server_pid) - before

    session_id, of_session = anyio.run(first_connection)
    assert of_session, "the session's sandbox is not running"

    # The client's exit ended its MCP session (DELETE): the sandbox goes with it.
    deadline = time.monotonic() + 60
    while of_session & _sandbox_processes(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = of_session & _sandbox_processes(server_pid)
    assert not left, f"the session outlived its connection: {_cmdlines(left)}"

    async def refuse(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"decision": "deny", "reason": "over http"})

    asked: list[str] = []

    async def second_connection() -> None:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write, elicitation_callback=refuse) as s,
        ):
            await s.initialize()
            assert_tool_error(
                await s.call_tool("session_run", {"session_id": session_id, "code": "1"}),
                "no open session",
            )
            # Elicitation rides the call's own response stream.
            denied = await s.call_tool("run_python", {"code": "import subprocess"})
            assert_tool_error(denied, "over http")
            assert structured(denied)["outcome"] == "denied"

    anyio.run(second_connection)
    assert len(asked) == 1 and "import subprocess" in asked[0]


def test_foreign_host_header_is_refused(http_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """DNS rebinding: a page on another origin cannot drive the local server."""
    url, _ = http_server
    response = httpx2.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={
            "Host": "evil.example:80",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        },
    )
    assert response.status_code in (400, 403, 421), response.text


@contextlib.asynccontextmanager
async def _as_tenant(url: str, key: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as s,
    ):
        await s.initialize()
        yield s


def test_tenants_see_only_their_own_sessions_runs_and_profiles(
    tenant_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = tenant_server
    for headers in ({}, {"Authorization": "Bearer not-a-key"}):
        response = httpx2.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream", **headers},
        )
        assert response.status_code == 401, response.text

    async def scenario() -> None:
        async with _as_tenant(url, "key-acme") as acme, _as_tenant(url, "key-beta") as beta:
            ran = await acme.call_tool(
                "run_python",
                {"code": "open('a.txt', 'w').write('acme only')", "exports": ["*.txt"]},
            )
            run_id = structured(ran)["run_id"]
            (artifact,) = structured(ran)["artifacts"]
            opened = await acme.call_tool("session_open", {})
            session_id = structured(opened)["session_id"]

            # Another tenant gets the answers of ids that never existed.
            assert_tool_error(
                await beta.call_tool("session_run", {"session_id": session_id, "code": "1"}),
                "no open session",
            )
            assert_tool_error(
                await beta.call_tool("session_close", {"session_id": session_id}),
                "no open session",
            )
            assert_tool_error(
                await beta.call_tool("get_artifact", {"run_id": run_id, "path": "x"}),
                f"no run {run_id!r} here",
            )
            assert_tool_error(
                await beta.call_tool("get_artifact", {"run_id": run_id[:8], "path": "a.txt"}),
                "no run",
            )
            assert_tool_error(
                await beta.call_tool("get_artifact", {"sha256": artifact["sha256"]}),
                "no artifact with sha256",
            )
            assert_tool_error(
                await acme.call_tool("get_artifact", {"run_id": run_id, "path": "x"}),
                "has no artifact 'x'",
            )
            mine = await acme.call_tool("get_artifact", {"sha256": artifact["sha256"]})
            assert "acme only" in text(mine)

            # The service's quota hook refuses beta's runs, in its own words.
            assert_tool_error(
                await beta.call_tool("run_python", {"code": "print(1)"}),
                "refused: over quota: 0 runs left this minute; retry after 7 s",
            )

            # Each tenant's own profiles, its default first.
            offered = structured(await beta.call_tool("list_profiles", {}))
            assert offered["default"] == "analysis"
            assert {p["name"] for p in offered["profiles"]} == {"analysis", "strict"}
            assert_tool_error(
                await acme.call_tool("run_python", {"code": "1", "profile": "analysis"}),
                "not offered",
            )
            closed = await acme.call_tool("session_close", {"session_id": session_id})
            assert not closed.is_error, text(closed)

    anyio.run(scenario)


def test_the_2026_protocol_over_http_and_sessions_closed_at_shutdown(
    http_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """On 2026-07-28 every request stands alone: the approval question rides an
    InputRequiredResult, a session outlives the client's requests, and the server's shutdown
    ends it (the app's lifespan closes it; sessions' own exit handler would too)."""
    url, server = http_server
    asked: list[str] = []

    async def refuse(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"decision": "deny", "reason": "2026 no"})

    async def scenario() -> set[int]:
        async with Client(url, elicitation_callback=refuse) as c:
            assert c.session.protocol_version == "2026-07-28"
            denied = await c.call_tool("run_python", {"code": "import subprocess"})
            assert_tool_error(denied, "2026 no")
            before = _sandbox_processes(server.pid)
            opened = await c.call_tool("session_open", {})
            session_id = structured(opened)["session_id"]
            await c.call_tool("session_run", {"session_id": session_id, "code": "n = 20"})
            r = await c.call_tool("session_run", {"session_id": session_id, "code": "n + 22"})
            assert "value:\n42" in text(r)
            return _sandbox_processes(server.pid) - before

    of_session = anyio.run(scenario)
    assert len(asked) == 1
    assert of_session, "the session's sandbox is not running"
    assert of_session <= _sandbox_processes(server.pid), "no connection to end, yet it ended"
    server.terminate()
    server.wait(timeout=60)
    left = {p for p in of_session if _alive(p)}
    assert not left, f"the session outlived the server: {_cmdlines(left)}"


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
