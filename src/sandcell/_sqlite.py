"""Private SQLite files: how the audit log and the approval store open theirs.

Both keep one file that only its owner may read (it holds code, inputs, env values), shared by
threads (one connection under the caller's lock) and by processes (SQLite's locks). Opening one:

* :func:`create_private_file` creates the file 0600 and its missing parents 0700 before SQLite
  would create it with the umask's mode; SQLite gives its -wal and -shm files the file's mode;
* :func:`open_private_db` connects, switches to WAL with ``synchronous = NORMAL``, and in one
  ``BEGIN IMMEDIATE`` transaction creates the schema of an empty database or checks that an
  existing one carries the caller's ``application_id`` (a foreign database is never written to).

Every failure is raised as the caller's own error class, naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from sandcell.errors import SandcellError

__all__ = ["BUSY_TIMEOUT_S", "create_private_file", "open_private_db", "transaction"]

BUSY_TIMEOUT_S = 30.0
"""How long a transaction waits for another process's write lock. Transactions hold it for well
under a millisecond, so only a wedged process makes this expire."""


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
def transaction(conn: sqlite3.Connection, *, write: bool = True) -> Iterator[sqlite3.Connection]:
    """One explicit transaction on ``conn`` (opened with ``isolation_level=None``).

    ``write`` begins it IMMEDIATE, taking the write lock before anything is read, so a check
    and the change that depends on it are atomic across processes. Committed when the block
    ends, rolled back when it raises; sqlite3 errors propagate untranslated.
    """
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


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
    try:
        # WAL: readers never block a writer and commits need no fsync with NORMAL. The mode is
        # stored in the file; on filesystems without shared memory SQLite keeps the old mode,
        # which is slower but still correct, so the answer is not checked.
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
    except sqlite3.Error as e:
        conn.close()
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
