"""A person approves the exact, complete tool call, and that call is what runs.

A real gateway calls a real HTTP API on 127.0.0.1 whose profile says ``approval = "always"``;
the call waits in a real approval store (SQLite) and a person, in another thread as another
terminal would be, reads the ticket exactly as ``sandcell approvals show`` prints it and
decides. The attacks: padding that pushed a ``DELETE`` out of a cut preview, a ticket whose
stored arguments were edited in the file after it was filed, and an approval of other
arguments than the call's.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.approval_person import person
from tests.integration.loopback_http import JsonHandler, serving

from sandcell.policy.approvals import ApprovalStore
from sandcell.policy.profiles import parse_profile
from sandcell.policy.tool_tickets import ToolTicket, render_tool_list_lines, render_tool_ticket
from sandcell.tools.approval import ApprovalDecision, ApprovalRequest
from sandcell.tools.gateway import ToolGateway
from sandcell.tools.protocol import Request
from sandcell.tools.queue_approver import QueueApprover
from sandcell.tools.records import digest


class _Api(JsonHandler):
    seen: list[tuple[str, str, object]] = []  # noqa: RUF012 - one server per module

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.json_body()))
        self.send_json({"done": self.command})

    do_POST = do_DELETE = _answer


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    with serving(_Api) as port:
        yield port


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ApprovalStore]:
    with ApprovalStore(tmp_path / "approvals.sqlite3") as s:
        yield s


def _gateway(
    api: int, approver: Callable[[ApprovalRequest], ApprovalDecision | None]
) -> ToolGateway:
    profile = parse_profile(
        f"""
approval = "never"
[tools.gh]
kind = "http"
base_url = "http://127.0.0.1:{api}"
allow = ["POST /tickets", "DELETE /repos/*/*"]
approval = "always"
""".encode(),
        name="exact",
        source="exact.toml",
    )
    return ToolGateway(profile="exact", tools=profile.tools, approver=approver, environ={})


PADDED = {
    # Sorted keys put "json" first: a preview cut at 2,000 characters showed only padding.
    "json": {"note": "routine cleanup " + "." * 6000},
    "method": "DELETE",
    "path": "/repos/acme/prod",
}


def _call(gw: ToolGateway, args: dict[str, object]) -> dict[str, object]:
    return gw.execute(Request(op="call", tool="gh.request", args=args), request_bytes=1)


def test_the_person_sees_the_whole_call_and_exactly_that_call_runs(
    api: int, store: ApprovalStore
) -> None:
    shown: list[str] = []
    listed: list[str] = []

    def read_then_approve(s: ApprovalStore, ticket: ToolTicket) -> None:
        shown.append(render_tool_ticket(ticket))
        listed.extend(render_tool_list_lines([ticket]))
        s.approve_tool(ticket.id, by="ann@host")

    _Api.seen.clear()
    deciding = person(store.path, read_then_approve)
    answer = _call(_gateway(api, QueueApprover(store, timeout_s=60, poll_s=0.02)), PADDED)
    deciding.join()
    assert answer["ok"], answer
    [text] = shown
    # The request line is on a line of its own, before the arguments, and the whole padding
    # is there after it: nothing is cut.
    assert "\nrequest   DELETE /repos/acme/prod\n" in text
    assert "." * 6000 in text
    assert '"method": "DELETE"' in text and '"path": "/repos/acme/prod"' in text
    assert "DELETE /repos/acme/prod" in listed[0]
    (ticket,) = store.list_tools(None)
    assert ticket.args_json is not None and json.loads(ticket.args_json) == PADDED
    assert ticket.args_sha256 == digest(PADDED) and ticket.intact
    assert f"sha256 {ticket.args_sha256}" in text
    # What reached the API is what the ticket holds, byte for byte in its arguments.
    assert _Api.seen == [("DELETE", "/repos/acme/prod", PADDED["json"])]


def test_a_ticket_whose_stored_arguments_were_edited_lets_no_call_through(
    api: int, store: ApprovalStore
) -> None:
    # Someone with write access to the file shows the person a harmless call (the hash left
    # as it was) and approves it: the stored text no longer hashes to the ticket's sha256,
    # and it is not the text of the waiting call, so the call is refused.
    def forge(s: ApprovalStore, ticket: ToolTicket) -> None:
        harmless = json.dumps({"method": "POST", "path": "/tickets", "json": {"t": 1}})
        conn = sqlite3.connect(s.path)
        conn.execute("UPDATE tool_approvals SET args_json = ? WHERE id = ?", (harmless, ticket.id))
        conn.commit()
        conn.close()
        edited = s.get_tool(ticket.id)
        assert not edited.intact and "WARNING" in render_tool_ticket(edited)
        s.approve_tool(ticket.id, by="mallory@host")

    _Api.seen.clear()
    deciding = person(store.path, forge)
    answer = _call(_gateway(api, QueueApprover(store, timeout_s=60, poll_s=0.02)), PADDED)
    deciding.join()
    assert not answer["ok"] and _Api.seen == []


def test_an_approval_of_other_arguments_is_refused_at_execution(api: int) -> None:
    asked: list[ApprovalRequest] = []

    def approve_something_else(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        # The approver may change its copy: the call that runs is fixed before it is asked.
        request.args["path"] = "/repos/acme/other"
        return ApprovalDecision(
            approved=True, approver="ann", args_sha256=digest({**PADDED, "path": "/x"})
        )

    _Api.seen.clear()
    gw = _gateway(api, approve_something_else)
    answer = _call(gw, PADDED)
    assert not answer["ok"] and "not of this call" in str(answer["error"])
    assert _Api.seen == [] and gw.records[-1].decision == "refused"
    assert asked[0].args == PADDED and asked[0].args_sha256 == digest(PADDED)

    def approve_this(request: ApprovalRequest) -> ApprovalDecision:
        request.args["path"] = "/repos/acme/other"
        return ApprovalDecision(approved=True, approver="ann", args_sha256=request.args_sha256)

    answer = _call(_gateway(api, approve_this), PADDED)
    assert answer["ok"], answer
    assert _Api.seen == [("DELETE", "/repos/acme/prod", PADDED["json"])]
