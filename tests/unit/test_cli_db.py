"""``sandcell db status`` and ``sandcell db upgrade`` against a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sandcell.db.migrate import HEAD


def _db(url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SANDCELL_DATABASE_URL"}
    if url is not None:
        env["SANDCELL_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "sandcell", "db", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_status_then_upgrade_then_current(postgres_url: str) -> None:
    before = _db(postgres_url, "status", "--json")
    assert before.returncode == 1, before.stderr
    assert json.loads(before.stdout) == {
        "database": postgres_url,
        "revision": None,
        "head": HEAD,
        "current": False,
    }
    upgraded = _db(postgres_url, "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"upgraded from empty to revision {HEAD}" in upgraded.stdout
    again = _db(postgres_url, "upgrade")
    assert f"already at revision {HEAD}" in again.stdout
    after = _db(postgres_url, "status")
    assert after.returncode == 0
    assert "current" in after.stdout


def test_the_password_never_shows(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:s3cret-word@", 1)
    said = _db(with_password, "status")
    assert "s3cret-word" not in said.stdout + said.stderr
    assert ":***@" in said.stdout


def test_without_a_database_url_it_says_how_to_set_one() -> None:
    said = _db(None, "status")
    assert said.returncode == 78
    assert "SANDCELL_DATABASE_URL is not set" in said.stderr
    assert "postgresql://" in said.stderr
