"""``session_pause`` / ``session_resume`` / ``session_fork`` through the official MCP SDK's
clients against a real ``sandcell mcp`` and a real streamable-HTTP server with tenants, real
sandboxes (the namespaces rung: its sessions pause in ``files`` mode on this host)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from .client import assert_tool_error, stdio_session, structured, text
from .test_http import _as_tenant, tenant_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)


def test_a_paused_session_comes_back_in_another_server_and_forks(mcp_home: Path) -> None:
    async def first() -> str:
        async with stdio_session(mcp_home) as s:
            opened = await s.call_tool("session_open", {})
            sid = str(structured(opened)["session_id"])
            r = await s.call_tool(
                "session_run", {"session_id": sid, "code": "open('kept.txt','w').write('kept')"}
            )
            assert structured(r)["outcome"] == "ok", text(r)
            assert_tool_error(
                await s.call_tool("session_pause", {"session_id": sid, "mode": "memory"}),
                "pause_refused",
            )
            paused = await s.call_tool("session_pause", {"session_id": sid})
            assert not paused.is_error, text(paused)
            assert structured(paused)["kind"] == "paused"
            assert structured(paused)["mode"] == "files"  # the best the rung offers here
            assert_tool_error(
                await s.call_tool("session_run", {"session_id": sid, "code": "1"}),
                "no open session",
            )
            return sid

    sid = anyio.run(first)

    async def second() -> None:
        # Another server process on the same home: the paused state is on disk.
        async with stdio_session(mcp_home) as s:
            back = await s.call_tool("session_resume", {"session_id": sid})
            assert not back.is_error, text(back)
            r = await s.call_tool(
                "session_run", {"session_id": sid, "code": "print(open('kept.txt').read())"}
            )
            assert structured(r)["stdout"] == "kept\n", text(r)
            assert_tool_error(
                await s.call_tool("session_resume", {"session_id": sid}), "state_not_found"
            )
            forked = await s.call_tool("session_fork", {"session_id": sid, "n": 2})
            assert not forked.is_error, text(forked)
            copies = structured(forked)["forks"]
            assert len(set(copies)) == 2 and sid not in copies
            for copy in copies:
                r = await s.call_tool(
                    "session_run",
                    {"session_id": copy, "code": "print(open('kept.txt').read())"},
                )
                assert structured(r)["stdout"] == "kept\n", text(r)
            too_many = await s.call_tool("session_fork", {"session_id": sid, "n": 4})
            assert_tool_error(too_many, "may hold 4")

    anyio.run(second)


def test_another_tenant_cannot_resume_or_fork_a_paused_session(
    tenant_server: tuple[str, subprocess.Popen[bytes]],  # noqa: F811 - the fixture
) -> None:
    url, _ = tenant_server

    async def scenario() -> None:
        async with _as_tenant(url, "key-acme") as acme:
            sid = structured(await acme.call_tool("session_open", {}))["session_id"]
            await acme.call_tool(
                "session_run", {"session_id": sid, "code": "open('a.txt','w').write('acme')"}
            )
            paused = await acme.call_tool("session_pause", {"session_id": sid})
            assert not paused.is_error, text(paused)
        async with _as_tenant(url, "key-beta") as beta:
            for tool in ("session_resume", "session_fork"):
                assert_tool_error(
                    await beta.call_tool(tool, {"session_id": sid}), "state_not_found"
                )
        async with _as_tenant(url, "key-acme") as acme:  # a later connection of the tenant
            back = await acme.call_tool("session_resume", {"session_id": sid})
            assert not back.is_error, text(back)
            r = await acme.call_tool(
                "session_run", {"session_id": sid, "code": "print(open('a.txt').read())"}
            )
            assert structured(r)["stdout"] == "acme\n", text(r)

    anyio.run(scenario)
