"""``$SANDCELL_DATABASE_URL``: which PostgreSQL database holds the shared state, if any."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from sandcell.errors import ConfigError

__all__ = ["DATABASE_URL_ENV", "database_url", "redacted"]

DATABASE_URL_ENV = "SANDCELL_DATABASE_URL"
_SCHEMES = ("postgresql", "postgres")


def database_url() -> str | None:
    """The PostgreSQL URL every store uses, or None for the SQLite files under the home.

    Raises ConfigError for a value that is not a ``postgresql://`` URL, naming the fix.
    """
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ConfigError(
            f"${DATABASE_URL_ENV} must be a PostgreSQL URL such as "
            f"postgresql://USER:PASSWORD@HOST:5432/DBNAME, got one starting {parts.scheme!r}:; "
            "unset it to keep the state in SQLite files under the home"
        )
    if not parts.path.strip("/"):
        raise ConfigError(
            f"${DATABASE_URL_ENV} names no database (postgresql://HOST/DBNAME): add its name"
        )
    return url


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***``: what messages and logs may show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
