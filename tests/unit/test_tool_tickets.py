"""Tool-call tickets in the approval store (sandcell.policy.approvals + tool_tickets): a real
SQLite file, or a real PostgreSQL database (``store_backend``), per test; decisions from threads
as another terminal would make them, and every way an approval can be forged short of writing
the store (which its 0600 mode, or the database's credentials, keep to the owner)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.policy.approvals import ApprovalError, ApprovalStore
from sandcell.policy.tool_tickets import (
    TOOL_SCHEMA,
    canonical_args,
    is_tool_ticket_id,
    render_tool_list_lines,
    render_tool_ticket,
)
from sandcell.spec import RunRequest
from sandcell.tools.records import digest

pytestmark = pytest.mark.usefixtures("store_backend")

ARGS = {"title": "refund for order 17", "priority": 2}
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 4  # the shape of a GitHub token: redacted in previews


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ApprovalStore]:
    with ApprovalStore(tmp_path / "approvals.sqlite3") as s:
        yield s


def submit(store: ApprovalStore, **kw: object) -> str:
    fields: dict[str, object] = {
        "profile": "tickets",
        "tool": "tickets.create_ticket",
        "args": ARGS,
        "expires_in_s": 60.0,
        "run_id": "r" * 32,
    }
    fields.update(kw)
    return store.submit_tool(**fields).id  # type: ignore[arg-type]


def test_a_submitted_call_is_pending_with_a_hash_matching_the_call_record(
    store: ApprovalStore,
) -> None:
    ticket = store.get_tool(submit(store))
    assert ticket.status == "pending"
    assert is_tool_ticket_id(ticket.id) and ticket.id.startswith("t")
    assert (ticket.profile, ticket.tool, ticket.run_id) == (
        "tickets",
        "tickets.create_ticket",
        "r" * 32,
    )
    # The gateway's record hashes the arguments the same way: a ticket names its call.
    assert ticket.args_sha256 == digest(ARGS)
    assert '"title": "refund for order 17"' in ticket.args_preview
    assert ticket.args_json == canonical_args(ARGS) and ticket.intact
    assert ticket.args_bytes == len(canonical_args(ARGS).encode())
    assert ticket.expires_at > ticket.created_at
    assert (ticket.decided_by, ticket.decided_at, ticket.reason) == (None, None, None)
    assert store.get_tool(ticket.id[:7]).id == ticket.id  # a unique prefix is enough
    assert [t.id for t in store.list_tools()] == [ticket.id]


def test_the_arguments_are_kept_and_shown_whole_with_secrets_redacted(
    store: ApprovalStore,
) -> None:
    args = {"a_token": GITHUB_TOKEN, "body": "x" * 5000}
    ticket = store.get_tool(submit(store, args=args))
    assert GITHUB_TOKEN not in ticket.args_preview
    assert "[REDACTED:github_token]" in ticket.args_preview
    assert "x" * 5000 in ticket.args_preview  # nothing is cut
    # The hash and size are of the arguments as sent, kept in full, not of what is shown.
    assert ticket.args_json == canonical_args(args) and GITHUB_TOKEN in ticket.args_json
    assert ticket.args_sha256 == digest(args)
    assert ticket.args_bytes > 5000


def test_the_request_line_leads_and_no_redaction_or_padding_hides_it(
    store: ApprovalStore,
) -> None:
    # Padding sorted before "method" pushed a DELETE out of a preview cut at 2,000 characters.
    args = {
        "json": {"pad": "." * 5000},
        "method": "DELETE",
        "path": f"/repos/acme/{GITHUB_TOKEN}",
        "query": {"force": "1"},
    }
    ticket = store.get_tool(submit(store, tool="gh.request", args=args))
    line = f"DELETE /repos/acme/{GITHUB_TOKEN}?force=1"
    assert ticket.request_line == line
    shown = render_tool_ticket(ticket)
    assert f"\nrequest   {line}\n" in shown
    assert shown.index("request   DELETE") < shown.index("." * 5000)
    [listed] = render_tool_list_lines([ticket])
    assert line in listed
    assert ticket.to_dict()["request_line"] == line


@pytest.mark.sqlite_only
def test_a_store_made_before_full_arguments_were_kept_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "approvals.sqlite3"
    with ApprovalStore(path) as old:
        tid = submit(old)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE tool_approvals DROP COLUMN args_json")
    conn.commit()
    conn.close()
    with ApprovalStore(path) as upgraded:
        ticket = upgraded.get_tool(tid)
        # Its arguments were never kept: shown as such, and no call can go through on it.
        assert ticket.args_json is None and not ticket.intact
        assert "WARNING" in render_tool_ticket(ticket)
        assert upgraded.get_tool(submit(upgraded)).intact


def test_approve_records_who_and_why_and_only_once(store: ApprovalStore) -> None:
    tid = submit(store)
    approved = store.approve_tool(tid, by="alice@host", reason="looked fine")
    assert approved.status == "approved"
    assert (approved.decided_by, approved.reason) == ("alice@host", "looked fine")
    assert approved.decided_at is not None
    with pytest.raises(ApprovalError, match=r"is approved by alice@host .*only a pending one"):
        store.approve_tool(tid, by="mallory@host")
    with pytest.raises(ApprovalError, match="is approved"):
        store.deny_tool(tid, by="bob@host", reason="too late")
    assert store.get_tool(tid).decided_by == "alice@host"
    assert store.list_tools() == []
    assert [t.status for t in store.list_tools(None)] == ["approved"]


def test_deny_needs_a_reason_and_is_final(store: ApprovalStore) -> None:
    tid = submit(store)
    with pytest.raises(ApprovalError, match="reason must not be empty"):
        store.deny_tool(tid, by="bob@host", reason="  ")
    with pytest.raises(ApprovalError, match="approver"):
        store.approve_tool(tid, by="")
    denied = store.deny_tool(tid, by="bob@host", reason="not this customer")
    assert (denied.status, denied.reason) == ("denied", "not this customer")
    with pytest.raises(ApprovalError, match="is denied by bob@host"):
        store.approve_tool(tid, by="alice@host")


def test_expired_tickets_cannot_be_approved_even_if_nobody_marked_them(
    store: ApprovalStore,
) -> None:
    # The waiting process may have died: a pending ticket past its deadline is expired on read.
    tid = submit(store, expires_in_s=0)
    with pytest.raises(ApprovalError, match=r"is expired .*nobody decided before"):
        store.approve_tool(tid, by="alice@host")
    ticket = store.get_tool(tid)
    assert ticket.status == "expired"
    assert ticket.decided_by is None


def test_expire_settles_only_pending_tickets(store: ApprovalStore) -> None:
    tid = submit(store)
    expired = store.expire_tool(tid, reason="the run ended before anyone decided")
    assert (expired.status, expired.reason) == ("expired", "the run ended before anyone decided")
    with pytest.raises(ApprovalError, match="is expired"):
        store.approve_tool(tid, by="alice@host")
    # A decision that came first stands: expiring it changes nothing.
    other = submit(store)
    store.approve_tool(other, by="alice@host")
    assert store.expire_tool(other, reason="late").status == "approved"


def test_the_two_kinds_of_ticket_never_stand_in_for_each_other(store: ApprovalStore) -> None:
    run_ticket = store.submit(
        RunRequest(code="print(1)"),
        profile={"name": "review", "source": "builtin", "sha256": "ab" * 32},
        findings=[],
        why="review",
    )
    tool_id = submit(store)
    with pytest.raises(ApprovalError, match="is a run waiting for approval, not a tool call"):
        store.approve_tool(run_ticket.id, by="alice@host")
    with pytest.raises(ApprovalError, match="is a run waiting for approval"):
        store.deny_tool(run_ticket.id[:8], by="alice@host", reason="no")
    with pytest.raises(ApprovalError, match="is a tool call a run is waiting on, not a run"):
        store.approve(tool_id, by="alice@host")
    with pytest.raises(ApprovalError, match="is a tool call"):
        store.deny(tool_id[:7], by="alice@host", reason="no")
    # Neither was changed by the attempts.
    assert store.get(run_ticket.id).status == "pending"
    assert store.get_tool(tool_id).status == "pending"


def test_tool_tickets_page_newest_first_by_position(store: ApprovalStore) -> None:
    ids = [submit(store, run_id=f"{n:032d}") for n in range(5)]
    store.deny_tool(ids[1], by="ana", reason="no")
    first = store.tools_before(None, 2, before=None)
    assert [t.id for _, t in first] == [ids[4], ids[3]]
    rest = store.tools_before(None, 10, before=first[-1][0])
    assert [t.id for _, t in rest] == [ids[2], ids[1], ids[0]]
    submit(store)  # filed meanwhile: it never shifts a later page
    assert store.tools_before(None, 10, before=first[-1][0]) == rest
    pending = store.tools_before("pending", 10, before=first[-1][0])
    assert [t.id for _, t in pending] == [ids[2], ids[0]]


def test_unknown_and_ambiguous_ids(store: ApprovalStore) -> None:
    with pytest.raises(ApprovalError, match="no tool call approval 't00000000000'"):
        store.approve_tool("t00000000000", by="alice@host")
    with pytest.raises(ApprovalError, match="no tool call approval"):
        store.get_tool("t0")
    with pytest.raises(ApprovalError, match="unknown status"):
        store.list_tools("ran")


def test_racing_deciders_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "approvals.sqlite3"
    with ApprovalStore(path) as first:
        tid = submit(first)
    results: list[str] = []

    def decide(n: int) -> None:
        # Each its own connection, as separate `sandcell approve` processes would have.
        with ApprovalStore(path) as s:
            try:
                if n % 2:
                    s.approve_tool(tid, by=f"approver{n}")
                else:
                    s.deny_tool(tid, by=f"approver{n}", reason="no")
                results.append(f"won {n}")
            except ApprovalError:
                results.append("lost")

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.startswith("won") for r in results) == 1
    assert results.count("lost") == 7
    with ApprovalStore(path) as s:
        final = s.get_tool(tid)
    assert final.decided_by == f"approver{next(r for r in results if r != 'lost').split()[1]}"


@pytest.mark.sqlite_only
def test_a_store_from_before_tool_tickets_gets_the_table(tmp_path: Path) -> None:
    path = tmp_path / "approvals.sqlite3"
    with ApprovalStore(path):
        pass
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE tool_approvals")
    conn.commit()
    conn.close()
    with ApprovalStore(path) as s:
        tid = submit(s)
        assert s.get_tool(tid).status == "pending"
    # IF NOT EXISTS: opening a store that has the table again is harmless.
    assert "IF NOT EXISTS" in TOOL_SCHEMA
    with ApprovalStore(path) as s:
        assert s.get_tool(tid).status == "pending"


def test_rendering_shows_what_was_sent_without_driving_the_terminal(
    store: ApprovalStore,
) -> None:
    tid = submit(store, tool="tickets.create_ticket", args={"title": "\x1b[2J\u202eevil\nline"})
    shown = render_tool_ticket(store.get_tool(tid))
    assert "\x1b" not in shown and "\u202e" not in shown
    # JSON escapes the C0 controls itself; the bidi override is made visible by the renderer.
    assert "\\u001b[2J" in shown and "\\u202e" in shown
    assert f"approval  {tid}  pending  (a tool call, not a run)" in shown
    assert "tool      tickets.create_ticket" in shown
    assert f"sandcell approve {tid}" in shown
    (line,) = render_tool_list_lines(store.list_tools())
    assert line.startswith(tid) and "tool" in line and "pending" in line
    assert "\x1b" not in line and "\n" not in line
    store.deny_tool(tid, by="bob@host", reason="no")
    shown = render_tool_ticket(store.get_tool(tid))
    assert "decided   denied by bob@host" in shown
    assert "reason    no" in shown
    assert "sandcell approve" not in shown
