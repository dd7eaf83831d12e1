"""The PostgreSQL schemas' version: brought to this sandcell's by Alembic, once per process.

A store opening on PostgreSQL calls :func:`ensure_current`. A database already at
:data:`HEAD` costs one query (and no import of Alembic); an empty or older one is upgraded by
Alembic's ``upgrade head`` inside one transaction that holds an advisory lock, so replicas and
nodes starting together on a fresh database upgrade it once, in turn. A database whose version
this sandcell does not know (a newer sandcell migrated it) is refused rather than written to.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from sandcell.db.url import redacted
from sandcell.errors import ConfigError, StoreUnavailable

__all__ = ["HEAD", "VERSION_SCHEMA", "current_version", "ensure_current", "upgrade"]

HEAD = "0003"
"""The newest revision under ``migrations/versions`` (a test holds this to Alembic's head)."""
VERSION_SCHEMA = "sandcell"
"""Where Alembic keeps its ``alembic_version`` table."""
KNOWN = ("0001", "0002", "0003")
"""Every revision this sandcell has, oldest first."""

_MIGRATIONS = Path(__file__).with_name("migrations")
_LOCK = int.from_bytes(hashlib.sha256(b"sandcell:migrate").digest()[:8], "big", signed=True)
_current: set[str] = set()
_guard = threading.Lock()


def current_version(url: str) -> str | None:
    """The revision the database at ``url`` is at; None for one sandcell never migrated."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (f"{VERSION_SCHEMA}.alembic_version",)
            ).fetchone()
            if not row or not row[0]:
                return None
            found = conn.execute(
                f"SELECT version_num FROM {VERSION_SCHEMA}.alembic_version"  # noqa: S608
            ).fetchone()
    except psycopg.OperationalError as e:
        raise StoreUnavailable(f"cannot reach the database {redacted(url)}: {e}") from e
    return None if found is None else str(found[0])


def upgrade(url: str) -> None:
    """Run Alembic's ``upgrade head`` on ``url`` under the migration lock."""
    import sqlalchemy
    from alembic import command
    from alembic.config import Config

    engine = sqlalchemy.create_engine(_sqlalchemy_url(url), poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.begin() as conn:
            # Held to the end of the transaction: a second process waits, then finds it done.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_LOCK:d})")
            conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA}")
            config = Config()
            config.set_main_option("script_location", str(_MIGRATIONS))
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
    except sqlalchemy.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot reach the database {redacted(url)}: {e.orig}") from e
    finally:
        engine.dispose()


def ensure_current(url: str) -> None:
    """Make sure the database at ``url`` has this sandcell's schemas (see the module).

    Raises ConfigError for a database migrated by a newer sandcell, StoreUnavailable when it
    cannot be reached.
    """
    with _guard:
        if url in _current:
            return
        found = current_version(url)
        if found is not None and found not in KNOWN:
            raise ConfigError(
                f"the database {redacted(url)} is at schema revision {found!r}, which this "
                f"sandcell does not know (it knows {', '.join(KNOWN)}): a newer sandcell "
                "migrated it; upgrade sandcell on this machine"
            )
        if found != HEAD:
            upgrade(url)
        _current.add(url)


def _sqlalchemy_url(url: str) -> str:
    """SQLAlchemy's name for the same database through psycopg 3."""
    scheme, rest = url.split("://", 1)
    del scheme  # postgres:// and postgresql:// alike
    return f"postgresql+psycopg://{rest}"
