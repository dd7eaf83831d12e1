"""``sandcell db``: the shared PostgreSQL database of ``$SANDCELL_DATABASE_URL``.

``status`` says which database and schema revision are in use; ``upgrade`` migrates the
database to this sandcell's revision (every store also does it on first use; run it yourself
before rolling out a new version to the replicas, so none of them starts the migration)."""

from __future__ import annotations

import argparse
import json

from sandcell.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("db", help="the shared PostgreSQL database ($SANDCELL_DATABASE_URL)")
    actions = d.add_subparsers(dest="db_action", required=True, metavar="ACTION")
    status = actions.add_parser("status", help="which database, and its schema revision")
    status.add_argument("--json", action="store_true")
    actions.add_parser("upgrade", help="migrate it to this sandcell's schema revision")


def _url() -> str:
    from sandcell.db import DATABASE_URL_ENV, database_url

    url = database_url()
    if url is None:
        raise ConfigError(
            f"${DATABASE_URL_ENV} is not set: the state is in SQLite files under the home, "
            "which need no migration. Set it to postgresql://USER:PASSWORD@HOST:5432/DBNAME"
        )
    return url


def handle(args: argparse.Namespace) -> int:
    from sandcell.db import redacted
    from sandcell.db.migrate import HEAD, current_version, ensure_current

    url = _url()
    if args.db_action == "upgrade":
        before = current_version(url)
        ensure_current(url)
        said = "already at" if before == HEAD else f"upgraded from {before or 'empty'} to"
        print(f"sandcell: {redacted(url)}: {said} revision {HEAD}")
        return 0
    found = current_version(url)
    answer = {
        "database": redacted(url),
        "revision": found,
        "head": HEAD,
        "current": found == HEAD,
    }
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        state = "current" if found == HEAD else "needs `sandcell db upgrade`"
        print(f"{answer['database']}: revision {found or 'none (empty)'} of {HEAD}: {state}")
    return 0 if found == HEAD else 1
