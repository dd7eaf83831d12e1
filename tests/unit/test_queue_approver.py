"""The approval queue as an approver (sandcell.tools.queue_approver): a real store, a person
simulated by a thread that decides through its own ApprovalStore on the same file, as
``sandcell approve`` in another terminal does."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.approval_person import person

from sandcell.errors import ConfigError
from sandcell.policy.approvals import ApprovalStore
from sandcell.policy.tool_tickets import ToolTicket
from sandcell.tools.approval import ApprovalRequest, NoApproval, Outcome, ask
from sandcell.tools.queue_approver import RUN_ENDED, QueueApprover, ticket_lifetime

REQUEST = ApprovalRequest.for_call(
    profile="tickets", tool="tickets.create_ticket", args={"title": "refund", "n": 1}
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "approvals.sqlite3"


@pytest.fixture
def store(path: Path) -> Iterator[ApprovalStore]:
    with ApprovalStore(path) as s:
        yield s


def test_a_call_waits_until_a_person_approves(path: Path, store: ApprovalStore) -> None:
    approver = QueueApprover(store, timeout_s=60, run_id="a" * 32, poll_s=0.05)
    seen: list[ToolTicket] = []

    def approve(s: ApprovalStore, t: ToolTicket) -> None:
        seen.append(t)
        s.approve_tool(t.id, by="alice@host", reason="fine")

    thread = person(path, approve)
    decision = approver(REQUEST)
    thread.join()
    assert decision is not None and decision.approved
    (ticket,) = seen
    assert decision.approver == f"alice@host (approval {ticket.id})"
    assert ticket.run_id == "a" * 32
    assert (ticket.tool, ticket.profile) == (REQUEST.tool, REQUEST.profile)
    assert store.get_tool(ticket.id).status == "approved"


def test_a_denial_is_a_decision_with_the_decider(path: Path, store: ApprovalStore) -> None:
    approver = QueueApprover(store, timeout_s=60, poll_s=0.05)
    thread = person(path, lambda s, t: s.deny_tool(t.id, by="bob@host", reason="no refunds"))
    outcome = ask(approver, REQUEST, 60)
    thread.join()
    assert outcome.decision is not None and not outcome.decision.approved
    assert outcome.reason.startswith("tickets.create_ticket was denied by bob@host (approval t")


def test_nobody_deciding_expires_the_ticket_before_the_gateway_gives_up(
    store: ApprovalStore,
) -> None:
    # A long poll: after expiring the ticket the approver waits well past the gateway's own
    # deadline, so the gateway is the one that gives up (and says so), however loaded the host.
    approver = QueueApprover(store, timeout_s=1.0, poll_s=0.5)
    outcome = ask(approver, REQUEST, 1.0)
    assert outcome.decision is None
    assert outcome.reason == "no approval within 1 s; refused"
    (ticket,) = store.list_tools(None)
    # Settled before the gateway stopped waiting: nobody can approve it any more.
    assert ticket.status == "expired"
    assert ticket.reason is not None and "nobody decided" in ticket.reason
    assert ticket_lifetime(1.0) < 1.0


def test_closing_expires_waiting_tickets_and_wakes_their_calls(store: ApprovalStore) -> None:
    approver = QueueApprover(store, timeout_s=300, poll_s=0.05)
    answers: list[object] = []
    waiter = threading.Thread(target=lambda: answers.append(ask(approver, REQUEST, 300)))
    waiter.start()
    while not store.list_tools():
        time.sleep(0.02)
    approver.close()  # the run ended while the call waited
    waiter.join(30)
    assert not waiter.is_alive()
    (ticket,) = store.list_tools(None)
    assert (ticket.status, ticket.reason) == ("expired", RUN_ENDED)
    (outcome,) = answers
    assert isinstance(outcome, Outcome) and outcome.decision is None
    assert outcome.reason == (
        f"tickets.create_ticket: approval {ticket.id} expired: {RUN_ENDED}; refused"
    )
    # After close, nothing more is filed.
    with pytest.raises(NoApproval, match=RUN_ENDED):
        approver(REQUEST)
    assert len(store.list_tools(None)) == 1


def test_a_close_landing_while_the_call_reads_the_store_still_says_the_run_ended(
    store: ApprovalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race CI once lost: the run ends (the ticket expires) between the call's polls, so the
    # call reads an expired ticket rather than being woken; the reason must still be the run's end.
    approver = QueueApprover(store, timeout_s=300, poll_s=0.05)
    read = store.get_tool
    closers: list[threading.Thread] = []

    def get_tool(id_: str) -> ToolTicket:
        if not closers:
            closers.append(threading.Thread(target=approver.close))
            closers[0].start()
            while read(id_).status != "expired":
                time.sleep(0.01)
        return read(id_)

    monkeypatch.setattr(store, "get_tool", get_tool)
    outcome = ask(approver, REQUEST, 300)
    closers[0].join(30)
    (ticket,) = store.list_tools(None)
    assert outcome.decision is None
    assert outcome.reason == (
        f"tickets.create_ticket: approval {ticket.id} expired: {RUN_ENDED}; refused"
    )


def test_an_approval_of_a_ticket_edited_in_the_file_is_not_an_approval(
    path: Path, store: ApprovalStore
) -> None:
    # Forged: someone with write access to the file changes what the ticket says (another tool)
    # and approves it; the waiting call is not what was approved, so it stays refused.
    approver = QueueApprover(store, timeout_s=60, poll_s=0.05)

    def forge(s: ApprovalStore, t: ToolTicket) -> None:
        conn = sqlite3.connect(path)
        conn.execute(
            "UPDATE tool_approvals SET tool = 'tickets.search_tickets' WHERE id = ?", (t.id,)
        )
        conn.commit()
        conn.close()
        s.approve_tool(t.id, by="mallory@host")

    thread = person(path, forge)
    decision = approver(REQUEST)
    thread.join()
    assert decision is None


def test_a_timeout_must_be_positive(store: ApprovalStore) -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        QueueApprover(store, timeout_s=0)


# --- The executor's default: open_run_sockets -------------------------------------------------

TOOL_PROFILE = """
approval = "never"
[tools.tickets]
kind = "http"
base_url = "http://127.0.0.1:9"
allow = ["POST /tickets"]
approval = "always"
"""


def _call_in_thread(
    monkeypatch: pytest.MonkeyPatch, socket_path: Path
) -> tuple[threading.Thread, list[str]]:
    from sandcell.tools import sandcell_tools

    monkeypatch.setenv("SANDCELL_TOOLS_SOCKET", str(socket_path))
    errors: list[str] = []

    def call() -> None:
        try:
            sandcell_tools.call("tickets.request", method="POST", path="/tickets", json={})
        except sandcell_tools.ToolError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=call)
    thread.start()
    return thread, errors


def test_closing_the_run_sockets_expires_the_waiting_call_and_records_it(
    store: ApprovalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandcell.policy.profiles import parse_profile
    from sandcell.run_sockets import TOOLS_SOCKET
    from sandcell.tools.queue_approver import open_run_sockets

    profile = parse_profile(TOOL_PROFILE.encode(), name="queued", source="queued.toml")
    sockets = open_run_sockets(
        profile, store=store, approver=None, approval_timeout_s=300, run_id="b" * 32
    )
    assert sockets is not None
    thread, errors = _call_in_thread(monkeypatch, sockets.sandbox.host_dir / TOOLS_SOCKET)
    while not store.list_tools():
        time.sleep(0.02)
    record = sockets.close()  # the run ended while its call waited for a person
    thread.join(30)
    (ticket,) = store.list_tools(None)
    assert (ticket.status, ticket.reason, ticket.run_id) == ("expired", RUN_ENDED, "b" * 32)
    # The call is in the run's record, refused, though it was still waiting when the run ended.
    tools = record["tools"]
    assert isinstance(tools, dict)
    (call,) = tools["calls"]
    assert (call["tool"], call["decision"], call["approver"]) == (
        "tickets.request",
        "refused",
        None,
    )
    assert len(errors) == 1


def test_an_explicit_approver_replaces_the_queue(
    store: ApprovalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandcell.policy.profiles import parse_profile
    from sandcell.run_sockets import TOOLS_SOCKET
    from sandcell.tools.approval import ApprovalDecision
    from sandcell.tools.queue_approver import open_run_sockets

    asked: list[ApprovalRequest] = []

    def no(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision(approved=False, approver="policy-bot")

    profile = parse_profile(TOOL_PROFILE.encode(), name="queued", source="queued.toml")
    sockets = open_run_sockets(profile, store=store, approver=no, approval_timeout_s=300)
    assert sockets is not None
    try:
        thread, errors = _call_in_thread(monkeypatch, sockets.sandbox.host_dir / TOOLS_SOCKET)
        thread.join(30)
    finally:
        sockets.close()
    assert errors == ["tickets.request was denied by policy-bot"]
    assert [r.tool for r in asked] == ["tickets.request"]
    assert store.list_tools(None) == []
