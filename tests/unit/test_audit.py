"""Tests of sandcell.audit: the hash-chained SQLite run log, and what verify makes of tampering.

Tampering is done the way an attacker with write access would: raw SQL statements on the
store's own tables (the SQLite file, or the PostgreSQL schema), without recomputing hashes unless
the test says so. Every test runs against both databases (``store_backend``) unless it is about
the SQLite file itself.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import platformdirs
import pytest
from tests.store_backend import StoreBackend

from sandcell.audit import _GROUPS as audit_groups
from sandcell.audit import (
    GENESIS_HASH,
    AuditEntry,
    AuditLog,
    VerifyReport,
    chain_hash,
    default_audit_path,
)
from sandcell.errors import AuditError

pytestmark = pytest.mark.usefixtures("store_backend")

SCHEMA = "sandcell_audit"
"""The audit log's PostgreSQL schema."""
RUN_COLUMNS = "seq, run_id, created_at, record, prev_hash, hash"


def record(n: int, **extra: object) -> dict[str, object]:
    """A record shaped like the executor's (enough fields to be realistic)."""
    return {
        "run_id": f"run-{n:06d}-{hashlib.sha256(str(n).encode()).hexdigest()[:8]}",
        "started_at": "2025-01-01T00:00:00.000000+00:00",
        "code": f"print({n})",
        "code_sha256": hashlib.sha256(f"print({n})".encode()).hexdigest(),
        "language": "python",
        "limits": {"wall_time_s": 30.0, "memory_bytes": 512 * 1024 * 1024},
        "env": ["HOME", "PATH"],
        "outcome": "ok",
        "exit_code": 0,
        "signal": None,
        "stdout": f"{n}\n",
        "artifacts": [],
        **extra,
    }


def run_id(n: int) -> str:
    rid = record(n)["run_id"]
    assert isinstance(rid, str)
    return rid


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.sqlite3"


@pytest.fixture
def log(db: Path) -> Iterator[AuditLog]:
    with AuditLog(db) as audit:
        yield audit


def fill(path: Path, n: int) -> None:
    with AuditLog(path) as audit:
        for i in range(1, n + 1):
            audit.append(record(i))


def tamper(backend: StoreBackend, path: Path, *statements: str) -> None:
    """Edit the log behind sandcell's back, as one transaction."""
    with backend.raw(path, SCHEMA) as conn:
        for statement in statements:
            conn.execute(statement)


def verify(path: Path) -> VerifyReport:
    with AuditLog(path) as audit:
        return audit.verify()


# --- appending and reading ------------------------------------------------------------------


def test_append_chains_from_genesis(log: AuditLog) -> None:
    first = log.append(record(1))
    second = log.append(record(2))
    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS_HASH
    assert second.prev_hash == first.hash
    canonical = json.dumps(record(2), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(f"2\n{first.hash}\n{canonical}".encode()).hexdigest()
    assert second.hash == expected == chain_hash(2, first.hash, canonical)


def test_append_returns_what_get_returns(log: AuditLog) -> None:
    appended = log.append(record(1, shape=(1, 2), text="naïve ☃"))
    fetched = log.get(appended.run_id)
    assert fetched == appended
    assert isinstance(fetched, AuditEntry)
    assert fetched.record["shape"] == [1, 2]  # stored as JSON: a tuple comes back a list
    assert fetched.record["text"] == "naïve ☃"
    assert fetched.created_at.endswith("+00:00")


def test_record_is_stored_as_canonical_utf8_json(
    log: AuditLog, db: Path, store_backend: StoreBackend
) -> None:
    log.append({"run_id": "r-unicode", "b": 1, "a": "é"})
    with store_backend.raw(db, SCHEMA) as conn:
        (text,) = conn.execute("SELECT record FROM runs").fetchone()
    assert text == '{"a":"é","b":1,"run_id":"r-unicode"}'


def test_get_unknown_is_none(log: AuditLog) -> None:
    log.append(record(1))
    assert log.get("no-such-run") is None
    assert log.get("") is None


def test_get_by_unique_prefix(log: AuditLog) -> None:
    log.append({"run_id": "abcdef-111"})
    log.append({"run_id": "abcxyz-222"})
    entry = log.get("abcdef")
    assert entry is not None
    assert entry.run_id == "abcdef-111"
    assert log.get("abcxyz-2") is not None


def test_get_prefix_shorter_than_six_is_not_a_prefix(log: AuditLog) -> None:
    log.append({"run_id": "abcdef-111"})
    assert log.get("abcde") is None


def test_get_ambiguous_prefix_raises(log: AuditLog) -> None:
    log.append({"run_id": "abcdef-111"})
    log.append({"run_id": "abcdef-222"})
    log.append({"run_id": "abcdeg-333"})
    with pytest.raises(AuditError, match="ambiguous") as err:
        log.get("abcdef")
    assert "abcdef-111" in str(err.value)
    assert "abcdef-222" in str(err.value)
    assert "abcdeg-333" not in str(err.value)


def test_exact_id_wins_over_prefix(log: AuditLog) -> None:
    log.append({"run_id": "abcdef"})
    log.append({"run_id": "abcdef-2"})
    entry = log.get("abcdef")
    assert entry is not None
    assert entry.run_id == "abcdef"


def test_list_newest_first_with_paging(log: AuditLog) -> None:
    for i in range(1, 26):
        log.append(record(i))
    assert [e.seq for e in log.list()] == list(range(25, 5, -1))
    assert [e.seq for e in log.list(limit=3, offset=2)] == [23, 22, 21]
    assert [e.seq for e in log.list(limit=10, offset=20)] == [5, 4, 3, 2, 1]
    assert log.list(limit=0) == []
    assert log.count() == 25


def test_list_rejects_negative(log: AuditLog) -> None:
    with pytest.raises(AuditError):
        log.list(limit=-1)


def test_duplicate_run_id_is_refused(log: AuditLog) -> None:
    log.append(record(1))
    with pytest.raises(AuditError, match="already in the audit log"):
        log.append(record(1))
    log.append(record(2))  # the failed append left no transaction open
    assert log.verify().ok


@pytest.mark.parametrize(
    "bad",
    [
        {"code": "x"},
        {"run_id": ""},
        {"run_id": 7},
        {"run_id": "r1", "value": object()},
        {"run_id": "r1", "value": float("nan")},
    ],
)
def test_bad_records_are_refused(log: AuditLog, bad: dict[str, object]) -> None:
    with pytest.raises(AuditError):
        log.append(bad)
    assert log.count() == 0


def test_persists_across_reopen(db: Path) -> None:
    fill(db, 3)
    with AuditLog(db) as audit:
        entry = audit.append(record(4))
        assert entry.seq == 4
        assert audit.verify().ok


def test_closed_log_raises(db: Path) -> None:
    audit = AuditLog(db)
    audit.close()
    audit.close()  # idempotent
    with pytest.raises(AuditError, match="closed"):
        audit.append(record(1))
    with pytest.raises(AuditError, match="closed"):
        audit.get("x")


# --- the file -------------------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_creates_private_parents_and_file(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "audit.sqlite3"
    with AuditLog(path) as audit:
        audit.append(record(1))
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.sqlite_only
def test_file_is_private_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "audit.sqlite3"
        AuditLog(path).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.sqlite_only
def test_uses_wal(log: AuditLog, db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


@pytest.mark.sqlite_only
def test_directory_in_place_of_the_file_is_an_audit_error(db: Path) -> None:
    db.mkdir()
    with pytest.raises(AuditError) as err:
        AuditLog(db)
    assert str(db) in str(err.value)


@pytest.mark.sqlite_only
def test_not_a_database_is_an_audit_error(db: Path) -> None:
    db.write_bytes(b"this is not sqlite at all, just some text " * 100)
    with pytest.raises(AuditError) as err:
        AuditLog(db)
    message = str(err.value)
    assert str(db) in message
    assert "SANDCELL_HOME" in message
    assert "--audit-db" in message


@pytest.mark.sqlite_only
def test_foreign_sqlite_database_is_refused(db: Path) -> None:
    tamper(StoreBackend("sqlite"), db, "CREATE TABLE notes (x TEXT)")
    with pytest.raises(AuditError, match="not a sandcell audit log") as err:
        AuditLog(db)
    assert str(db) in str(err.value)


@pytest.mark.sqlite_only
def test_unwritable_location_is_an_audit_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = blocker / "sub" / "audit.sqlite3"  # a regular file in the way, even for root
    with pytest.raises(AuditError) as err:
        AuditLog(path)
    assert str(path) in str(err.value)
    assert "SANDCELL_HOME" in str(err.value)


@pytest.mark.sqlite_only
def test_default_path_honours_sandcell_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_HOME", str(tmp_path / "home"))
    assert default_audit_path() == tmp_path / "home" / "audit.sqlite3"


@pytest.mark.sqlite_only
def test_default_path_without_sandcell_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDCELL_HOME", raising=False)
    assert default_audit_path() == platformdirs.user_data_path("sandcell") / "audit.sqlite3"
    monkeypatch.setenv("SANDCELL_HOME", "")  # empty counts as unset
    assert default_audit_path() == platformdirs.user_data_path("sandcell") / "audit.sqlite3"


# --- concurrency ----------------------------------------------------------------------------


def _assert_verifies(log: AuditLog, count: int | None = None) -> None:
    """The chain of ``log`` verifies, with ``count`` entries where given."""
    report = log.verify()
    assert report.ok, report.problems
    if count is not None:
        assert report.count == count


def _append_many(path: str, worker: int, count: int, barrier: object) -> None:
    """Child process body: open the shared log and append ``count`` records."""
    assert hasattr(barrier, "wait")
    barrier.wait()  # start both processes together so their appends interleave
    with AuditLog(Path(path)) as audit:
        for i in range(count):
            audit.append({"run_id": f"w{worker}-{i:03d}", "worker": worker, "i": i})


def test_two_processes_append_to_one_file(db: Path) -> None:
    AuditLog(db).close()  # create the schema first, as the first run would
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_append_many, args=(str(db), w, 50, barrier)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    report = verify(db)
    assert report.ok, report.problems
    assert report.count == 100
    with AuditLog(db) as audit:
        entries = audit.list(limit=200)
    assert sorted(e.seq for e in entries) == list(range(1, 101))
    assert {e.run_id for e in entries} == {f"w{w}-{i:03d}" for w in (1, 2) for i in range(50)}


def test_threads_share_one_log(log: AuditLog) -> None:
    def work(worker: int) -> None:
        for i in range(50):
            log.append({"run_id": f"t{worker}-{i}"})

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_verifies(log, 200)


# --- group commits --------------------------------------------------------------------------


class BatchSpy:
    """Watches the transactions the log writes (the real ones run unchanged): the size of each
    batch, and an event set once the first has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.began = threading.Event()
        chain = AuditLog._chain

        def watched(log: AuditLog, conn: Any, batch: Any) -> Any:
            self.sizes.append(len(batch))
            self.began.set()
            return chain(log, conn, batch)

        monkeypatch.setattr(AuditLog, "_chain", watched)


def in_threads(calls: list[Callable[[], object]]) -> list[threading.Thread]:
    """Start one thread per call."""
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    return threads


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def queue_behind_a_blocked_writer(
    store_backend: StoreBackend,
    db: Path,
    logs: list[AuditLog],
    records: list[dict[str, object]],
    spy: BatchSpy,
    *,
    then: tuple[str, ...] = (),
) -> list[AuditEntry | BaseException]:
    """Append ``records[0]`` through ``logs[0]`` while another connection holds the log's write
    lock, so its writer blocks inside its transaction; append the rest (through the logs in
    turn) once they can only queue behind it; run ``then`` in the blocking transaction, end it,
    and return every append's outcome, in ``records``' order."""
    outcomes: list[AuditEntry | BaseException | None] = [None] * len(records)

    def append(i: int) -> Callable[[], None]:
        def call() -> None:
            try:
                outcomes[i] = logs[i % len(logs)].append(records[i])
            except BaseException as e:  # reported by the caller's assertions
                outcomes[i] = e

        return call

    threads: list[threading.Thread] = []
    with store_backend.raw(db, SCHEMA) as conn:
        # A write of the head takes SQLite's write lock and PostgreSQL's lock of the row: the
        # log's writer waits for it in its BEGIN IMMEDIATE (SQLite) or its UPDATE (PostgreSQL).
        conn.execute("UPDATE head SET count = count WHERE id = 1")
        threads += in_threads([append(0)])
        assert spy.began.wait(timeout=60), "the first append never began its transaction"
        threads += in_threads([append(i) for i in range(1, len(records))])
        group = logs[0]._group
        wait_until(lambda: group.waiting() == len(records) - 1, "every other append queued")
        for statement in then:
            conn.execute(statement)
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert all(o is not None for o in outcomes)
    return [o for o in outcomes if o is not None]


def test_appends_waiting_for_a_write_go_out_in_one_transaction(
    db: Path, store_backend: StoreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = BatchSpy(monkeypatch)
    # Two logs on one database (two executors of one process) batch together.
    with AuditLog(db) as first, AuditLog(db) as second:
        records = [record(i) for i in range(1, 9)]
        outcomes = queue_behind_a_blocked_writer(store_backend, db, [first, second], records, spy)
        assert spy.sizes == [1, 7]  # the blocked writer's own, then everything queued behind it
        assert all(isinstance(o, AuditEntry) for o in outcomes), outcomes
        entries = [o for o in outcomes if isinstance(o, AuditEntry)]
        assert entries[0].seq == 1
        assert sorted(e.seq for e in entries) == list(range(1, 9))
        for entry in entries:
            assert first.get(entry.run_id) == entry
        _assert_verifies(second, 8)


def test_a_failed_batch_is_every_callers_error_and_nothing_of_it_is_written(
    db: Path, store_backend: StoreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = BatchSpy(monkeypatch)
    with AuditLog(db) as log:
        log.append(record(0))
        records = [record(i) for i in range(1, 7)]
        # Removed under the blocked writer: its transaction, and the next, cannot chain.
        outcomes = queue_behind_a_blocked_writer(
            store_backend, db, [log], records, spy, then=("DELETE FROM head",)
        )
        assert spy.sizes == [1, 1, 5]
        for outcome in outcomes:
            assert isinstance(outcome, AuditError) and "lost its head row" in str(outcome)
        assert log.count() == 1
        assert log.run_ids() == {run_id(0)}


def test_a_record_refused_in_a_batch_fails_alone(
    db: Path, store_backend: StoreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = BatchSpy(monkeypatch)
    with AuditLog(db) as log:
        log.append(record(3))
        spy.sizes.clear()
        records = [record(1), record(2), record(3), record(4), record(5)]
        outcomes = queue_behind_a_blocked_writer(store_backend, db, [log], records, spy)
        # The batch of four was rolled back, then written one record at a time.
        assert spy.sizes == [1, 4, 1, 1, 1, 1]
        refused = outcomes.pop(2)
        assert isinstance(refused, AuditError) and "already in the audit log" in str(refused)
        assert all(isinstance(o, AuditEntry) for o in outcomes), outcomes
        assert [o.seq for o in outcomes if isinstance(o, AuditEntry)] == [2, 3, 4, 5]
        _assert_verifies(log, 5)


def test_a_caller_interrupted_while_queued_is_withdrawn_and_the_group_goes_on(
    db: Path, store_backend: StoreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("only the main thread receives Ctrl-C (SIGINT)")
    spy = BatchSpy(monkeypatch)
    main = threading.main_thread().ident
    assert main is not None
    later: list[AuditEntry] = []
    with AuditLog(db) as log:
        group = log._group

        def interrupt_once_queued() -> None:
            wait_until(lambda: group.waiting() == 1, "the main thread queued")
            signal.pthread_kill(main, signal.SIGINT)

        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with store_backend.raw(db, SCHEMA) as conn:
                conn.execute("UPDATE head SET count = count WHERE id = 1")  # the writer blocks
                threads = in_threads([lambda: log.append(record(1))])
                assert spy.began.wait(timeout=60), "the first append never began"
                threads += in_threads([interrupt_once_queued])
                with pytest.raises(KeyboardInterrupt):
                    log.append(record(2))
                assert group.waiting() == 0  # withdrawn
                threads += in_threads([lambda: later.append(log.append(record(3)))])
                wait_until(lambda: group.waiting() == 1, "the next append queued")
        finally:
            signal.signal(signal.SIGINT, previous)
        for t in threads:
            t.join(timeout=120)
            assert not t.is_alive()
        assert [e.run_id for e in later] == [run_id(3)]
        assert log.run_ids() == {run_id(1), run_id(3)}
        _assert_verifies(log)


def _append_in_child(path: str, n: int) -> None:
    with AuditLog(Path(path)) as audit:
        audit.append(record(n))


def test_a_forked_child_appends_whatever_the_parents_group_was_doing(db: Path) -> None:
    """Forked while the parent holds its groups' lock (as a thread of it may at any moment),
    the child still opens a log and appends: it starts with groups of its own."""
    with AuditLog(db) as log:
        log.append(record(1))
        ctx = multiprocessing.get_context("fork")
        with audit_groups._mutex:
            child = ctx.Process(target=_append_in_child, args=(str(db), 2))
            child.start()
        child.join(timeout=120)
        assert child.exitcode == 0
        assert log.run_ids() == {run_id(1), run_id(2)}
        _assert_verifies(log)


def test_many_threads_append_through_two_logs(db: Path) -> None:
    threads_n, each = 8, 25
    returned: dict[int, list[AuditEntry]] = {w: [] for w in range(threads_n)}
    with AuditLog(db) as first, AuditLog(db) as second:

        def work(worker: int) -> None:
            log = first if worker % 2 else second
            for i in range(each):
                returned[worker].append(log.append({"run_id": f"t{worker}-{i}", "i": i}))

        for t in in_threads([functools.partial(work, w) for w in range(threads_n)]):
            t.join(timeout=120)
            assert not t.is_alive()
        _assert_verifies(first, threads_n * each)
        for worker, entries in returned.items():
            assert [e.run_id for e in entries] == [f"t{worker}-{i}" for i in range(each)]
            # Each thread's records are in the chain in the order its appends returned.
            seqs = [e.seq for e in entries]
            assert seqs == sorted(seqs)
            for entry in entries:
                assert second.get(entry.run_id) == entry
        everything = [e for entries in returned.values() for e in entries]
        assert sorted(e.seq for e in everything) == list(range(1, threads_n * each + 1))


# --- verify ---------------------------------------------------------------------------------


def test_clean_log_of_100_verifies(db: Path) -> None:
    fill(db, 100)
    report = verify(db)
    assert report == VerifyReport(ok=True, count=100, problems=())


def test_empty_log_verifies(log: AuditLog) -> None:
    assert log.verify() == VerifyReport(ok=True, count=0, problems=())


def test_changed_record_shows_as_changed_at_that_row_only(
    db: Path, store_backend: StoreBackend
) -> None:
    fill(db, 10)
    tamper(
        store_backend,
        db,
        "UPDATE runs SET record = replace(record, '\"exit_code\":0', '\"exit_code\":1') "
        "WHERE seq = 5",
    )
    report = verify(db)
    assert not report.ok
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("changed", 5, run_id(5))]
    assert run_id(5) in report.problems[0].detail


def test_changed_record_with_recomputed_hash_is_caught_by_the_next_link(
    db: Path, store_backend: StoreBackend
) -> None:
    fill(db, 10)
    with store_backend.raw(db, SCHEMA) as conn:
        prev_hash, text = conn.execute(
            "SELECT prev_hash, record FROM runs WHERE seq = 5"
        ).fetchone()
        forged = text.replace('"exit_code":0', '"exit_code":1')
        conn.execute(
            "UPDATE runs SET record = ?, hash = ? WHERE seq = 5",
            (forged, chain_hash(5, prev_hash, forged)),
        )
    report = verify(db)
    assert not report.ok
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("changed", 5, run_id(5))]
    assert "recomputed" in report.problems[0].detail


def test_changed_last_record_with_recomputed_hash_is_caught_by_the_head(
    db: Path, store_backend: StoreBackend
) -> None:
    fill(db, 5)
    with store_backend.raw(db, SCHEMA) as conn:
        prev_hash, text = conn.execute(
            "SELECT prev_hash, record FROM runs WHERE seq = 5"
        ).fetchone()
        forged = text.replace('"exit_code":0', '"exit_code":1')
        conn.execute(
            "UPDATE runs SET record = ?, hash = ? WHERE seq = 5",
            (forged, chain_hash(5, prev_hash, forged)),
        )
    report = verify(db)
    assert [(p.kind, p.seq) for p in report.problems] == [("changed", 5)]


def test_run_id_column_must_match_record(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 5)
    tamper(store_backend, db, "UPDATE runs SET run_id = 'someone-else' WHERE seq = 3")
    report = verify(db)
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("changed", 3, "someone-else")]


def test_deleted_middle_row_shows_as_deleted(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 10)
    tamper(store_backend, db, "DELETE FROM runs WHERE seq = 5")
    report = verify(db)
    assert not report.ok
    assert report.count == 9
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("deleted", 5, None)]
    detail = report.problems[0].detail
    assert run_id(4) in detail  # names the runs around the gap
    assert run_id(6) in detail


def test_deleted_range_is_one_problem(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 10)
    tamper(store_backend, db, "DELETE FROM runs WHERE seq BETWEEN 4 AND 7")
    report = verify(db)
    assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 4)]
    assert "4 entries" in report.problems[0].detail


def test_deleted_first_row_shows_as_deleted(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 10)
    tamper(store_backend, db, "DELETE FROM runs WHERE seq = 1")
    report = verify(db)
    assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 1)]
    assert run_id(2) in report.problems[0].detail


def test_deleted_last_row_shows_via_head(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 10)
    tamper(store_backend, db, "DELETE FROM runs WHERE seq = 10")
    report = verify(db)
    assert not report.ok
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("deleted", 10, None)]
    assert run_id(9) in report.problems[0].detail
    assert "head" in report.problems[0].detail


def test_appending_after_a_deleted_last_row_keeps_the_gap_visible(
    db: Path, store_backend: StoreBackend
) -> None:
    fill(db, 10)
    tamper(store_backend, db, "DELETE FROM runs WHERE seq = 10")
    with AuditLog(db) as audit:
        entry = audit.append(record(11))
        assert entry.seq == 11
        report = audit.verify()
    assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 10)]


def test_deleted_head_row_is_reported_and_append_refuses(
    db: Path, store_backend: StoreBackend
) -> None:
    fill(db, 3)
    tamper(store_backend, db, "DELETE FROM head")
    with AuditLog(db) as audit:
        report = audit.verify()
        assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 0)]
        with pytest.raises(AuditError, match="head"):
            audit.append(record(4))


def test_dropped_head_table_is_reported(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 3)
    tamper(store_backend, db, "DROP TABLE head")
    report = verify(db)
    assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 0)]
    assert report.count == 3


def test_swapped_rows_show_as_reordered(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 10)
    tamper(
        store_backend,
        db,
        "UPDATE runs SET seq = -1 WHERE seq = 3",
        "UPDATE runs SET seq = 3 WHERE seq = 7",
        "UPDATE runs SET seq = 7 WHERE seq = -1",
    )
    report = verify(db)
    assert not report.ok
    assert report.count == 10
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [
        ("reordered", 3, run_id(7)),
        ("reordered", 7, run_id(3)),
    ]
    assert "written at seq 7" in report.problems[0].detail


def test_swapped_neighbours_show_as_reordered(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 10)
    tamper(
        store_backend,
        db,
        "UPDATE runs SET seq = -1 WHERE seq = 4",
        "UPDATE runs SET seq = 4 WHERE seq = 5",
        "UPDATE runs SET seq = 5 WHERE seq = -1",
    )
    report = verify(db)
    assert [(p.kind, p.seq) for p in report.problems] == [("reordered", 4), ("reordered", 5)]


def test_swapped_and_rehashed_rows_show_as_reordered(db: Path, store_backend: StoreBackend) -> None:
    """Moved rows whose hashes were recomputed for their new seq: the links still tell."""
    fill(db, 10)
    with store_backend.raw(db, SCHEMA) as conn:
        conn.execute("UPDATE runs SET seq = -1 WHERE seq = 3")
        conn.execute("UPDATE runs SET seq = 3 WHERE seq = 7")
        conn.execute("UPDATE runs SET seq = 7 WHERE seq = -1")
        for seq in (3, 7):
            prev_hash, text = conn.execute(
                "SELECT prev_hash, record FROM runs WHERE seq = ?", (seq,)
            ).fetchone()
            conn.execute(
                "UPDATE runs SET hash = ? WHERE seq = ?",
                (chain_hash(seq, prev_hash, text), seq),
            )
    report = verify(db)
    assert not report.ok
    assert "reordered" in {p.kind for p in report.problems}


def test_delete_then_renumber_shows_deletion_and_moves(
    db: Path, store_backend: StoreBackend
) -> None:
    fill(db, 8)
    tamper(
        store_backend,
        db,
        "DELETE FROM runs WHERE seq = 4",
        "UPDATE runs SET seq = seq - 1 WHERE seq > 4",
    )
    report = verify(db)
    kinds = [(p.kind, p.seq) for p in report.problems]
    assert ("deleted", 4) in kinds
    assert {k for k, _ in kinds} == {"deleted", "reordered"}


def test_forged_row_before_the_first_is_changed(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 3)
    forged = json.dumps({"run_id": "forged"}, sort_keys=True, separators=(",", ":"))
    tamper(
        store_backend,
        db,
        "INSERT INTO runs (seq, run_id, created_at, record, prev_hash, hash) VALUES "
        f"(0, 'forged', '', '{forged}', '{GENESIS_HASH}', '{chain_hash(0, GENESIS_HASH, forged)}')",
    )
    report = verify(db)
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("changed", 0, "forged")]


def test_forged_row_past_the_head_is_changed(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 3)
    with AuditLog(db) as audit:
        last = audit.list(limit=1)[0]
    forged = json.dumps({"run_id": "forged"}, sort_keys=True, separators=(",", ":"))
    tamper(
        store_backend,
        db,
        "INSERT INTO runs (seq, run_id, created_at, record, prev_hash, hash) VALUES "
        f"(4, 'forged', '', '{forged}', '{last.hash}', '{chain_hash(4, last.hash, forged)}')",
    )
    report = verify(db)
    assert [(p.kind, p.seq, p.run_id) for p in report.problems] == [("changed", 4, "forged")]
    assert "head" in report.problems[0].detail


def test_invalid_json_is_changed_and_get_raises(db: Path, store_backend: StoreBackend) -> None:
    fill(db, 3)
    tamper(store_backend, db, "UPDATE runs SET record = '{not json' WHERE seq = 2")
    with AuditLog(db) as audit:
        report = audit.verify()
        assert [(p.kind, p.seq) for p in report.problems] == [("changed", 2)]
        with pytest.raises(AuditError, match="not valid JSON"):
            audit.get(run_id(2))


def test_random_tampering_never_verifies(db: Path, store_backend: StoreBackend) -> None:
    """Whatever partial edit is made, verify reports something and does not crash."""
    fill(db, 30)
    with store_backend.raw(db, SCHEMA) as conn:
        runs = conn.execute(f"SELECT {RUN_COLUMNS} FROM runs").fetchall()
        head = conn.execute("SELECT id, count, hash FROM head").fetchall()
    rng = random.Random(1234)
    edits = [
        "UPDATE runs SET record = replace(record, 'print', 'PRINT') WHERE seq = {a}",
        "UPDATE runs SET prev_hash = '{h}' WHERE seq = {a}",
        "UPDATE runs SET hash = '{h}' WHERE seq = {a}",
        "DELETE FROM runs WHERE seq = {a}",
        "UPDATE runs SET seq = 1000 + seq WHERE seq = {a}",
        "UPDATE head SET count = count + 1",
        "UPDATE head SET hash = '{h}'",
    ]
    for _ in range(60):
        chosen = rng.sample(edits, rng.randint(1, 3))
        statements = [
            e.format(a=rng.randint(1, 30), h=hashlib.sha256(os.urandom(8)).hexdigest())
            for e in chosen
        ]
        with store_backend.raw(db, SCHEMA) as conn:
            # Back to the pristine log, then this round's edits: one transaction.
            conn.execute("DELETE FROM runs")
            conn.execute("DELETE FROM head")
            for row in runs:
                conn.execute(f"INSERT INTO runs ({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", row)
            for row in head:
                conn.execute("INSERT INTO head (id, count, hash) VALUES (?, ?, ?)", row)
            for statement in statements:
                conn.execute(statement)
        report = verify(db)
        assert not report.ok, statements
        assert all(p.kind in {"changed", "deleted", "reordered"} for p in report.problems)
        assert all(p.detail for p in report.problems)
