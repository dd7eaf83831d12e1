"""A run's governed tool call waits in the approval queue for a person: approved, denied, expired
and forged, through the real executor (namespaces, cold, as root) with its default approver.

The upstream is an HTTP API on 127.0.0.1 that counts what it was asked; the person is a thread
deciding through its own :class:`ApprovalStore` on the executor's file, as ``sandcell approve``
in another terminal does.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.integration.loopback_http import JsonHandler, serving

from sandcell import Executor, Limits, RunRequest, RunResult
from sandcell.policy.approvals import ApprovalError, ApprovalStore
from sandcell.policy.profiles import Profile, parse_profile
from sandcell.policy.tool_tickets import ToolTicket
from sandcell.tools.queue_approver import RUN_ENDED


class _Api(JsonHandler):
    created: list[str] = []  # noqa: RUF012 - one server per module

    def do_POST(self) -> None:
        title = self.json_body().get("title")
        self.created.append(str(title))
        self.send_json({"id": len(self.created), "title": title})


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    with serving(_Api) as port:
        yield port


def _profile(port: int) -> Profile:
    text = f"""
approval = "never"
[tools.tickets]
kind = "http"
base_url = "http://127.0.0.1:{port}"
allow = ["POST /tickets"]
approval = "always"
"""
    return parse_profile(text.encode(), name="queued-tools", source="queued-tools.toml")


CALL = """
import json, sandcell_tools as tools
try:
    print(json.dumps({{"ok": tools.call("tickets.request", method="POST", path="/tickets",
                                        json={{"title": "{title}"}})}}))
except tools.ToolError as e:
    print(json.dumps({{"error": str(e)}}))
"""


def _title() -> str:
    return f"refund-{secrets.token_hex(6)}"


class Person:
    """Waits (in a thread) for the pending tool ticket whose arguments hold ``title``."""

    def __init__(
        self, path: Path, title: str, decide: Callable[[ApprovalStore, ToolTicket], object]
    ) -> None:
        self.path, self.title, self.decide = path, title, decide
        self.ticket: ToolTicket | None = None
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with ApprovalStore(self.path) as store:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    mine = [t for t in store.list_tools() if self.title in t.args_preview]
                    if mine:
                        self.ticket = mine[0]
                        self.decide(store, mine[0])
                        return
                    time.sleep(0.05)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.errors.append(exc)

    def join(self) -> ToolTicket:
        self.thread.join(120)
        assert not self.errors, self.errors
        assert self.ticket is not None, "no tool ticket was filed"
        return self.ticket


def _answer(result: RunResult) -> dict[str, object]:
    assert result.outcome.value == "ok", (result.reason, result.stderr)
    value = json.loads(result.stdout.splitlines()[-1])
    assert isinstance(value, dict)
    return value


def _calls(result: RunResult) -> list[dict[str, object]]:
    assert result.tools is not None
    calls = result.tools["calls"]
    assert isinstance(calls, list)
    return calls


def _run(executor: Executor, port: int, code: str, wall: float = 60) -> RunResult:
    return executor.run(
        RunRequest(code=code, limits=Limits(wall_time_s=wall)), profile=_profile(port)
    )


def test_an_approved_call_goes_ahead_and_its_record_names_the_approver(
    executor: Executor, api: int
) -> None:
    title = _title()
    person = Person(
        executor.approvals.path,
        title,
        lambda s, t: s.approve_tool(t.id, by="alice@host", reason="fine"),
    )
    result = _run(executor, api, CALL.format(title=title))
    ticket = person.join()
    answer = _answer(result)
    assert answer["ok"] == {
        "status": 200,
        "content_type": "application/json",
        "body": {"id": _Api.created.index(title) + 1, "title": title},
    }
    (call,) = _calls(result)
    assert call["decision"] == "allowed"
    assert call["approver"] == f"alice@host (approval {ticket.id})"
    # The ticket and the call record name each other: run id one way, argument hash both ways.
    settled = executor.approvals.get_tool(ticket.id)
    assert (settled.status, settled.run_id) == ("approved", result.run_id)
    assert settled.args_sha256 == call["args_sha256"]
    entry = executor.audit.get(result.run_id)
    assert entry is not None
    stored_tools = entry.record["tools"]
    assert isinstance(stored_tools, dict)
    assert stored_tools["calls"][0]["approver"] == call["approver"]
    assert executor.audit.verify().ok


def test_a_denied_call_is_refused_to_the_program_and_never_reaches_the_upstream(
    executor: Executor, api: int
) -> None:
    title = _title()
    person = Person(
        executor.approvals.path,
        title,
        lambda s, t: s.deny_tool(t.id, by="bob@host", reason="not for this customer"),
    )
    result = _run(executor, api, CALL.format(title=title))
    ticket = person.join()
    answer = _answer(result)
    assert answer["error"] == f"tickets.request was denied by bob@host (approval {ticket.id})"
    assert title not in _Api.created
    (call,) = _calls(result)
    assert (call["decision"], call["approver"]) == ("denied", f"bob@host (approval {ticket.id})")
    assert call["result_sha256"] is None
    settled = executor.approvals.get_tool(ticket.id)
    assert (settled.status, settled.reason) == ("denied", "not for this customer")


def test_nobody_deciding_before_the_wall_time_expires_the_ticket(
    executor: Executor, api: int
) -> None:
    title = _title()
    seen: list[ToolTicket] = []
    person = Person(executor.approvals.path, title, lambda s, t: seen.append(t))
    result = _run(executor, api, CALL.format(title=title), wall=4)
    ticket = person.join()
    # The call waited within the run's time: the wall time ended the run.
    assert result.outcome.value == "timeout", result.reason
    assert title not in _Api.created
    settled = executor.approvals.get_tool(ticket.id)
    assert settled.status == "expired"
    assert settled.reason == RUN_ENDED or "nobody decided" in str(settled.reason)
    with pytest.raises(ApprovalError, match="is expired"):
        executor.approvals.approve_tool(ticket.id, by="late@host")
    # The call that was waiting is in the record, refused, with nobody as its approver.
    (call,) = _calls(result)
    assert (call["decision"], call["approver"]) == ("refused", None)


FORGER = """
import json, os, socket, struct, sandcell_tools as tools
store = {store!r}
seen = {{"store_visible": os.path.exists(store) or os.path.exists(os.path.dirname(store))}}
try:
    with open(store, "r+b"):
        seen["store_writable"] = True
except OSError as e:
    seen["store_writable"] = type(e).__name__
# A request that claims its own approval: the gateway knows no such field.
args = {{"method": "POST", "path": "/tickets", "json": {{"title": "forged"}}}}
body = json.dumps({{"op": "call", "tool": "tickets.request", "approved_by": "me", "args": args}})
body = body.encode()
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["SANDCELL_TOOLS_SOCKET"])
    s.sendall(struct.pack(">I", len(body)) + body)
    size = struct.unpack(">I", s.recv(4))[0]
    seen["self_approved"] = json.loads(s.recv(size))
seen["real"] = tools.call("tickets.request", method="POST", path="/tickets",
                          json={{"title": "{title}"}})["body"]["title"]
print(json.dumps(seen))
"""


def test_forged_approvals_fail_and_only_a_real_one_counts(executor: Executor, api: int) -> None:
    title = _title()
    run_ticket = executor.approvals.submit(
        RunRequest(code="print(1)"),
        profile={"name": "x", "source": "builtin", "sha256": "00" * 32},
        findings=[],
        why="a run ticket, to be passed off as a tool ticket",
    )
    attempts: list[str] = []

    def decide(store: ApprovalStore, ticket: ToolTicket) -> None:
        for forge in (
            lambda: store.approve_tool(run_ticket.id, by="mallory@host"),  # the wrong kind
            lambda: store.approve(ticket.id, by="mallory@host"),  # through the run path
            lambda: store.approve_tool("t" + "0" * 12, by="mallory@host"),  # not a ticket
        ):
            try:
                forge()
                attempts.append("accepted")
            except ApprovalError as exc:
                attempts.append(str(exc))
        store.approve_tool(ticket.id, by="alice@host")
        try:
            store.approve_tool(ticket.id, by="mallory@host")  # twice
            attempts.append("accepted")
        except ApprovalError as exc:
            attempts.append(str(exc))

    person = Person(executor.approvals.path, title, decide)
    code = FORGER.format(store=str(executor.approvals.path), title=title)
    result = _run(executor, api, code)
    ticket = person.join()
    seen = _answer(result)
    assert seen["store_visible"] is False
    assert seen["store_writable"] in ("FileNotFoundError", "PermissionError")
    self_approved = seen["self_approved"]
    assert isinstance(self_approved, dict) and self_approved["ok"] is False
    assert "approved_by" in str(self_approved["error"])
    assert seen["real"] == title
    assert "forged" not in _Api.created
    assert "accepted" not in attempts
    assert "is a run waiting for approval, not a tool call" in attempts[0]
    assert "is a tool call a run is waiting on, not a run" in attempts[1]
    assert "no tool call approval" in attempts[2]
    assert "is approved by alice@host" in attempts[3]
    assert executor.approvals.get(run_ticket.id).status == "pending"
    invalid, real = _calls(result)
    assert (invalid["operation"], invalid["decision"]) == ("invalid", "refused")
    assert real["approver"] == f"alice@host (approval {ticket.id})"
