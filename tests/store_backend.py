"""The two places a store can live, for the store contract tests (``store_backend`` in
tests/conftest.py): its private SQLite file under the home, or its schema in a PostgreSQL
database (``$SANDCELL_DATABASE_URL``).

A contract test opens its stores as usual (``AuditLog(tmp_path / "audit.sqlite3")``); the
fixture has already pointed ``$SANDCELL_DATABASE_URL`` at a fresh database for the postgres
case, so the same test runs against both. A test that edits a store behind its back (tampering)
does it through :meth:`StoreBackend.raw`, which opens the SQLite file or the store's
PostgreSQL schema, whichever the store is using, as an attacker with write access would.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

BackendName = Literal["sqlite", "postgres"]
BACKENDS: tuple[BackendName, ...] = ("sqlite", "postgres")


class RawConnection(Protocol):
    """What :meth:`StoreBackend.raw` yields: ``execute`` with sqlite3's ``?`` placeholders."""

    def execute(self, sql: str, parameters: Sequence[object] = ..., /) -> Any: ...


class _PgRaw:
    """A psycopg connection taking sqlite3's ``?`` placeholders (the tests' statements are
    written once, in SQL both databases accept)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[object] = ()) -> Any:
        if parameters:
            sql = sql.replace("%", "%%").replace("?", "%s")
        return self._conn.execute(sql, tuple(parameters) if parameters else None)


@dataclass(frozen=True)
class StoreBackend:
    """Where this test's stores live: ``name`` and, for postgres, the database's ``url``."""

    name: BackendName
    url: str | None = None

    @property
    def is_postgres(self) -> bool:
        return self.name == "postgres"

    @contextlib.contextmanager
    def raw(self, path: Path, schema: str) -> Iterator[RawConnection]:
        """One transaction on the store's own tables, bypassing the store: the SQLite file at
        ``path``, or PostgreSQL schema ``schema`` (e.g. ``sandcell_audit``). Committed when
        the block ends, rolled back when it raises."""
        if self.url is None:
            conn = sqlite3.connect(path)
            try:
                with conn:
                    yield conn
            finally:
                conn.close()
            return
        import psycopg

        # Not autocommit: leaving the block commits, an exception rolls back.
        with psycopg.connect(self.url, options=f"-c search_path={schema}") as pg:
            yield _PgRaw(pg)
