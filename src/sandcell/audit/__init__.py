"""The append-only, hash-chained log of every sandboxed run, stored in SQLite.

Every run produces one record (a JSON-able mapping, :mod:`sandcell.audit.record`). :class:`AuditLog`
stores it as one row of the ``runs`` table and chains it to the row before::

    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    hash      = sha256(f"{seq}\\n{prev_hash}\\n{canonical}")      # hex digest
    prev_hash = hash of the row with seq - 1, or 64 zeros for seq 1

A one-row ``head`` table holds the number of entries and the hash of the newest one; it is
updated in the same transaction as the insert, so the log and its head never disagree unless
someone edits the file by hand.

What is chained: the position (``seq``), the link to the previous entry (``prev_hash``) and the
canonical record text, which carries the run id, code, hashes of inputs and outputs, outcome and
everything else the executor put in it. Not chained: ``created_at`` (the time of the append, kept
as a plain column for listing; the record's own ``started_at`` is chained) and the ``run_id``
column (an index; :meth:`AuditLog.verify` checks it equals the record's ``run_id``).

What :meth:`AuditLog.verify` detects, for someone who edits the database behind sandcell's back:

* ``changed``: a record edited in place (its hash no longer matches), a record whose hash was
  recomputed to match (the next entry still links to the old hash, or the head does), a
  ``run_id`` column that disagrees with its record, rows added past the head;
* ``deleted``: rows removed from the start, the middle or the end (a gap in ``seq``, a link to a
  hash no row has, or a head that counts more entries than remain);
* ``reordered``: rows moved to other ``seq`` numbers (each row's hash only verifies at the
  position it was written at, and its link names the entry it was written after).

What it cannot detect: someone with write access to the file who rewrites the whole chain
consistently (recomputes every hash after the point they changed, and the head) produces a log
that verifies; so does appending forged entries at the end with the head updated (the chain
proves order and integrity, not authorship), deleting the file, or replacing it with an older
copy. SQLite and a hash chain give tamper *evidence* against partial edits only; catching a full
rewrite needs an anchor kept outside the attacker's reach (e.g. periodically publishing
``head.hash`` elsewhere, or shipping entries to a remote append-only store). Verify also trusts
the file's own bytes: it says nothing about runs that were never appended.

Concurrency: one SQLite connection per :class:`AuditLog`, shared between threads under a lock (so
asyncio executors can call it from worker threads). Appends are written in group commits
(:mod:`sandcell.audit.group`): the threads of one process appending to one database (through one
log, or several opened on it) that arrive while a write is in flight queue, and the next write
chains all of them, in their order, in one transaction; each append returns once its own record
is committed, a lone append is written at once, and an error that fails the transaction is every
queued caller's (nothing of it is written). Each transaction is one ``BEGIN IMMEDIATE``, which
takes SQLite's write lock before reading the head, so several processes appending to the same
file serialise and the chain stays linear. The database runs in WAL mode
with ``synchronous=NORMAL``: an append does not wait for an fsync, which keeps it well under a
millisecond; a power cut can lose the last few appends but never corrupts the file.

The parts: :mod:`sandcell.audit.chain` holds the text form and the hash, and
:mod:`sandcell.audit.verify` what verify makes of a chain; this module stores, finds and lists
the entries.
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import platformdirs

from sandcell._sqlite import PrivateStore, StoreConnection, transaction
from sandcell.audit.chain import GENESIS_HASH, canonical_json, chain_hash
from sandcell.audit.group import SharedGroups
from sandcell.audit.verify import ProblemKind, VerifyProblem, VerifyReport, verify_rows
from sandcell.db.postgres import DatabaseUnavailable, PgConnection, PgDatabaseError
from sandcell.errors import AuditError, SandcellError, StoreUnavailable

__all__ = [
    "GENESIS_HASH",
    "AuditEntry",
    "AuditLog",
    "ProblemKind",
    "VerifyProblem",
    "VerifyReport",
    "canonical_json",
    "chain_hash",
    "default_audit_path",
]

AUDIT_FILENAME = "audit.sqlite3"

MIN_PREFIX = 6
"""Shortest run id prefix :meth:`AuditLog.get` accepts in place of a full id."""

# Written into the SQLite header so a foreign database is recognised and never written to.
_APPLICATION_ID = int.from_bytes(b"sndc", "big")
_SCHEMA_VERSION = 1
_FIX = "set SANDCELL_HOME or --audit-db to a writable location"

# Statements creating a new log, run in one transaction (which also sets the application id).
_SCHEMA = (
    """
    CREATE TABLE runs (
        seq        INTEGER PRIMARY KEY,
        run_id     TEXT UNIQUE NOT NULL,
        created_at TEXT,
        record     TEXT NOT NULL,
        prev_hash  TEXT NOT NULL,
        hash       TEXT NOT NULL
    )
    """,
    # The CHECK keeps the head at exactly one row.
    """
    CREATE TABLE head (
        id    INTEGER PRIMARY KEY CHECK (id = 1),
        count INTEGER NOT NULL,
        hash  TEXT NOT NULL
    )
    """,
    # Constants of this module only (GENESIS_HASH is 64 zeros); PRAGMAs take no bound parameters.
    f"INSERT INTO head (id, count, hash) VALUES (1, 0, '{GENESIS_HASH}')",  # noqa: S608
    f"PRAGMA user_version = {_SCHEMA_VERSION:d}",
)


RECORD_WAIT_ENV = "SANDCELL_RECORD_WAIT_S"
_RECORD_WAIT_S = 300.0


def _record_wait_s() -> float:
    """How long an append waits for an unreachable shared database before it gives up:
    ``$SANDCELL_RECORD_WAIT_S``, else five minutes."""
    try:
        return max(0.0, float(os.environ.get(RECORD_WAIT_ENV, _RECORD_WAIT_S)))
    except ValueError:
        return _RECORD_WAIT_S


def default_audit_path() -> Path:
    """Where the audit log lives unless told otherwise.

    ``$SANDCELL_HOME/audit.sqlite3`` when ``SANDCELL_HOME`` is set and not empty, else
    ``audit.sqlite3`` in the per-user data directory (``~/.local/share/sandcell`` on Linux).
    """
    home = os.environ.get("SANDCELL_HOME")
    if home:
        return Path(home).expanduser() / AUDIT_FILENAME
    return platformdirs.user_data_path("sandcell") / AUDIT_FILENAME


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One stored run record and its place in the chain."""

    seq: int
    """Position in the log, from 1."""
    run_id: str
    created_at: str
    """When the entry was appended (ISO 8601, UTC). Not covered by the hash."""
    record: Mapping[str, object]
    """The record as stored (parsed back from its canonical JSON)."""
    prev_hash: str
    hash: str


class AuditLog(PrivateStore):
    """An append-only, hash-chained log of run records in one SQLite file.

    Safe to share between threads; several processes may append to the same file, each through
    its own :class:`AuditLog` (a connection must not cross ``fork()``: open a new one in the
    child). Use as a context manager, or call :meth:`close` (after which every call raises
    :class:`AuditError`).
    """

    _error = AuditError
    _what = "audit log"
    _pg_schema = "sandcell_audit"

    def __init__(self, path: Path) -> None:
        """Open the log at ``path``, creating the file, its parent directories and the schema.

        Raises :class:`AuditError` (naming the path and the fix) when the location is not
        writable, or the file is not a SQLite database or not a sandcell audit log.
        """
        super().__init__(
            path,
            application_id=_APPLICATION_ID,
            schema=_SCHEMA,
            advice=_FIX,
            check=self._check_schema,
        )

        # SQLite's file by its real path, so logs opened by other names of it batch together.
        key = self.where if isinstance(self._conn, PgConnection) else os.path.realpath(self.path)
        self._group = _GROUPS.get(key)

    def __repr__(self) -> str:
        return f"AuditLog({str(self.path)!r})"

    # --- writing ----------------------------------------------------------------------------

    def append(self, record: Mapping[str, object]) -> AuditEntry:
        """Append ``record`` as the newest entry and return it, once it is committed.

        ``record["run_id"]`` must be a non-empty string not yet in the log. Raises
        :class:`AuditError` when the record cannot be stored (not JSON-able, duplicate run id,
        database error). Appends made meanwhile by other threads of this process, through this
        log or another opened on the same database, may share its transaction (see the module).
        """
        run_id = record.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise AuditError(f"audit record needs a non-empty string run_id, got {run_id!r}")
        try:
            canonical = canonical_json(record)
        except (TypeError, ValueError) as e:
            raise AuditError(f"record of run {run_id} is not JSON-serialisable: {e}") from e
        if self._conn is None:
            # Checked here, not only by the leader: a closed log must not fail others' batch.
            raise AuditError(f"audit log {self.where} is closed")
        # While the shared database is unreachable the run's answer waits for its record:
        # a run is never answered without one (on SQLite this never loops).
        deadline: float | None = None  # read from the environment on the first failure only
        pause = 0.05
        retried = False
        while True:
            created_at = datetime.now(UTC).isoformat(timespec="microseconds")
            try:
                placed = self._group.submit(
                    _Pending(run_id, canonical, created_at, retried=retried), self._write
                )
                break
            except StoreUnavailable:
                if deadline is None:
                    deadline = time.monotonic() + _record_wait_s()
                if time.monotonic() + pause > deadline:
                    raise
            retried = True
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
        return AuditEntry(
            seq=placed.seq,
            run_id=run_id,
            created_at=placed.created_at,
            # Parsed back from the stored text so the entry equals what get() will return
            # (tuples become lists and so on), not the caller's possibly mutable mapping; here,
            # outside every lock, rather than by the writer of the batch.
            record=json.loads(canonical),
            prev_hash=placed.prev_hash,
            hash=placed.hash,
        )

    def _write(self, batch: Sequence[_Pending]) -> builtins.list[_Placed | BaseException]:
        """Write ``batch`` in one transaction, chained in its order (the group's writer).

        Raises what fails the whole batch (nothing of it is then written). A record refused for
        itself (its run id is already stored) rolls back the batch, which is then written one
        record at a time, so only that record's caller gets the refusal.
        """
        with self._lock:
            conn = self._connection()
            try:
                return builtins.list(self._chain(conn, batch))
            except sqlite3.IntegrityError as e:
                if len(batch) == 1:
                    return [self._refused(conn, batch[0], e)]
            except sqlite3.Error as e:
                which = batch[0].run_id if len(batch) == 1 else f"{len(batch)} runs"
                raise self._failed(
                    e, f"cannot append {which} to audit log {self.where}: {e}"
                ) from e
            return [self._write_alone(conn, pending) for pending in batch]

    def _write_alone(self, conn: StoreConnection, pending: _Pending) -> _Placed | BaseException:
        """One record in a transaction of its own; what fails is that record's outcome only
        (the records before it may be committed already)."""
        try:
            return self._chain(conn, [pending])[0]
        except sqlite3.IntegrityError as e:
            return self._refused(conn, pending, e)
        except sqlite3.Error as e:
            return self._failed(
                e, f"cannot append run {pending.run_id} to audit log {self.where}: {e}"
            )
        except AuditError as e:
            return e

    def _chain(self, conn: StoreConnection, batch: Sequence[_Pending]) -> builtins.list[_Placed]:
        """Insert ``batch`` after the head and move the head, in one transaction."""
        placed: builtins.list[_Placed] = []
        # IMMEDIATE takes the write lock before the head is read, so no other process can
        # append between our read of the head and our write of the new one.
        with transaction(conn):
            head = conn.execute("SELECT count, hash FROM head WHERE id = 1").fetchone()
            if head is None:
                raise AuditError(_lost_head(self.where))
            # The next seq follows the head, not max(seq): if the newest rows were deleted,
            # the gap stays visible to verify instead of being papered over.
            seq, prev_hash = int(head[0]), str(head[1])
            rows = []
            for pending in batch:
                seq += 1
                digest = chain_hash(seq, prev_hash, pending.canonical)
                rows.append(
                    (seq, pending.run_id, pending.created_at, pending.canonical, prev_hash, digest)
                )
                placed.append(_Placed(seq, pending.created_at, prev_hash, digest))
                prev_hash = digest
            conn.executemany(
                "INSERT INTO runs (seq, run_id, created_at, record, prev_hash, hash) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            moved = conn.execute(
                "UPDATE head SET count = ?, hash = ? WHERE id = 1", (seq, prev_hash)
            )
            if moved.rowcount != 1:
                # Deleted behind our back after we read it (PostgreSQL re-reads the row for the
                # update): entries past a head that is gone would be chained to nothing.
                raise AuditError(_lost_head(self.where))
        return placed

    def _refused(
        self, conn: StoreConnection, pending: _Pending, error: sqlite3.IntegrityError
    ) -> _Placed | SandcellError:
        """What a record the database refused (its transaction rolled back) comes to: a retry
        (an earlier try lost its connection, perhaps after its commit went through) that finds
        the very same record has that commit; anything else is an error."""
        if "run_id" not in str(error):
            return AuditError(
                f"audit log {self.where} is inconsistent ({error}); run verify to see what was "
                "changed outside sandcell"
            )
        try:
            stored = conn.execute(_SELECT + " WHERE run_id = ?", (pending.run_id,)).fetchone()
        except sqlite3.Error as e:
            return self._failed(e, f"cannot read audit log {self.where}: {e}")
        if pending.retried and stored is not None and str(stored[3]) == pending.canonical:
            return _Placed(int(stored[0]), str(stored[2]), str(stored[4]), str(stored[5]))
        return AuditError(f"run {pending.run_id} is already in the audit log {self.where}")

    # --- reading ----------------------------------------------------------------------------

    def get(self, run_id: str) -> AuditEntry | None:
        """The entry of ``run_id``, or ``None`` if there is none.

        A prefix of at least :data:`MIN_PREFIX` characters is accepted in place of the full id
        when it matches exactly one run; an ambiguous prefix raises :class:`AuditError`.
        """
        with self._lock:
            conn = self._connection()
            try:
                row = conn.execute(_SELECT + " WHERE run_id = ?", (run_id,)).fetchone()
                if row is None and len(run_id) >= MIN_PREFIX:
                    # run_id has a unique index and TEXT compares bytewise, so every id starting
                    # with the prefix sorts right after it: an index range scan finds them.
                    rows = conn.execute(
                        _SELECT + " WHERE run_id >= ? ORDER BY run_id LIMIT 6", (run_id,)
                    ).fetchall()
                    matches = [r for r in rows if str(r[1]).startswith(run_id)]
                    if len(matches) > 1:
                        shown = ", ".join(str(r[1]) for r in matches[:5])
                        more = " and more" if len(matches) > 5 else ""
                        raise AuditError(
                            f"run id prefix {run_id!r} is ambiguous: it matches {shown}{more}; "
                            "give more characters"
                        )
                    row = matches[0] if matches else None
            except sqlite3.Error as e:
                raise self._failed(e, f"cannot read audit log {self.where}: {e}") from e
        return None if row is None else self._entry(row)

    def list(self, limit: int = 20, offset: int = 0) -> builtins.list[AuditEntry]:
        """Up to ``limit`` entries, newest first, skipping the ``offset`` newest."""
        if limit < 0 or offset < 0:
            raise AuditError(f"limit and offset must not be negative, got {limit} and {offset}")
        with self._lock:
            conn = self._connection()
            try:
                rows = conn.execute(
                    _SELECT + " ORDER BY seq DESC LIMIT ? OFFSET ?", (limit, offset)
                ).fetchall()
            except sqlite3.Error as e:
                raise self._failed(e, f"cannot read audit log {self.where}: {e}") from e
        return [self._entry(r) for r in rows]

    def count(self) -> int:
        """Number of entries present in the log."""
        with self._lock:
            conn = self._connection()
            try:
                return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
            except sqlite3.Error as e:
                raise self._failed(e, f"cannot read audit log {self.where}: {e}") from e

    def run_ids(self) -> set[str]:
        """The run id of every entry present (one snapshot)."""
        with self._lock:
            conn = self._connection()
            try:
                rows = conn.execute("SELECT run_id FROM runs").fetchall()
            except sqlite3.Error as e:
                raise self._failed(e, f"cannot read audit log {self.where}: {e}") from e
        return {str(row[0]) for row in rows}

    # --- verification -----------------------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Re-check every entry and link, and the head; report what does not match.

        Reads the whole log (one snapshot, so concurrent appends do not show up as problems).
        See the module docstring for what can and cannot be detected.
        """
        with self._lock:
            conn = self._connection()
            try:
                # A read transaction gives runs and head from the same snapshot.
                with transaction(conn, write=False):
                    rows = conn.execute(
                        "SELECT seq, run_id, record, prev_hash, hash FROM runs ORDER BY seq"
                    ).fetchall()
                    try:
                        heads = conn.execute("SELECT count, hash FROM head").fetchall()
                    except (sqlite3.OperationalError, PgDatabaseError) as e:
                        # A lost connection is no evidence of tampering: the call fails.
                        if isinstance(e, DatabaseUnavailable):
                            raise
                        # The head table itself was dropped. (PostgreSQL has aborted the
                        # transaction, and its COMMIT rolls back: it had only read.)
                        heads = []
            except sqlite3.Error as e:
                raise self._failed(e, f"cannot read audit log {self.where}: {e}") from e
        return verify_rows(rows, heads)

    # --- internals --------------------------------------------------------------------------

    def _check_schema(self, conn: StoreConnection) -> None:
        """Refuse an existing log this sandcell cannot use (called while it is opened)."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > _SCHEMA_VERSION:
            raise AuditError(
                f"audit log {self.where} has schema version {version}, newer than this sandcell "
                f"understands ({_SCHEMA_VERSION}); upgrade sandcell, or {_FIX}"
            )
        tables = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
        if tables.fetchone() is None:
            raise AuditError(
                f"audit log {self.where} has lost its runs table: it was edited outside sandcell. "
                f"Keep it for inspection and {_FIX}"
            )
        # A missing head table is left for verify to report (append refuses to chain).

    def _entry(self, row: Any) -> AuditEntry:
        seq, run_id, created_at, record, prev_hash, digest = row
        try:
            parsed = json.loads(str(record))
        except json.JSONDecodeError as e:
            raise AuditError(
                f"record of run {run_id} (seq {seq}) in {self.where} is not valid JSON: it was "
                "edited outside sandcell; run verify"
            ) from e
        return AuditEntry(
            seq=int(seq),
            run_id=str(run_id),
            created_at="" if created_at is None else str(created_at),
            record=parsed,
            prev_hash=str(prev_hash),
            hash=str(digest),
        )


_SELECT = "SELECT seq, run_id, created_at, record, prev_hash, hash FROM runs"


def _lost_head(where: str) -> str:
    return (
        f"audit log {where} has lost its head row, so new entries cannot be chained; it was "
        f"edited outside sandcell. Keep it for inspection and {_FIX}"
    )


@dataclass(frozen=True, slots=True)
class _Pending:
    """A record waiting to be appended: its text and when it was handed in."""

    run_id: str
    canonical: str
    created_at: str
    retried: bool
    """An earlier try of this append lost its connection, perhaps after its commit."""


@dataclass(frozen=True, slots=True)
class _Placed:
    """Where a record was committed in the chain."""

    seq: int
    created_at: str
    prev_hash: str
    hash: str


_GROUPS: SharedGroups[_Pending, _Placed] = SharedGroups()
"""The group commit of each audit database this process appends to."""
