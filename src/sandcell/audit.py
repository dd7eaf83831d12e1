"""The append-only, hash-chained log of every sandboxed run, stored in SQLite.

Every run produces one record (a JSON-able mapping built by the executor). :class:`AuditLog`
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
copy. SQLite and a hash
chain give tamper *evidence* against partial edits only; catching a full rewrite needs an anchor
kept outside the attacker's reach (e.g. periodically publishing ``head.hash`` elsewhere, or
shipping entries to a remote append-only store). Verify also trusts the file's own bytes: it says
nothing about runs that were never appended.

Concurrency: one SQLite connection per :class:`AuditLog`, shared between threads under a lock (so
asyncio executors can call it from worker threads). Each append is one ``BEGIN IMMEDIATE``
transaction, which takes SQLite's write lock before reading the head, so several processes
appending to the same file serialise and the chain stays linear. The database runs in WAL mode
with ``synchronous=NORMAL``: an append does not wait for an fsync, which keeps it well under a
millisecond; a power cut can lose the last few appends but never corrupts the file.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import platformdirs

from sandcell._sqlite import open_private_db, transaction
from sandcell.errors import AuditError

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

GENESIS_HASH = "0" * 64
"""``prev_hash`` of the first entry."""

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

ProblemKind = Literal["changed", "deleted", "reordered"]


def default_audit_path() -> Path:
    """Where the audit log lives unless told otherwise.

    ``$SANDCELL_HOME/audit.sqlite3`` when ``SANDCELL_HOME`` is set and not empty, else
    ``audit.sqlite3`` in the per-user data directory (``~/.local/share/sandcell`` on Linux).
    """
    home = os.environ.get("SANDCELL_HOME")
    if home:
        return Path(home).expanduser() / AUDIT_FILENAME
    return platformdirs.user_data_path("sandcell") / AUDIT_FILENAME


def canonical_json(record: Mapping[str, object]) -> str:
    """The one text form of ``record`` that is stored and hashed.

    Sorted keys and no insignificant whitespace, so equal records give equal text; non-ASCII is
    kept as is (UTF-8) rather than escaped, so what is hashed is what a reader sees.
    """
    # allow_nan=False: NaN and Infinity are not JSON, and other tools must be able to re-verify.
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def chain_hash(seq: int, prev_hash: str, canonical: str) -> str:
    """Hex sha256 of the entry at ``seq`` holding ``canonical``, chained after ``prev_hash``."""
    return hashlib.sha256(f"{seq}\n{prev_hash}\n{canonical}".encode()).hexdigest()


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


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyProblem:
    """One inconsistency :meth:`AuditLog.verify` found."""

    seq: int
    """The entry concerned: the row's current ``seq``, the first missing ``seq`` for ``deleted``,
    or 0 for a problem with the head row itself."""
    run_id: str | None
    """The run concerned, or ``None`` when its row is gone (``deleted``)."""
    kind: ProblemKind
    detail: str
    """One sentence for a human, naming the run(s) and what was found."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """Result of :meth:`AuditLog.verify`."""

    ok: bool
    """True when every entry verifies, the chain is unbroken and the head matches."""
    count: int
    """Entries present in the log."""
    problems: tuple[VerifyProblem, ...]
    """Ordered by ``seq``; empty when ``ok``."""


class AuditLog:
    """An append-only, hash-chained log of run records in one SQLite file.

    Safe to share between threads; several processes may append to the same file, each through
    its own :class:`AuditLog` (a connection must not cross ``fork()``: open a new one in the
    child). Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: Path) -> None:
        """Open the log at ``path``, creating the file, its parent directories and the schema.

        Raises :class:`AuditError` (naming the path and the fix) when the location is not
        writable, or the file is not a SQLite database or not a sandcell audit log.
        """
        self.path = Path(path)
        self._lock = threading.Lock()
        # No implicit transactions: every write below opens its own explicitly.
        self._conn: sqlite3.Connection | None = open_private_db(
            self.path,
            application_id=_APPLICATION_ID,
            schema=_SCHEMA,
            error=AuditError,
            what="audit log",
            advice=_FIX,
            check=self._check_schema,
        )

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; further calls raise :class:`AuditError`. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AuditLog({str(self.path)!r})"

    # --- writing ----------------------------------------------------------------------------

    def append(self, record: Mapping[str, object]) -> AuditEntry:
        """Append ``record`` as the newest entry and return it.

        ``record["run_id"]`` must be a non-empty string not yet in the log. Raises
        :class:`AuditError` when the record cannot be stored (not JSON-able, duplicate run id,
        database error).
        """
        run_id = record.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise AuditError(f"audit record needs a non-empty string run_id, got {run_id!r}")
        try:
            canonical = canonical_json(record)
        except (TypeError, ValueError) as e:
            raise AuditError(f"record of run {run_id} is not JSON-serialisable: {e}") from e
        created_at = datetime.now(UTC).isoformat(timespec="microseconds")
        with self._lock:
            conn = self._connection()
            try:
                # IMMEDIATE takes the write lock before the head is read, so no other process can
                # append between our read of the head and our write of the new one.
                with transaction(conn):
                    head = conn.execute("SELECT count, hash FROM head WHERE id = 1").fetchone()
                    if head is None:
                        raise AuditError(
                            f"audit log {self.path} has lost its head row, so new entries cannot "
                            "be chained; it was edited outside sandcell. Keep it for inspection "
                            f"and {_FIX}"
                        )
                    count, prev_hash = int(head[0]), str(head[1])
                    # The next seq follows the head, not max(seq): if the newest rows were
                    # deleted, the gap stays visible to verify instead of being papered over.
                    seq = count + 1
                    digest = chain_hash(seq, prev_hash, canonical)
                    conn.execute(
                        "INSERT INTO runs (seq, run_id, created_at, record, prev_hash, hash) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (seq, run_id, created_at, canonical, prev_hash, digest),
                    )
                    conn.execute("UPDATE head SET count = ?, hash = ? WHERE id = 1", (seq, digest))
            except sqlite3.IntegrityError as e:
                if "run_id" in str(e):
                    raise AuditError(f"run {run_id} is already in the audit log {self.path}") from e
                raise AuditError(
                    f"audit log {self.path} is inconsistent ({e}); run verify to see what was "
                    "changed outside sandcell"
                ) from e
            except sqlite3.Error as e:
                raise AuditError(f"cannot append run {run_id} to audit log {self.path}: {e}") from e
        return AuditEntry(
            seq=seq,
            run_id=run_id,
            created_at=created_at,
            # Parsed back from the stored text so the entry equals what get() will return
            # (tuples become lists and so on), not the caller's possibly mutable mapping.
            record=json.loads(canonical),
            prev_hash=prev_hash,
            hash=digest,
        )

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
                raise AuditError(f"cannot read audit log {self.path}: {e}") from e
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
                raise AuditError(f"cannot read audit log {self.path}: {e}") from e
        return [self._entry(r) for r in rows]

    def count(self) -> int:
        """Number of entries present in the log."""
        with self._lock:
            conn = self._connection()
            try:
                return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
            except sqlite3.Error as e:
                raise AuditError(f"cannot read audit log {self.path}: {e}") from e

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
                    except sqlite3.OperationalError:
                        heads = []  # the head table itself was dropped
            except sqlite3.Error as e:
                raise AuditError(f"cannot read audit log {self.path}: {e}") from e
        chain = [
            _Row(
                seq=int(r[0]),
                run_id=str(r[1]),
                record=str(r[2]),
                prev_hash=str(r[3]),
                hash=str(r[4]),
            )
            for r in rows
        ]
        head = (int(heads[0][0]), str(heads[0][1])) if len(heads) == 1 else None
        problems = _Verifier(chain, head, head_rows=len(heads)).run()
        return VerifyReport(ok=not problems, count=len(chain), problems=tuple(problems))

    # --- internals --------------------------------------------------------------------------

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """Refuse an existing log this sandcell cannot use (called while it is opened)."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > _SCHEMA_VERSION:
            raise AuditError(
                f"audit log {self.path} has schema version {version}, newer than this sandcell "
                f"understands ({_SCHEMA_VERSION}); upgrade sandcell, or {_FIX}"
            )
        tables = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
        if tables.fetchone() is None:
            raise AuditError(
                f"audit log {self.path} has lost its runs table: it was edited outside sandcell. "
                f"Keep it for inspection and {_FIX}"
            )
        # A missing head table is left for verify to report (append refuses to chain).

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise AuditError(f"audit log {self.path} is closed")
        return self._conn

    def _entry(self, row: Any) -> AuditEntry:
        seq, run_id, created_at, record, prev_hash, digest = row
        try:
            parsed = json.loads(str(record))
        except json.JSONDecodeError as e:
            raise AuditError(
                f"record of run {run_id} (seq {seq}) in {self.path} is not valid JSON: it was "
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


# --- verification -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    seq: int
    run_id: str
    record: str
    prev_hash: str
    hash: str


class _Verifier:
    """Classifies what is wrong with a chain; one instance per :meth:`AuditLog.verify`.

    The approach: first give every row its *original* position. A row whose hash verifies at its
    current ``seq`` is where it was written. A row whose hash does not is either edited
    (``changed``) or intact but moved (``reordered``); which one is decided by finding the
    position its links say it was written at (one after the row its ``prev_hash`` names, one
    before the row that names its hash, or the head's count if the head names it) and checking
    whether its hash verifies there. Since ``seq`` is hashed, only the true original position can
    verify. Then positions nobody holds are ``deleted``, and links between neighbouring positions
    that do not match reveal rewritten hashes (``changed``) or rows re-hashed into another order
    (``reordered``). Every row with any inconsistency gets at least one problem, so an empty
    result means the chain is exactly what sandcell wrote (or a full consistent rewrite).
    """

    def __init__(
        self, rows: builtins.list[_Row], head: tuple[int, str] | None, *, head_rows: int
    ) -> None:
        self.rows = rows
        self.head = head
        self.head_rows = head_rows
        self.by_hash: dict[str, int] = {}
        self.by_prev: dict[str, int] = {}
        for i, r in enumerate(rows):
            # setdefault: duplicated hashes only come from tampering; the first one wins and the
            # duplicate shows up as changed.
            self.by_hash.setdefault(r.hash, i)
            self.by_prev.setdefault(r.prev_hash, i)
        self.position: dict[int, int] = {}  # row index -> original seq
        self.flagged: dict[int, VerifyProblem] = {}  # row index -> its (first) problem
        self.extra: builtins.list[VerifyProblem] = []  # problems about rows that are gone
        self.unplaced: builtins.list[int] = []  # rows whose hash does not verify where they stand

    def run(self) -> builtins.list[VerifyProblem]:
        self._check_rows()
        self._place_moved_rows()
        holder = self._positions()
        self._check_gaps_and_head(holder)
        self._check_links(holder)
        problems = [*self.flagged.values(), *self.extra]
        problems.sort(key=lambda p: (p.seq, p.kind))
        return problems

    # Row by row: does the record parse, match its run_id column, and verify where it stands?
    def _check_rows(self) -> None:
        for i, r in enumerate(self.rows):
            try:
                parsed = json.loads(r.record)
            except json.JSONDecodeError:
                self.position[i] = r.seq
                self._flag(
                    i, "changed", f"run {r.run_id} (seq {r.seq}): the stored record is not JSON"
                )
                continue
            record_run_id = parsed.get("run_id") if isinstance(parsed, dict) else None
            if record_run_id != r.run_id:
                self.position[i] = r.seq
                self._flag(
                    i,
                    "changed",
                    f"run {r.run_id} (seq {r.seq}): the run_id column does not match the record, "
                    f"which names run {record_run_id}",
                )
                continue
            if chain_hash(r.seq, r.prev_hash, r.record) == r.hash:
                self.position[i] = r.seq
            else:
                self.unplaced.append(i)

    def _candidates(self, i: int) -> builtins.list[int]:
        """Original positions the links of row ``i`` point to, from neighbours already placed."""
        r = self.rows[i]
        found: builtins.list[int] = []
        if r.prev_hash == GENESIS_HASH:
            found.append(1)
        else:
            pred = self.by_hash.get(r.prev_hash)
            if pred is not None and pred != i and pred in self.position:
                found.append(self.position[pred] + 1)
        succ = self.by_prev.get(r.hash)
        if succ is not None and succ != i and succ in self.position:
            found.append(self.position[succ] - 1)
        if self.head is not None and self.head[1] == r.hash:
            found.append(self.head[0])
        return found

    # Rows that do not verify where they stand: moved (verify at the position their links give)
    # or changed. Worked through like a flood fill, because a moved row may only be placeable once
    # its neighbour is (e.g. a run of renumbered rows anchored only by the head).
    def _place_moved_rows(self) -> None:
        pending = set(self.unplaced)
        queue = builtins.list(self.unplaced)
        while queue:
            i = queue.pop()
            if i not in pending:
                continue
            candidates = self._candidates(i)
            if not candidates:
                continue  # retried when a neighbour gets placed
            pending.discard(i)
            r = self.rows[i]
            verified = (c for c in candidates if c != r.seq and self._verifies_at(c, r))
            original = next(verified, None)
            if original is None:
                self.position[i] = r.seq
                self._flag(
                    i,
                    "changed",
                    f"run {r.run_id} (seq {r.seq}): the stored record no longer matches its hash; "
                    "it was edited after it was written",
                )
                # A changed row keeps its stored hash, so its neighbours can still be placed by it.
            else:
                self.position[i] = original
                self._flag(
                    i,
                    "reordered",
                    f"run {r.run_id} is stored at seq {r.seq} but was written at seq {original}: "
                    "it was moved or renumbered",
                )
            for neighbour in (self.by_hash.get(r.prev_hash), self.by_prev.get(r.hash)):
                if neighbour is not None and neighbour in pending:
                    queue.append(neighbour)
        for i in sorted(pending):  # no placed neighbour at all: cannot tell moved from edited
            r = self.rows[i]
            self.position[i] = r.seq
            self._flag(
                i,
                "changed",
                f"run {r.run_id} (seq {r.seq}): the stored record no longer matches its hash, and "
                "neither neighbour is intact to tell whether it was moved or edited",
            )

    def _positions(self) -> dict[int, int]:
        """Original seq -> row index; a second row claiming a position is flagged as changed."""
        holder: dict[int, int] = {}
        for i in sorted(self.position, key=lambda j: (j in self.flagged, self.rows[j].seq)):
            pos = self.position[i]
            if pos in holder:
                r, other = self.rows[i], self.rows[holder[pos]]
                self._flag(
                    i,
                    "changed",
                    f"run {r.run_id} (seq {r.seq}) claims position {pos}, which run {other.run_id} "
                    "holds: one of them was forged",
                )
            else:
                holder[pos] = i
        return holder

    # Positions between 1 and the head's count that no row holds were deleted; rows past the head
    # were added outside sandcell; the head must name the hash of the newest row.
    def _check_gaps_and_head(self, holder: dict[int, int]) -> None:
        if self.head is None:
            self.extra.append(
                VerifyProblem(
                    seq=0,
                    run_id=None,
                    kind="deleted",
                    detail=(
                        "the head row is missing"
                        if self.head_rows == 0
                        else f"the head table has {self.head_rows} rows instead of one"
                    )
                    + ", so entries deleted from the end of the log cannot be detected",
                )
            )
        last = max(holder, default=0)
        expected = self.head[0] if self.head is not None else last
        start: int | None = None
        for pos in range(1, max(last, expected) + 2):
            if pos not in holder and pos <= expected:
                if start is None:
                    start = pos
            elif start is not None:
                self.extra.append(self._gap(start, pos - 1, holder))
                start = None
        for pos in sorted(p for p in holder if p < 1):
            r = self.rows[holder[pos]]
            self._flag(
                holder[pos],
                "changed",
                f"run {r.run_id} (seq {r.seq}) sits before the first entry: it was added outside "
                "sandcell",
            )
        if self.head is None:
            return
        count, head_hash = self.head
        for pos in sorted(p for p in holder if p > count):
            i = holder[pos]
            r = self.rows[i]
            self._flag(
                i,
                "changed",
                f"run {r.run_id} (seq {r.seq}) is past the head, which records {count} entries: "
                "it was added outside sandcell",
            )
        if count in holder and self.rows[holder[count]].hash != head_hash:
            r = self.rows[holder[count]]
            self._flag(
                holder[count],
                "changed",
                f"run {r.run_id} (seq {r.seq}) is the newest entry but its hash is not the one the "
                "head recorded: it was rewritten and its hash recomputed",
            )
        if count == 0 and head_hash != GENESIS_HASH:
            self.extra.append(
                VerifyProblem(
                    seq=0,
                    run_id=None,
                    kind="changed",
                    detail="the head of an empty log names a hash",
                )
            )

    def _gap(self, first: int, last: int, holder: dict[int, int]) -> VerifyProblem:
        n = last - first + 1
        what = (
            f"the entry at seq {first} was"
            if n == 1
            else f"the {n} entries at seq {first} to {last} were"
        )
        before = self.rows[holder[first - 1]] if first - 1 in holder else None
        after = self.rows[holder[last + 1]] if last + 1 in holder else None
        if before is not None and after is not None:
            where = (
                f"between run {before.run_id} (seq {first - 1}) and run {after.run_id} "
                f"(seq {last + 1}), which links to a hash no remaining entry has"
            )
        elif after is not None:
            where = f"before run {after.run_id} (seq {last + 1}), the oldest remaining entry"
        elif before is not None:
            where = (
                f"after run {before.run_id} (seq {first - 1}): the head records "
                f"{self.head[0] if self.head else '?'} entries"
            )
        else:
            where = "and no entry around it remains"
        return VerifyProblem(
            seq=first, run_id=None, kind="deleted", detail=f"{what} deleted {where}"
        )

    # Each placed row must link to the hash of the row at the position before it.
    def _check_links(self, holder: dict[int, int]) -> None:
        for pos in sorted(holder):
            i = holder[pos]
            if i in self.flagged:
                continue  # already reported; its link is as suspect as its content
            r = self.rows[i]
            if pos == 1:
                if r.prev_hash != GENESIS_HASH:
                    self._link_problem(i, pos, None)
                continue
            if pos - 1 not in holder:
                continue  # the gap is reported as deleted
            before = holder[pos - 1]
            if r.prev_hash != self.rows[before].hash:
                self._link_problem(i, pos, before)

    def _link_problem(self, i: int, pos: int, before: int | None) -> None:
        r = self.rows[i]
        target = self.by_hash.get(r.prev_hash)
        if r.prev_hash == GENESIS_HASH or (target is not None and target != before):
            after = "the start of the log" if target is None else f"run {self.rows[target].run_id}"
            self._flag(
                i,
                "reordered",
                f"run {r.run_id} (seq {r.seq}) was written after {after}, not after the entry now "
                "before it: entries were moved and re-hashed",
            )
        elif before is None:
            self._flag(
                i,
                "changed",
                f"run {r.run_id} (seq 1) does not link to the start of the log: it was rewritten "
                "and its hash recomputed",
            )
        else:
            # The row before no longer has the hash this one was chained to, and no row has it:
            # the row before was rewritten with a recomputed hash (or this row's link was).
            b = self.rows[before]
            problem = VerifyProblem(
                seq=b.seq,
                run_id=b.run_id,
                kind="changed",
                detail=(
                    f"run {b.run_id} (seq {b.seq}) no longer has the hash that run {r.run_id} "
                    f"(seq {r.seq}) was chained to: one of them was rewritten and its hash "
                    "recomputed"
                ),
            )
            if before in self.flagged:
                return
            self.flagged[before] = problem

    @staticmethod
    def _verifies_at(seq: int, r: _Row) -> bool:
        return chain_hash(seq, r.prev_hash, r.record) == r.hash

    def _flag(self, i: int, kind: ProblemKind, detail: str) -> None:
        if i not in self.flagged:
            r = self.rows[i]
            self.flagged[i] = VerifyProblem(seq=r.seq, run_id=r.run_id, kind=kind, detail=detail)
