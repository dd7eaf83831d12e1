"""``sandcell tenants`` and ``sandcell serve``'s refusals, through the real command line."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.service.server import REPO


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tenants_add_list_rotate_remove(tmp_path: Path) -> None:
    added = _cli(
        tmp_path,
        "tenants", "add", "acme", "--profile", "analysis", "--profile", "strict",
        "--max-concurrent", "3", "--runs-per-minute", "120", "--cpu-seconds-per-day", "600",
        "--max-stored-mb", "5",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key.startswith("sc_") and len(key) > 40
    assert "shown only now" in added.stderr
    db = tmp_path / "service.sqlite3"
    assert db.stat().st_mode & 0o777 == 0o600
    with sqlite3.connect(db) as conn:
        stored = [r[0] for r in conn.execute("SELECT key_sha256 FROM tenants")]
    assert stored == [hashlib.sha256(key.encode()).hexdigest()]
    assert key not in db.read_bytes().decode("latin-1")
    listed = json.loads(_cli(tmp_path, "tenants", "list", "--json").stdout)
    assert listed[0]["profiles"] == ["analysis", "strict"]
    assert listed[0]["max_stored_bytes"] == 5 * 1024 * 1024
    assert key not in _cli(tmp_path, "tenants", "list").stdout
    again = _cli(tmp_path, "tenants", "add", "acme", "--profile", "strict")
    assert again.returncode != 0 and "exists" in again.stderr
    bad = _cli(tmp_path, "tenants", "add", "other", "--profile", "no-such")
    assert bad.returncode != 0 and "unknown profile" in bad.stderr
    rotated = _cli(tmp_path, "tenants", "rotate-key", "acme")
    assert rotated.returncode == 0 and rotated.stdout.strip() != key
    assert _cli(tmp_path, "tenants", "remove", "acme").returncode == 0
    assert json.loads(_cli(tmp_path, "tenants", "list", "--json").stdout) == []
    assert _cli(tmp_path, "tenants", "remove", "acme").returncode != 0


def test_serve_refuses_a_public_address_unless_told(tmp_path: Path) -> None:
    refused = _cli(tmp_path, "serve", "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode != 0
    assert "--allow-remote" in refused.stderr
