"""``/mcp`` on the real service: the official MCP SDK's streamable-HTTP client, tenants' keys,
their profiles, quotas and scoping, with real sandboxes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import pytest
from tests.service.server import ServiceProcess, add_approver, add_tenant

pytest.importorskip("mcp.client.streamable_http", reason="the MCP SDK is not installed")

from mcp import ClientSession
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

pytestmark = pytest.mark.timeout(300)


@contextlib.asynccontextmanager
async def _mcp(url: str, key: str) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300)
        ) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _text(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


def _data(result: CallToolResult) -> dict[str, object]:
    assert not result.is_error and result.structured_content is not None, _text(result)
    return dict(result.structured_content)


def _refused(result: CallToolResult, needle: str) -> None:
    assert result.is_error, _text(result)
    assert needle in _text(result), _text(result)
    assert "Traceback" not in _text(result)


def test_mcp_needs_a_tenant_key(service: ServiceProcess, home: Path) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer sc_not-a-key"}):
        r = httpx2.post(f"{service.url}/mcp", json=ping, headers={**accept, **auth})
        assert r.status_code == 401, r.text
    # The service's own routes are unchanged by the mount at the root.
    assert httpx2.get(f"{service.url}/healthz").json()["status"] == "ok"
    missing = httpx2.get(f"{service.url}/no-such-page")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")


def test_runs_sessions_and_scoping_over_mcp(service: ServiceProcess, home: Path) -> None:
    acme_key = add_tenant(home, "mcp-acme", profiles=("strict", "analysis"))
    beta_key = add_tenant(home, "mcp-beta", profiles=("analysis",))

    async def scenario() -> tuple[str, str]:
        async with _mcp(service.url, acme_key) as acme, _mcp(service.url, beta_key) as beta:
            offered = _data(await acme.call_tool("list_profiles", {}))
            assert offered["default"] == "strict"
            ran = _data(
                await acme.call_tool(
                    "run_python",
                    {"code": "open('a.txt', 'w').write('acme only')", "exports": ["*.txt"]},
                )
            )
            assert ran["outcome"] == "ok", ran
            run_id = str(ran["run_id"])
            artifacts = ran["artifacts"]
            assert isinstance(artifacts, list) and len(artifacts) == 1
            sha = str(artifacts[0]["sha256"])

            opened = _data(await acme.call_tool("session_open", {}))
            session_id = str(opened["session_id"])
            cell = {"session_id": session_id, "code": "x = 6 * 7"}
            assert _data(await acme.call_tool("session_run", cell))["outcome"] == "ok"
            shown = await acme.call_tool("session_run", {"session_id": session_id, "code": "x"})
            assert "42" in _text(shown)

            # Another tenant's key reaches none of it.
            _refused(
                await beta.call_tool("session_run", {"session_id": session_id, "code": "1"}),
                "no open session",
            )
            _refused(await beta.call_tool("get_artifact", {"sha256": sha}), "no artifact")
            _refused(
                await beta.call_tool("get_artifact", {"run_id": run_id, "path": "a.txt"}),
                "no run",
            )
            _refused(
                await beta.call_tool("run_python", {"code": "1", "profile": "strict"}),
                "not offered",
            )
            assert "acme only" in _text(await acme.call_tool("get_artifact", {"sha256": sha}))
            assert _data(await acme.call_tool("session_close", {"session_id": session_id}))
            return run_id, sha

    run_id, sha = anyio.run(scenario)

    # What the MCP calls made is the tenant's in the service's table: its record and its
    # artifact over /v1 with its key, 404 with the other's; the MCP session is not /v1's.
    with service.client(acme_key) as acme, service.client(beta_key) as beta:
        assert acme.get(f"/v1/audit/{run_id}").json()["record"]["run_id"] == run_id
        assert acme.get(f"/v1/artifacts/{sha}").content == b"acme only"
        assert beta.get(f"/v1/audit/{run_id}").status_code == 404
        assert beta.get(f"/v1/artifacts/{sha}").status_code == 404
        assert acme.get("/v1/sessions").json() == []
        assert acme.get("/v1/tenant").json()["cpu_seconds_today"] > 0


def test_an_mcp_session_holds_a_sandbox_slot(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "mcp-one", max_concurrent=1)

    async def scenario() -> None:
        async with _mcp(service.url, key) as s:
            session_id = str(_data(await s.call_tool("session_open", {}))["session_id"])
            # Its one slot is the session's: a run over MCP and one over /v1 are refused.
            _refused(
                await s.call_tool("run_python", {"code": "print(1)"}),
                "refused: tenant 'mcp-one' holds 1 sandboxes",
            )
            with service.client(key) as c:
                over = c.post("/v1/runs", json={"code": "print(1)"})
                assert over.status_code == 429, over.text
                assert over.headers["Retry-After"] == "1"
            cell = {"session_id": session_id, "code": "print('cell')"}
            assert _data(await s.call_tool("session_run", cell))["stdout"] == "cell\n"
            await s.call_tool("session_close", {"session_id": session_id})
            # Closed: the slot is free again.
            assert _data(await s.call_tool("run_python", {"code": "print(2)"}))["stdout"] == "2\n"

    anyio.run(scenario)
    with service.client(key) as c:
        assert c.post("/v1/runs", json={"code": "print(3)"}).json()["result"]["stdout"] == "3\n"


def test_an_mcp_client_does_not_approve_its_own_run(service: ServiceProcess, home: Path) -> None:
    """The client holds the tenant's key that submitted the run: asked or not, its answer does
    not approve it (the profile leaves submitter_may_approve off). The tenant's approver key
    does, over /v1; at /mcp that key runs nothing."""
    key = add_tenant(home, "mcp-selfie", profiles=("supervised",))
    approver = add_approver(home, "mcp-selfie")
    asked: list[str] = []

    async def yes(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"decision": "approve", "reason": "me"})

    async def scenario() -> dict[str, object]:
        async with (
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300)
            ) as http,
            streamable_http_client(f"{service.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write, elicitation_callback=yes) as session,
        ):
            await session.initialize()
            held = await session.call_tool("run_python", {"code": "print('self-approved')"})
            return _data(held) | {"text": _text(held)}

    held = anyio.run(scenario)
    assert asked == []
    assert held["outcome"] == "awaiting_approval", held
    assert "approver key" in str(held["text"])
    approval = str(held["approval_id"]) if "approval_id" in held else None
    with service.client(key) as c, service.client(approver) as a:
        [pending] = c.get("/v1/approvals").json()
        assert approval in (None, pending["id"])
        assert c.post(f"/v1/approvals/{pending['id']}/approve", json={}).status_code == 403
        ran = a.post(f"/v1/approvals/{pending['id']}/approve", json={"reason": "read it"})
        assert ran.status_code == 200, ran.text
        assert ran.json()["result"]["stdout"] == "self-approved\n"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    refused = httpx2.post(
        f"{service.url}/mcp", json=ping, headers={**accept, "Authorization": f"Bearer {approver}"}
    )
    assert refused.status_code == 403 and "runs nothing" in refused.text
