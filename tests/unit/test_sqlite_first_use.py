"""First use of a private SQLite file under contention: waited for within a bound, never reported
as a place that cannot be written.

The collision is made on purpose: another connection holds the write lock of a fresh database in
rollback mode (as a second process does while it creates the schema), and SQLite refuses the switch
to WAL at once ("database is locked") instead of waiting.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell import _sqlite
from sandcell._sqlite import open_private_db
from sandcell.errors import InfraError

SCHEMA = ["CREATE TABLE t (x)"]


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """A connection in rollback mode holding the write lock, with an uncommitted change."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE pending (x)")
    return conn


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "home" / "store.sqlite3"


def test_the_collision_is_real(fresh: Path) -> None:
    """Without the wait, SQLite answers at once: this is what seven of eight processes saw."""
    fresh.parent.mkdir()
    holder = _hold_write_lock(fresh)
    try:
        conn = sqlite3.connect(fresh, timeout=30, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
    finally:
        holder.close()


def test_a_busy_fresh_store_is_waited_for(fresh: Path) -> None:
    fresh.parent.mkdir()
    holder = _hold_write_lock(fresh)
    released = threading.Event()

    def release() -> None:
        # Rolled back, as a process that failed would leave it: the file stays empty.
        holder.execute("ROLLBACK")
        holder.close()
        released.set()

    timer = threading.Timer(1.0, release)
    timer.start()
    try:
        conn = open_private_db(
            fresh, application_id=7, schema=SCHEMA, error=InfraError, what="test store"
        )
    finally:
        timer.join()
    assert released.is_set()
    assert conn.execute("PRAGMA application_id").fetchone()[0] == 7
    assert str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
    conn.close()


def test_a_store_busy_past_the_bound_is_reported_as_busy(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_S", 0.5)
    fresh.parent.mkdir()
    holder = _hold_write_lock(fresh)
    try:
        with pytest.raises(InfraError) as err:
            open_private_db(
                fresh,
                application_id=7,
                schema=SCHEMA,
                error=InfraError,
                what="test store",
                advice="set SANDCELL_HOME to a writable location",
            )
    finally:
        holder.close()
    message = str(err.value)
    assert "still locked by another sandcell process" in message, message
    assert "writable" not in message, message
