"""Private SQLite files: how the audit log, the approval store and the agent's paused
conversations open theirs, and the store they share (:class:`PrivateStore`), which keeps its
tables in PostgreSQL instead when ``$SANDCELL_DATABASE_URL`` is set (:mod:`sandcell.db`).

Each keeps one file that only its owner may read (it holds code, inputs, env values), shared by
threads (one connection under the store's lock) and by processes (SQLite's locks). Opening one:

* :func:`create_private_file` creates the file 0600 and its missing parents 0700 before SQLite
  would create it with the umask's mode; SQLite gives its -wal and -shm files the file's mode;
* :func:`open_private_db` connects, switches to WAL with ``synchronous = NORMAL``, and in one
  ``BEGIN IMMEDIATE`` transaction creates the schema of an empty database or checks that an
  existing one carries the caller's ``application_id`` (a foreign database is never written to).

First use is concurrent: several sandcell processes started together on a fresh data directory
all create and set up the same file. SQLite answers some of those collisions with "database is
locked" at once instead of waiting (switching to WAL needs an exclusive lock, and it never waits
where waiting could deadlock), so the setup is retried, with a growing pause, until
:data:`BUSY_TIMEOUT_S` has passed; a database still busy then is reported as busy, not as a place
that cannot be written.

Every failure is raised as the caller's own error class, naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypeVar

from sandcell.db.postgres import DatabaseUnavailable, PgConnection
from sandcell.db.url import database_url
from sandcell.errors import SandcellError, StoreUnavailable

__all__ = [
    "BUSY_TIMEOUT_S",
    "PrivateStore",
    "Rows",
    "StoreConnection",
    "create_private_file",
    "open_private_db",
    "transaction",
]

BUSY_TIMEOUT_S = 30.0
"""How long a transaction waits for another process's write lock. Transactions hold it for well
under a millisecond, so only a wedged process makes this expire."""


class Rows(Protocol):
    """What a statement returns, on SQLite and on PostgreSQL alike."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class StoreConnection(Protocol):
    """A store's connection: :class:`sqlite3.Connection`, or a
    :class:`~sandcell.db.postgres.PgConnection` that speaks the same part of its interface."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Rows: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Rows: ...

    @property
    def in_transaction(self) -> bool: ...


_C = TypeVar("_C", bound=StoreConnection)


def _fix(advice: str) -> str:
    return f"; {advice}" if advice else ""


def create_private_file(
    path: Path, *, error: type[SandcellError], what: str, advice: str = ""
) -> None:
    """Create ``path`` (mode 0o600) and its missing parents (mode 0o700) unless they exist.

    An existing file is left as it is. Raises ``error`` ("cannot create {what} {path}: ...",
    then ``advice``) when the location is not writable.
    """
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        if parent.parent == parent:
            break
        parent = parent.parent
    try:
        # Created one by one: Path.mkdir(parents=True) ignores mode for the intermediate ones.
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):  # another process created it meanwhile
                directory.mkdir(mode=0o700)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return
        try:
            os.fchmod(fd, 0o600)  # the umask may have removed bits we need (e.g. owner write)
        finally:
            os.close(fd)
    except OSError as e:
        raise error(f"cannot create {what} {path}: {e.strerror or e}{_fix(advice)}") from e


@contextlib.contextmanager
def transaction(conn: _C, *, write: bool = True) -> Iterator[_C]:
    """One explicit transaction on ``conn`` (opened with ``isolation_level=None``).

    ``write`` begins it IMMEDIATE, taking the write lock before anything is read, so a check
    and the change that depends on it are atomic across processes (on PostgreSQL: the store's
    advisory lock, :mod:`sandcell.db.postgres`). Committed when the block ends, rolled back
    when it raises; sqlite3 errors propagate untranslated.
    """
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED, in any of their extended forms."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _retry_while_busy(step: Callable[[], None]) -> None:
    """Run ``step``; while SQLite says busy, pause (jittered, growing) and run it again, until
    :data:`BUSY_TIMEOUT_S` has passed. ``step`` must be safe to repeat (a rolled-back
    transaction, an idempotent pragma)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as e:
            if not _busy(e) or time.monotonic() + pause > deadline:
                raise
        # Jitter: processes that collided once must not collide again in lockstep.
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 0.25)


def open_private_db(
    path: Path,
    *,
    application_id: int,
    schema: Sequence[str],
    error: type[SandcellError],
    what: str,
    advice: str = "",
    check: Callable[[sqlite3.Connection], None] | None = None,
) -> sqlite3.Connection:
    """Open (creating file, parents and schema as needed) the private database at ``path``.

    An empty database gets the ``schema`` statements and ``application_id``, in one transaction.
    An existing one must carry ``application_id``; ``check`` may then refuse it further (raising
    ``error``) inside the same transaction. The connection has no implicit transactions
    (``isolation_level=None``) and may be used from any thread (the caller serialises).

    Every failure raises ``error`` naming ``what`` (e.g. "audit log") and ``path``, followed by
    ``advice`` (how to point sandcell elsewhere) when given.
    """
    create_private_file(path, error=error, what=what, advice=advice)
    fix = _fix(advice)
    try:
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as e:
        raise error(f"cannot open {what} {path}: {e}{fix}") from e

    def set_up() -> None:
        # WAL: readers never block a writer and commits need no fsync with NORMAL. The mode is
        # stored in the file, so it is switched once, by whichever process gets there first;
        # on filesystems without shared memory SQLite keeps the old mode, which is slower but
        # still correct, so the answer is not checked.
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        with transaction(conn):
            objects = int(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])
            found_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            if objects == 0 and found_id == 0:
                for statement in schema:
                    conn.execute(statement)
                # PRAGMAs take no bound parameters; the id is an int.
                conn.execute(f"PRAGMA application_id = {application_id:d}")
            elif found_id != application_id:
                raise error(
                    f"{path} is a SQLite database but not a sandcell {what}; refusing to write "
                    f"to it. Move it aside{', or ' + advice if advice else ''}"
                )
            elif check is not None:
                check(conn)

    try:
        _retry_while_busy(set_up)
    except sqlite3.Error as e:
        conn.close()
        if _busy(e):
            raise error(
                f"{what} {path} is still locked by another sandcell process after "
                f"{BUSY_TIMEOUT_S:.0f} s; nothing was changed, try again once it has finished"
            ) from e
        if "not a database" in str(e) or "malformed" in str(e):
            raise error(
                f"cannot open {what} {path}: it is not a usable SQLite database ({e}). Move it "
                f"aside to start a new {what}{', or ' + advice if advice else ''}"
            ) from e
        raise error(f"cannot open {what} {path}: {e}{fix}") from e
    except BaseException:
        conn.close()
        raise
    return conn


class PrivateStore:
    """A store kept in one private SQLite file: a connection shared by threads under a lock,
    closed by :meth:`close` or by leaving a ``with`` block.

    A subclass names its error class (``_error``: every failure is raised as it) and what it is
    (``_what``, e.g. "approval store", the words of its messages). Its methods run SQL in
    :meth:`_txn`, or, holding ``_lock``, on :meth:`_connection` where they report errors their
    own way. A connection must not cross ``fork()``: open a new store in the child.
    """

    _error: ClassVar[type[SandcellError]]
    _what: ClassVar[str]
    _pg_schema: ClassVar[str]
    """The PostgreSQL schema holding the store's tables (:mod:`sandcell.db.migrations`)."""

    def __init__(
        self,
        path: Path,
        *,
        application_id: int,
        schema: Sequence[str],
        advice: str = "",
        check: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Open (creating file 0600, parents 0700, schema) the store at ``path``; the arguments
        after it are :func:`open_private_db`'s. With ``$SANDCELL_DATABASE_URL`` set, open the
        store's schema in that PostgreSQL database instead (migrated to this sandcell's
        version first); ``path`` then only names the home the store belongs to."""
        self.path = Path(path)
        self._lock = threading.Lock()
        url = database_url()
        # No implicit transactions: every method opens its own explicitly.
        self._conn: StoreConnection | None
        if url is None:
            self.where = str(self.path)
            """Where the store is, for messages: its file, or its database and schema."""
            self._conn = open_private_db(
                self.path,
                application_id=application_id,
                schema=schema,
                error=self._error,
                what=self._what,
                advice=advice,
                check=check,
            )
            return
        from sandcell.db.migrate import ensure_current

        ensure_current(url)
        try:
            pg = PgConnection(url, schema=self._pg_schema)
        except DatabaseUnavailable as e:
            raise StoreUnavailable(f"{self._what}: {e}; try again once it is back") from e
        self.where = pg.where
        self._conn = pg

    def close(self) -> None:
        """Close the connection; later calls raise the store's error. Idempotent."""
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                if isinstance(conn, sqlite3.Connection | PgConnection):
                    conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> StoreConnection:
        """The open connection; the caller holds ``_lock``."""
        if self._conn is None:
            raise self._error(f"{self._what} {self.where} is closed")
        return self._conn

    def _failed(self, exc: sqlite3.Error, message: str) -> SandcellError:
        """What a store raises for ``exc``: StoreUnavailable when the database could not be
        reached (safe to retry), else the store's own error saying ``message``."""
        if isinstance(exc, DatabaseUnavailable):
            return StoreUnavailable(f"{self._what}: {exc}; try again once it is back")
        return self._error(message)

    @contextlib.contextmanager
    def _txn(self, *, write: bool = True) -> Iterator[StoreConnection]:
        """One transaction (:func:`transaction`) under the lock; sqlite3 errors become the
        store's error."""
        # IMMEDIATE takes the write lock before the state is read, so a check and the change
        # that depends on it are atomic across processes; the thread lock does the same for the
        # shared connection.
        with self._lock:
            conn = self._connection()
            try:
                with transaction(conn, write=write) as txn:
                    yield txn
            except sqlite3.Error as e:
                raise self._failed(e, f"{self._what} {self.where}: {e}") from e
