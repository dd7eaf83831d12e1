"""``sandcell session pause|resume|fork|snapshot|snapshots|snapshot-delete|delete|show`` through
a real ``sandcell serve`` (its saved-session API), printed as this machine's sessions are. The
service's default rung is the namespaces one, which keeps files only: a pause without ``--mode``
asks for memory, is refused (422) and keeps the files, as the command line does here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.service.server import REPO, ServiceProcess, add_tenant


@pytest.fixture(scope="module")
def key(service: ServiceProcess, home: Path) -> str:
    return add_tenant(home, "cli-lasting", profiles=("strict", "analysis"))


def _cli(*args: str, home: Path, key: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home), "SANDCELL_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_session_paused_forked_and_snapshotted_through_the_service(
    service: ServiceProcess, home: Path, key: str
) -> None:
    def ok(*args: str) -> str:
        done = _cli(*args, home=home, key=key)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    sid = ok("session", "start", "--profile", "analysis").strip()
    opened = [sid]
    try:
        ok("session", "run", sid, "-c", "open('f.txt', 'w').write('kept')")
        shown = json.loads(ok("session", "show", sid, "--json"))
        assert shown["state"] == "live" and shown["metrics"], shown

        paused = json.loads(ok("session", "pause", sid, "--json"))
        assert (paused["state"]["kind"], paused["state"]["mode"]) == ("paused", "files")
        rows = {r["id"]: r for r in json.loads(ok("session", "list", "--json"))}
        assert rows[sid]["state"] == "paused" and rows[sid]["stored_bytes"] > 0, rows
        assert "paused (files)" in ok("session", "show", sid)

        assert ok("session", "resume", sid).strip() == sid
        assert ok("session", "run", sid, "-c", "print(open('f.txt').read())") == "kept\n"

        ok("session", "snapshot", sid, "base", "--mode", "files")
        assert [s["name"] for s in json.loads(ok("session", "snapshots", "--json"))] == ["base"]
        started = ok("session", "start", "--snapshot", "base").strip()
        opened.append(started)
        assert ok("session", "run", started, "-c", "print(open('f.txt').read())") == "kept\n"
        assert "deleted snapshot base" in ok("session", "snapshot-delete", "base")

        children = ok("session", "fork", sid, "-n", "2", "--mode", "files").split()
        opened += children
        assert len(set(children)) == 2
        for child in children:
            assert ok("session", "run", child, "-c", "print(open('f.txt').read())") == "kept\n"

        ok("session", "pause", sid, "--mode", "files")
        assert "deleted paused session" in ok("session", "delete", sid)
        assert sid not in {r["id"] for r in json.loads(ok("session", "list", "--json"))}
    finally:
        for s in opened:
            _cli("session", "close", s, home=home, key=key)
