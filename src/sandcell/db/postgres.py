"""A store's connection to PostgreSQL, speaking the part of sqlite3's interface the stores use.

Every store (:class:`sandcell._sqlite.PrivateStore`) writes its SQL once, in the dialect both
databases accept, and runs it on a connection with sqlite3's shape: ``execute`` returning a
cursor with ``fetchone``/``fetchall``/``rowcount``, ``executemany``, ``in_transaction``, and
explicit ``BEGIN``/``BEGIN IMMEDIATE``/``COMMIT``/``ROLLBACK``. :class:`PgConnection` gives a
PostgreSQL connection that shape, so no store has two code paths:

* placeholders: ``?`` becomes ``%s`` (and a literal ``%`` becomes ``%%``); ``INSERT OR IGNORE``
  becomes ``INSERT ... ON CONFLICT DO NOTHING``;
* ``BEGIN IMMEDIATE`` (SQLite's "take the write lock before reading") becomes ``BEGIN`` plus a
  transaction-scoped advisory lock named for the store, so the writers of one store, in every
  replica and on every node, take turns exactly as SQLite's writers do: the audit log's hash
  chain stays one chain under concurrent appends; a plain ``BEGIN`` reads one snapshot
  (REPEATABLE READ);
* errors: PostgreSQL's integrity errors are raised as :class:`sqlite3.IntegrityError`
  subclasses and its other errors as :class:`sqlite3.DatabaseError` ones (each also a
  :class:`~sandcell.errors.SandcellError`), so a store's handlers serve both; a lost or
  refused connection is :class:`DatabaseUnavailable` (an ``OperationalError``), and the next
  call connects again;
* ``numeric`` values (PostgreSQL's ``sum`` of a ``bigint``) come back as ``int``, as SQLite's do.

The store's tables live in a PostgreSQL schema of its own (``search_path`` is set on connect),
with the same table names as its SQLite file; :mod:`sandcell.db.migrate` creates and upgrades
them.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.db.url import redacted
from sandcell.errors import SandcellError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DatabaseUnavailable",
    "PgConnection",
    "PgDatabaseError",
    "PgIntegrityError",
    "translate",
]

CONNECT_TIMEOUT_S = 10
"""How long a connection attempt may take before the database counts as unreachable."""


class DatabaseUnavailable(sqlite3.OperationalError, SandcellError):
    """PostgreSQL cannot be reached (refused, restarting, the connection dropped): nothing of the
    statement that raised it was committed unless the loss came after the COMMIT was sent."""


class PgIntegrityError(sqlite3.IntegrityError, SandcellError):
    """A constraint PostgreSQL enforced (unique key, check, not null)."""


class PgDatabaseError(sqlite3.DatabaseError, SandcellError):
    """Any other error PostgreSQL answered with."""


_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO\b", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def translate(sql: str, *, bound: bool = True) -> str:
    """The PostgreSQL form of one statement written for both databases (see the module);
    ``bound``: it is sent with parameters (only then does psycopg read ``%`` as special)."""
    out = sql.replace("%", "%%").replace("?", "%s") if bound else sql
    if _IGNORE.match(out):
        out = (
            _IGNORE.sub("INSERT INTO", out, count=1).rstrip().rstrip(";")
            + " ON CONFLICT DO NOTHING"
        )
    return out


def _lock_key(schema: str) -> int:
    """The advisory lock of one store's writers: a signed 64-bit number from its schema name."""
    return int.from_bytes(
        hashlib.sha256(f"sandcell:{schema}".encode()).digest()[:8], "big", signed=True
    )


class _Cursor:
    """What ``execute`` returns: the rows of one statement, read eagerly."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self) -> Any:
        return iter(self.fetchall())


class PgConnection:
    """One store's connection to PostgreSQL (see the module). Not thread-safe: the store
    serialises its use under its own lock, as it does for SQLite."""

    def __init__(self, url: str, *, schema: str) -> None:
        """Connect to ``url`` with ``schema`` as the search path. Raises DatabaseUnavailable
        when the database cannot be reached."""
        self.url = url
        self.schema = schema
        self.where = f"{redacted(url)} (schema {schema})"
        self._lock_key = _lock_key(schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._connect()

    # --- the connection ------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        if self._closed:
            raise PgDatabaseError(f"the connection to {self.where} is closed")
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,  # transactions are explicit, as with isolation_level=None
                connect_timeout=CONNECT_TIMEOUT_S,
                options=f"-c search_path={self.schema}",
                application_name="sandcell",
            )
        except psycopg.Error as e:
            raise DatabaseUnavailable(f"cannot connect to {self.where}: {_said(e)}") from e
        _load_numeric_as_number(conn)
        self._conn = conn
        return conn

    def close(self) -> None:
        """Close the connection; later calls raise. Idempotent."""
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        conn = self._conn
        if conn is None or conn.closed:
            return False
        return conn.info.transaction_status != TransactionStatus.IDLE

    # --- statements ------------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[object] = ()) -> _Cursor:
        """Run one statement (sqlite3's dialect, see the module) and read its rows."""
        verb = sql.strip().upper()
        if verb == "ROLLBACK" and not self.in_transaction:
            return _Cursor([], -1)  # the transaction died with its connection
        if verb == "BEGIN IMMEDIATE":
            # One round trip, not two: without parameters both go in one simple query, and the
            # key is this module's own integer.
            return self._first(f"BEGIN; SELECT pg_advisory_xact_lock({self._lock_key:d})", ())
        if verb == "BEGIN":
            return self._first("BEGIN ISOLATION LEVEL REPEATABLE READ", ())
        statement = translate(sql, bound=bool(params))
        if verb.startswith("SELECT") and not self.in_transaction:
            return self._first(statement, params)
        return self._run(statement, params)

    def _first(self, sql: str, params: Sequence[object]) -> _Cursor:
        """A statement that changes nothing by itself (a transaction's BEGIN, a read on its
        own): when the connection it found was dropped while idle (the server restarted since
        its last use), it is sent again once on a new connection, so each store does not fail
        one request after every restart of the database."""
        stale = self._conn is not None
        try:
            return self._run(sql, params)
        except DatabaseUnavailable:
            if not stale or self._closed:
                raise
            return self._run(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> _Cursor:
        import psycopg

        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.executemany(translate(sql), list(rows))
                return _Cursor([], cur.rowcount)
        except psycopg.Error as e:
            raise self._mapped(e) from e

    def _run(self, sql: str, params: Sequence[object]) -> _Cursor:
        import psycopg

        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, tuple(params) if params else None)
                rows = cur.fetchall() if cur.description is not None else []
                return _Cursor([tuple(r) for r in rows], cur.rowcount)
        except psycopg.Error as e:
            raise self._mapped(e) from e

    def _mapped(self, e: Exception) -> sqlite3.Error:
        import psycopg

        conn = self._conn
        if isinstance(e, psycopg.OperationalError | psycopg.InterfaceError) and (
            conn is None or conn.closed or conn.broken
        ):
            # Dropped: the next statement connects again (and a transaction begun on this
            # connection is gone with it, rolled back by the server).
            if conn is not None:
                conn.close()
            self._conn = None
            return DatabaseUnavailable(f"lost the connection to {self.where}: {_said(e)}")
        if isinstance(e, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow):
            return DatabaseUnavailable(f"{self.where} is shutting down: {_said(e)}")
        if isinstance(e, psycopg.IntegrityError):
            return PgIntegrityError(_said(e))
        return PgDatabaseError(_said(e))


def _said(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _load_numeric_as_number(conn: psycopg.Connection[Any]) -> None:
    """``numeric`` as int when whole, else float: what SQLite gives the same queries."""
    from psycopg.adapt import Loader

    class _NumberLoader(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode("ascii")
            return float(text) if any(c in text for c in ".eEnN") else int(text)

    conn.adapters.register_loader("numeric", _NumberLoader)
