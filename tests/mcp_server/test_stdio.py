"""``sandcell mcp`` over stdio, driven by the official MCP SDK client, with real sandboxes."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.types import BlobResourceContents, ElicitRequestParams, ElicitResult, EmbeddedResource
from tests.conftest import runtime_required

from sandcell.audit import AuditLog
from sandcell.policy.approvals import ApprovalStore

from .client import (
    assert_tool_error,
    images,
    names,
    server_params,
    stdio_session,
    structured,
    text,
)

pytestmark = pytest.mark.timeout(300)

TOOLS = {
    "run_python",
    "run_bash",
    "run_javascript",
    "run_typescript",
    "session_open",
    "session_run",
    "session_close",
    "session_pause",
    "session_resume",
    "session_fork",
    "list_profiles",
    "get_artifact",
}
PNG = b"\x89PNG\r\n\x1a\n"
FIGURE_AND_TABLE = """
import matplotlib.pyplot as plt
import pandas as pd
plt.plot([1, 4, 9])
pd.DataFrame({"city": ["Oslo", "Lima"], "visits": [3, 5]})
"""


def test_tools_runs_figures_tables_inputs_and_artifacts(mcp_home: Path) -> None:
    async def scenario() -> None:
        async with stdio_session(mcp_home, "--allow-profile", "analysis") as s:
            listed = await s.list_tools()
            assert names(listed.tools) == TOOLS

            r = await s.call_tool("run_python", {"code": "print(6 * 7)"})
            assert not r.is_error, text(r)
            assert structured(r)["outcome"] == "ok"
            assert structured(r)["stdout"] == "42\n"
            assert "42" in text(r)

            r = await s.call_tool(
                "run_bash",
                {
                    "code": "cat /inputs/data.csv; mkdir out; cp data.csv out/copy.csv; "
                    "printf '\\000\\001\\377' > out/raw.bin; exit 3",
                    "inputs": [{"name": "data.csv", "text": "a,b\n1,2\n"}],
                    "exports": ["out/**"],
                },
            )
            # A program that fails is a result, not a failed tool call.
            assert not r.is_error, text(r)
            assert structured(r)["outcome"] == "error"
            assert structured(r)["exit_code"] == 3
            assert structured(r)["stdout"] == "a,b\n1,2\n"
            exported = {a["path"]: a for a in structured(r)["artifacts"]}
            assert set(exported) == {"out/copy.csv", "out/raw.bin"}, text(r)
            bash_run = structured(r)["run_id"]

            got = await s.call_tool("get_artifact", {"run_id": bash_run, "path": "out/copy.csv"})
            assert not got.is_error, text(got)
            assert "a,b\n1,2\n" in text(got)
            got = await s.call_tool("get_artifact", {"sha256": exported["out/raw.bin"]["sha256"]})
            (blob,) = [b for b in got.content if isinstance(b, EmbeddedResource)]
            assert isinstance(blob.resource, BlobResourceContents)
            assert base64.b64decode(blob.resource.blob) == b"\x00\x01\xff"

            r = await s.call_tool("run_python", {"code": FIGURE_AND_TABLE, "profile": "analysis"})
            assert structured(r)["outcome"] == "ok", text(r)
            assert structured(r)["policy"]["profile"]["name"] == "analysis"
            (image,) = images(r)
            assert image.mime_type == "image/png"
            png = base64.b64decode(image.data)
            assert png.startswith(PNG)
            (table,) = structured(r)["tables"]
            assert [(row["city"], row["visits"]) for row in table["data"]] == [
                ("Oslo", 3),
                ("Lima", 5),
            ]
            run_id = structured(r)["run_id"]
            figure = next(o for o in structured(r)["outputs"] if o["kind"] == "figure")
            by_media = {a["media_type"]: a for a in figure["artifacts"]}

            got = await s.call_tool("get_artifact", {"sha256": by_media["image/png"]["sha256"]})
            assert not got.is_error, text(got)
            assert base64.b64decode(images(got)[0].data) == png

            svg = by_media["image/svg+xml"]
            got = await s.call_tool("get_artifact", {"run_id": run_id, "path": svg["path"]})
            assert not got.is_error, text(got)
            assert "<svg" in text(got)
            assert structured(got)["sha256"] == svg["sha256"]

            profiles = await s.call_tool("list_profiles", {})
            # Only what the server offers: the model does not get to pick a laxer profile.
            listed_names = {p["name"] for p in structured(profiles)["profiles"]}
            assert listed_names == {"strict", "analysis"}
            assert structured(profiles)["default"] == "strict"

    anyio.run(scenario)


def test_bad_arguments_are_tool_errors_that_say_how_to_fix_them(mcp_home: Path) -> None:
    async def scenario() -> None:
        async with stdio_session(mcp_home) as s:
            assert_tool_error(
                await s.call_tool("run_python", {}),
                "run_python: bad arguments: arguments: 'code' is a required property",
                "input schema",
            )
            assert_tool_error(
                await s.call_tool("run_bash", {"code": 7, "timeout_s": -1, "inputs": [{}]}),
                "code: 7 is not of type 'string'",
                "timeout_s: -1 is less than or equal to the minimum of 0",
            )
            for laxer in ("unchecked", "/tmp/mine.toml", "no-such"):
                assert_tool_error(
                    await s.call_tool("run_python", {"code": "import ctypes", "profile": laxer}),
                    f"profile {laxer!r} is not offered by this server (offered: strict)",
                    "--allow-profile",
                )
            assert_tool_error(
                await s.call_tool("run_python", {"code": "1", "timeout_s": 10**6}),
                "wall_time_s",
            )
            assert_tool_error(
                await s.call_tool("run_python", {"code": "1", "inputs": [{"path": "/etc/passwd"}]}),
                "takes no host paths",
                "--input-root",
            )
            assert_tool_error(
                await s.call_tool(
                    "run_python", {"code": "1", "inputs": [{"name": "a/b", "text": "x"}]}
                ),
                "not a plain file name",
            )
            assert_tool_error(
                await s.call_tool("session_run", {"session_id": "nope", "code": "1"}),
                "no open session 'nope'",
                "session_open",
            )
            assert_tool_error(await s.call_tool("get_artifact", {}), "sha256, or by run_id")
            assert_tool_error(
                await s.call_tool("get_artifact", {"sha256": "0" * 64}), "no artifact"
            )

    anyio.run(scenario)


def test_javascript_and_typescript_tools(mcp_home: Path) -> None:
    runtime_required("node")
    program = (
        'const fs = require("fs");\nconst _ = require("lodash");\n'
        'console.log(_.sum(fs.readFileSync("/inputs/n.txt", "utf8").split(",").map(Number)));\n'
    )
    inputs = [{"name": "n.txt", "text": "40,2"}]

    async def scenario() -> None:
        async with stdio_session(
            mcp_home, "--profile", "unchecked", "--allow-profile", "analysis"
        ) as s:
            r = await s.call_tool("run_javascript", {"code": program, "inputs": inputs})
            assert (structured(r)["outcome"], structured(r)["stdout"]) == ("ok", "42\n"), text(r)
            typed = "const n: number = 42;\nconsole.log(n);\n"
            r = await s.call_tool("run_typescript", {"code": typed})
            assert (structured(r)["outcome"], structured(r)["stdout"]) == ("ok", "42\n"), text(r)
            # No child processes: Node's permission model refuses them.
            spawn = 'require("child_process").execSync("id")'
            r = await s.call_tool("run_javascript", {"code": spawn})
            assert structured(r)["outcome"] == "error", text(r)
            assert "ERR_ACCESS_DENIED" in structured(r)["stderr"], text(r)
            assert_tool_error(
                await s.call_tool("run_javascript", {"code": "1", "profile": "analysis"}),
                "does not allow javascript",
            )
            # A TypeScript session: names persist between cells, the last value is shown.
            opened = structured(await s.call_tool("session_open", {"language": "typescript"}))
            assert opened["language"] == "typescript", opened
            cell = {"session_id": opened["session_id"], "code": "const n: number = 6;"}
            assert structured(await s.call_tool("session_run", cell))["outcome"] == "ok"
            r = await s.call_tool("session_run", {**cell, "code": "console.log(n * 7); n + 1"})
            assert (structured(r)["outcome"], structured(r)["stdout"]) == ("ok", "42\n"), text(r)
            assert text(r).endswith("value:\n7"), text(r)
            await s.call_tool("session_close", {"session_id": opened["session_id"]})

    anyio.run(scenario)


def test_host_paths_only_under_an_input_root(mcp_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    (root / "n.txt").write_text("seven\n")
    (tmp_path / "outside.txt").write_text("secret\n")

    async def scenario() -> None:
        async with stdio_session(mcp_home, "--input-root", str(root)) as s:
            # A symlink under the root that leads out of it is judged by where it leads.
            (root / "escape.txt").symlink_to(tmp_path / "outside.txt")
            assert_tool_error(
                await s.call_tool(
                    "run_bash",
                    {
                        "code": "cat /inputs/escape.txt",
                        "inputs": [{"path": str(root / "escape.txt")}],
                    },
                ),
                "not under an input root",
            )
            r = await s.call_tool(
                "run_bash", {"code": "cat /inputs/n.txt", "inputs": [{"path": str(root / "n.txt")}]}
            )
            assert structured(r)["stdout"] == "seven\n", text(r)

    anyio.run(scenario)


def test_approval_without_elicitation_says_how_to_approve(mcp_home: Path) -> None:
    async def scenario() -> None:
        async with stdio_session(mcp_home) as s:
            r = await s.call_tool("run_python", {"code": "import subprocess\nprint(1)"})
            assert not r.is_error, text(r)
            body = structured(r)
            assert body["outcome"] == "awaiting_approval"
            approval_id = body["policy"]["approval"]["id"]
            assert f"sandcell approve {approval_id}" in text(r)

            denied = await s.call_tool("run_python", {"code": "import ctypes"})
            assert_tool_error(denied, "denied", "py.native")
            assert structured(denied)["outcome"] == "denied"

        with ApprovalStore(mcp_home / "approvals.sqlite3") as store:
            assert store.get(approval_id).status == "pending"

    anyio.run(scenario)


class _Person:
    """The client's user: answers each approval question in turn, and keeps what was asked."""

    def __init__(self, *answers: dict[str, str]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult:
        self.asked.append(params.message)
        content: dict[str, str | int | float | bool | list[str] | None] = {**self.answers.pop(0)}
        return ElicitResult(action="accept", content=content)


def test_approval_by_elicitation_approves_and_denies(mcp_home: Path) -> None:
    person = _Person(
        {"decision": "approve", "reason": "reviewed"},
        {"decision": "deny", "reason": "no processes today"},
    )

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with stdio_session(mcp_home, elicit=person) as s:
            # The approved run is the stored request, inline inputs included.
            ran = await s.call_tool(
                "run_python",
                {
                    "code": "import subprocess\nprint(open('/inputs/note.txt').read())",
                    "inputs": [{"name": "note.txt", "text": "approved and ran"}],
                },
            )
            assert not ran.is_error, text(ran)
            refused = await s.call_tool("run_python", {"code": "import subprocess\nprint(2)"})
            assert_tool_error(refused, "no processes today")
            return structured(ran), structured(refused)

    ran, refused = anyio.run(scenario)
    assert ran["outcome"] == "ok"
    assert ran["stdout"] == "approved and ran\n"
    assert ran["policy"]["approval"]["approved_by"].startswith("mcp-elicitation:")
    assert refused["outcome"] == "denied"
    assert len(person.asked) == 2
    assert "import subprocess" in person.asked[0]
    assert "py.process" in person.asked[0]
    with ApprovalStore(mcp_home / "approvals.sqlite3") as store:
        tickets = {t.status: t for t in store.list(None)}
    assert set(tickets) == {"ran", "denied"}
    assert str(tickets["ran"].decided_by).startswith("mcp-elicitation:")
    assert tickets["ran"].decision_reason == "reviewed"
    assert tickets["denied"].decision_reason == "no processes today"


def test_approval_by_input_required_on_the_2026_protocol(mcp_home: Path) -> None:
    """The 2026-07-28 protocol forbids server requests: the question rides an
    InputRequiredResult and the SDK client retries the call with the answer."""
    person = _Person({"decision": "approve", "reason": "fine"})

    async def scenario() -> tuple[str | None, dict[str, object]]:
        async with Client(server_params(mcp_home), elicitation_callback=person) as c:
            r = await c.call_tool("run_python", {"code": "import subprocess\nprint(6 * 7)"})
            return c.session.protocol_version, structured(r)

    version, result = anyio.run(scenario)
    assert version == "2026-07-28"
    if not person.asked:
        pytest.fail(f"the run did not ask for approval: {result['outcome']} {result['reason']}")
    assert result["outcome"] == "ok", result
    assert result["stdout"] == "42\n"


def test_no_elicitation_leaves_the_decision_to_the_queue(mcp_home: Path) -> None:
    person = _Person({"decision": "approve", "reason": "the client would approve"})

    async def scenario() -> dict[str, object]:
        async with stdio_session(mcp_home, "--no-elicitation", elicit=person) as s:
            return structured(await s.call_tool("run_python", {"code": "import subprocess"}))

    result = anyio.run(scenario)
    assert result["outcome"] == "awaiting_approval"
    assert person.asked == []


def test_a_client_leaving_mid_run_stops_the_run_and_records_it(mcp_home: Path) -> None:
    """The SDK's client closes the server's stdin, then sends SIGTERM: the run in flight is
    stopped, ends as killed, and is in the record."""

    async def scenario() -> None:
        async with stdio_session(mcp_home) as s:
            with anyio.move_on_after(3):
                await s.call_tool("run_python", {"code": "import time\ntime.sleep(120)"})

    anyio.run(scenario)
    with AuditLog(mcp_home / "audit.sqlite3") as audit:
        (entry,) = audit.list()
    assert entry.record["outcome"] == "killed"
    assert entry.record["reason"] == "cancelled: the MCP server was asked to stop"
