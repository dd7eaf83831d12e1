"""Tests of sandcell.policy.approvals: the queue of runs waiting for a person.

Tampering is done as someone with write access would: raw SQL statements on the store's own
tables (the SQLite file, or the PostgreSQL schema). Every test runs against both databases
(``store_backend``) unless it is about the SQLite file itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.store_backend import StoreBackend

from sandcell.errors import ConfigError
from sandcell.policy.approvals import (
    ApprovalError,
    ApprovalStore,
    ApprovedRun,
    Ticket,
    approval_record,
    default_approver,
    render_list,
    render_ticket,
    request_from_dict,
    request_to_dict,
)
from sandcell.spec import InputFile, IsolationMode, Limits, MiB, RunRequest

pytestmark = pytest.mark.usefixtures("store_backend")

SCHEMA = "sandcell_approvals"
"""The approval store's PostgreSQL schema."""

PROFILE = {"name": "review", "source": "builtin", "sha256": "ab" * 32}
CODE = "import os\nx = 1\nprint(os.listdir('.'))\n"
FINDING = {
    "rule_id": "py.filesystem",
    "severity": "high",
    "line": 3,
    "column": 7,
    "message": "lists a directory",
    "snippet": "print(os.listdir('.'))",
}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "approvals.sqlite3"


@pytest.fixture
def store(db: Path) -> Iterator[ApprovalStore]:
    with ApprovalStore(db) as s:
        yield s


def submit(store: ApprovalStore, code: str = CODE, **kw: object) -> Ticket:
    return store.submit(
        RunRequest(code=code, **kw),  # type: ignore[arg-type]
        profile=PROFILE,
        findings=[FINDING],
        why="a high finding needs approval",
    )


def full_request(tmp_path: Path) -> RunRequest:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    return RunRequest(
        code="cat /inputs/data.csv\n",
        language="bash",
        inputs=(
            InputFile(host_path=tmp_path / "data.csv", name="data.csv"),
            InputFile(host_path=tmp_path, name="dir"),
        ),
        exports=("out/*.png", "result.json"),
        limits=Limits(
            wall_time_s=2.5,
            cpu_time_s=3,
            memory_bytes=64 * MiB,
            max_pids=8,
            max_open_files=32,
            max_file_bytes=MiB,
            workspace_bytes=8 * MiB,
            workspace_inodes=100,
            tmp_bytes=2 * MiB,
            stdout_bytes=1000,
            stderr_bytes=2000,
        ),
        stdin=b"\x00\xff binary \n\x1b",
        env={"MODE": "fast", "EMPTY": "", "UNICODE": "naïve ☃"},
        mode=IsolationMode.RLIMITS,
        landlock=True,
    )


def tamper(backend: StoreBackend, path: Path, statement: str) -> None:
    """Edit the store behind sandcell's back."""
    with backend.raw(path, SCHEMA) as conn:
        conn.execute(statement)


# --- serialisation ----------------------------------------------------------------------------


@pytest.mark.store_free
def test_request_round_trips_exactly(tmp_path: Path) -> None:
    for req in (full_request(tmp_path), RunRequest(code="print(1)")):
        through_json = json.loads(json.dumps(request_to_dict(req)))
        assert request_from_dict(through_json) == req
    d = request_to_dict(full_request(tmp_path))
    assert d["env"] == {"MODE": "fast", "EMPTY": "", "UNICODE": "naïve ☃"}  # values are stored
    assert isinstance(d["limits"], dict)
    assert set(d["limits"]) == {
        "wall_time_s",
        "cpu_time_s",
        "memory_bytes",
        "max_pids",
        "max_open_files",
        "max_file_bytes",
        "workspace_bytes",
        "workspace_inodes",
        "tmp_bytes",
        "stdout_bytes",
        "stderr_bytes",
    }


@pytest.mark.store_free
@pytest.mark.parametrize(
    "change",
    [
        {"limits": {"wall_time_s": 1, "bogus_limit": 3}},
        {"limits": {"wall_time_s": -1}},
        {"stdin_b64": "not base64!"},
        {"env": {"A": 1}},
        {"language": "cobol"},
        {"mode": "none"},
        {"landlock": "yes"},
        {"inputs": [{"name": "x"}]},
    ],
)
def test_malformed_request_dict_is_refused(change: dict[str, object]) -> None:
    d = {**request_to_dict(RunRequest(code="x")), **change}
    with pytest.raises(ApprovalError, match="malformed"):
        request_from_dict(d)


@pytest.mark.store_free
def test_missing_limit_takes_its_default() -> None:
    d = request_to_dict(RunRequest(code="x", limits=Limits(wall_time_s=3)))
    assert isinstance(d["limits"], dict)
    del d["limits"]["max_pids"]
    assert request_from_dict(d).limits == Limits(wall_time_s=3)


# --- lifecycle --------------------------------------------------------------------------------


def test_submit_list_approve_mark_ran(store: ApprovalStore, tmp_path: Path) -> None:
    req = full_request(tmp_path)
    t = store.submit(req, profile=PROFILE, findings=[FINDING], why="needs approval")
    assert len(t.id) == 12 and int(t.id, 16) >= 0
    assert (t.status, t.request, t.intact) == ("pending", req, True)
    assert t.profile == PROFILE and t.findings == (FINDING,)
    assert t.reason_for_approval == "needs approval" and t.decided_by is None
    assert [x.id for x in store.list()] == [t.id]
    assert store.get(t.id) == t

    approved = store.approve(t.id[:8], by="ana@host", reason="looks fine")
    assert isinstance(approved, ApprovedRun)
    assert approved.request == req  # exactly the submitted run, env and stdin included
    assert approved.ticket.status == "approved"
    assert approved.ticket.decided_by == "ana@host" and approved.ticket.decided_at
    assert store.list() == []
    assert [x.id for x in store.list("approved")] == [t.id]
    assert approval_record(approved.ticket) == {
        "approval_id": t.id,
        "approved_by": "ana@host",
        "approved_at": approved.ticket.decided_at,
        "decision_reason": "looks fine",
        "requested_because": "needs approval",
    }

    ran = store.mark_ran(t.id, "run-123")
    assert (ran.status, ran.run_id, ran.decided_by) == ("ran", "run-123", "ana@host")
    assert approval_record(ran)["approval_id"] == t.id
    json.dumps(ran.to_dict())  # JSON-able as is
    assert ran.to_dict()["request"] == request_to_dict(req)
    with pytest.raises(ApprovalError, match="is ran"):
        store.mark_ran(t.id, "run-456")


def test_get_many_and_reopen(store: ApprovalStore) -> None:
    a, b = submit(store, "print(1)"), submit(store, "print(2)")
    assert store.get_many([a.id, b.id, "0" * 12]) == {a.id: a, b.id: b}
    assert store.get_many([a.id[:8]]) == {}  # exact ids only
    store.approve(a.id, by="ana", reason="fine")
    reopened = store.reopen(a.id)
    assert (reopened.status, reopened.decided_by, reopened.decided_at) == ("pending", None, None)
    assert reopened.decision_reason is None
    with pytest.raises(ApprovalError, match="pending"):
        store.reopen(a.id)  # only an approved ticket goes back
    assert store.approve(a.id, by="bo").ticket.decided_by == "bo"


def test_list_is_newest_first_and_filters(store: ApprovalStore) -> None:
    ids = [submit(store, f"print({i})").id for i in range(4)]
    store.deny(ids[0], by="bo", reason="no")
    assert [t.id for t in store.list(None)] == ids[::-1]
    assert [t.id for t in store.list()] == ids[:0:-1]
    assert [t.id for t in store.list(None, limit=2)] == ids[:1:-1]
    assert [t.id for t in store.list("denied")] == [ids[0]]
    with pytest.raises(ApprovalError, match="unknown status"):
        store.list("waiting")


def test_deny_needs_a_reason_and_is_final(store: ApprovalStore) -> None:
    t = submit(store)
    for reason in ("", "   "):
        with pytest.raises(ApprovalError, match="reason"):
            store.deny(t.id, by="bo", reason=reason)
    denied = store.deny(t.id, by="bo", reason="reads the home directory")
    assert (denied.status, denied.decision_reason, denied.decided_by) == (
        "denied",
        "reads the home directory",
        "bo",
    )
    with pytest.raises(ApprovalError, match=r"is denied by bo at .*only a pending ticket can be"):
        store.approve(t.id, by="ana")
    with pytest.raises(ApprovalError, match="is denied"):
        store.mark_ran(t.id, "run-1")
    with pytest.raises(ApprovalError, match="not approved"):
        approval_record(denied)


def test_approve_twice_and_deny_approved_are_refused(store: ApprovalStore) -> None:
    t = submit(store)
    with pytest.raises(
        ApprovalError, match=r"is pending; only an approved ticket can be marked as ran"
    ):
        store.mark_ran(t.id, "run-1")
    with pytest.raises(ApprovalError, match="approver"):
        store.approve(t.id, by=" ")
    store.approve(t.id, by="ana")
    with pytest.raises(ApprovalError, match="is approved by ana"):
        store.approve(t.id, by="ana")
    with pytest.raises(ApprovalError, match="is approved"):
        store.deny(t.id, by="bo", reason="too late")
    assert store.get(t.id).status == "approved"


def test_submit_validates(store: ApprovalStore) -> None:
    with pytest.raises(ApprovalError, match="must not be empty"):
        store.submit(RunRequest(code="x"), profile=PROFILE, findings=[], why=" ")
    with pytest.raises(ApprovalError, match="JSON"):
        store.submit(RunRequest(code="x"), profile={"x": object()}, findings=[], why="w")
    assert store.list(None) == []
    assert issubclass(ApprovalError, ConfigError)


# --- lookup -----------------------------------------------------------------------------------


def test_prefix_lookup_and_ambiguity(store: ApprovalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = iter(["abcdef000001", "abcdef000002", "abcdff000003"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(ids))
    a, b, c = (submit(store, f"print({i})") for i in range(3))
    assert store.get("abcdef000001") == a
    assert store.get("abcdff") == c
    assert store.get(" ABCDFF0 ") == c  # case and surrounding blanks do not matter
    assert store.get("abcdef000002") == b
    for prefix in ("abcdef", "abcdef0000"):
        with pytest.raises(ApprovalError, match=r"ambiguous.*abcdef000001, abcdef000002"):
            store.get(prefix)
    with pytest.raises(ApprovalError, match="at least 6"):
        store.get("abcdf")  # too short, even though unique
    with pytest.raises(ApprovalError, match="no approval '123456'"):
        store.get("123456")
    with pytest.raises(ApprovalError, match="ambiguous"):
        store.approve("abcdef", by="ana")
    assert store.get("abcdef000001").status == "pending"


# --- integrity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        # The code, under its old hash.
        "UPDATE approvals SET request = replace(request, 'x = 1', 'x = 2')",
        # The code and its code hash, but not the whole-request hash.
        "UPDATE approvals SET request = replace(request, 'x = 1', 'x = 2'), "
        "code_sha256 = '{code_sha}'",
        # Only the environment: the code is unchanged, but it is not the same run.
        'UPDATE approvals SET request = replace(request, \'"MODE":"fast"\', \'"MODE":"slow"\')',
    ],
)
def test_request_changed_after_submission_is_refused(
    store: ApprovalStore, db: Path, statement: str, store_backend: StoreBackend
) -> None:
    t = submit(store, env={"MODE": "fast"})
    code_sha = hashlib.sha256(CODE.replace("x = 1", "x = 2").encode()).hexdigest()
    tamper(store_backend, db, statement.format(code_sha=code_sha))
    changed = store.get(t.id)
    assert changed.request != t.request and not changed.intact
    assert "WARNING" in render_ticket(changed)
    with pytest.raises(
        ApprovalError, match="was changed after it was submitted; refusing to run it"
    ):
        store.approve(t.id, by="ana")
    assert store.get(t.id).status == "pending"  # the refusal changed nothing
    assert store.deny(t.id, by="ana", reason="tampered").status == "denied"


def test_corrupt_row_is_reported(
    store: ApprovalStore, db: Path, store_backend: StoreBackend
) -> None:
    t = submit(store)
    tamper(store_backend, db, "UPDATE approvals SET request = '{not json'")
    with pytest.raises(ApprovalError, match=f"approval {t.id} .* is corrupt"):
        store.get(t.id)


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_concurrent_approvals_exactly_one_wins(db: Path, shared: bool) -> None:
    with ApprovalStore(db) as first:
        tickets = [submit(first, f"print({i})") for i in range(10)]
        stores = [first, first] if shared else [first, ApprovalStore(db)]
        try:
            for t in tickets:
                barrier = threading.Barrier(2)
                results: list[object] = []

                def approve(
                    s: ApprovalStore, t: Ticket = t, b: threading.Barrier = barrier
                ) -> None:
                    b.wait()
                    try:
                        results.append(s.approve(t.id, by=f"thread-{threading.get_ident()}"))
                    except ApprovalError as e:
                        results.append(e)

                threads = [threading.Thread(target=approve, args=(s,)) for s in stores]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(timeout=30)
                wins = [r for r in results if isinstance(r, ApprovedRun)]
                losses = [r for r in results if isinstance(r, ApprovalError)]
                assert len(wins) == 1 and len(losses) == 1, results
                assert "is approved by" in str(losses[0])
                assert first.get(t.id).decided_by == wins[0].ticket.decided_by
        finally:
            stores[1].close()


# --- the file ---------------------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "approvals.sqlite3"
    old = os.umask(0)
    try:
        with ApprovalStore(path) as s:
            t = submit(s)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    with ApprovalStore(path) as s:  # reopening keeps what was stored
        assert s.get(t.id) == t


@pytest.mark.sqlite_only
def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    tamper(StoreBackend("sqlite"), path, "CREATE TABLE t (x)")
    with pytest.raises(ApprovalError, match="not a sandcell approval store"):
        ApprovalStore(path)
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(ApprovalError, match="cannot open approval store"):
        ApprovalStore(garbage)


def test_closed_store_refuses(db: Path) -> None:
    s = ApprovalStore(db)
    s.close()
    s.close()
    with pytest.raises(ApprovalError, match="closed"):
        s.list()


# --- rendering --------------------------------------------------------------------------------


def test_render_ticket_shows_findings_and_numbered_code(store: ApprovalStore) -> None:
    t = submit(store, "x = '\x1b[2J'\ny = '\u202e'\r\n\tz = 1\n", env={"MODE": "fast"})
    text = render_ticket(t)
    for expected in (
        t.id,
        "pending",
        "review (builtin",
        "a high finding needs approval",
        "py.filesystem high 3:7 lists a directory",
        "1 | x = '\\x1b[2J'",
        "2 | y = '\\u202e'\\r",
        "3 | \tz = 1",
        "env       MODE=fast",
    ):
        assert expected in text, (expected, text)
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text
    assert "4 |" not in text  # the final newline adds no empty line
    assert "landlock default" in text
    assert "backend   not recorded" in text
    on_gvisor = store.submit(
        RunRequest(code="print(1)"), profile={**PROFILE, "backend": "gvisor"}, findings=[], why="w"
    )
    assert "backend   gvisor\n" in render_ticket(on_gvisor)


def test_render_list_one_line_each(store: ApprovalStore) -> None:
    a = submit(store)
    b = store.submit(
        RunRequest(code="echo hi", language="bash"),
        profile=PROFILE,
        findings=[{**FINDING, "message": "evil\x1b]0;title\x07\nfake line"}],
        why="always",
    )
    c = store.submit(RunRequest(code="print(1)"), profile=PROFILE, findings=[], why="always")
    store.approve(c.id, by="ana")
    lines = render_list(store.list(None)).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(c.id) and "no findings" in lines[0] and "approved" in lines[0]
    assert (
        lines[1].startswith(b.id) and "bash" in lines[1] and "evil\\x1b]0;title\\x07\\n" in lines[1]
    )
    assert lines[2].startswith(a.id) and "py.filesystem high 3:7" in lines[2]
    assert "pending" in lines[2]
    assert render_list([]) == "no approvals\n"


@pytest.mark.store_free
def test_default_approver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDCELL_APPROVER", "reviewer@example")
    assert default_approver() == "reviewer@example"
    monkeypatch.delenv("SANDCELL_APPROVER")
    user = pwd.getpwuid(os.getuid()).pw_name
    assert default_approver() == f"{user}@{socket.gethostname()}"
