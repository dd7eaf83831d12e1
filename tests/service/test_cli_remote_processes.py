"""``sandcell session spawn|ps|logs|kill`` through a real ``sandcell serve`` (its
``/v1/sessions/{id}/processes`` API), printed as for this machine's sessions (namespaces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.service.server import REPO, ServiceProcess, add_tenant


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


def test_background_processes_through_the_service(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "cli-spawner")

    def ok(*args: str) -> str:
        done = _cli(*args, home=home, key=key)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    sid = ok("session", "start").strip()
    try:
        pid = ok("session", "spawn", sid, "--tag", "t", "--", "echo out; echo err >&2; exit 4")
        followed = _cli("session", "logs", sid, pid.strip(), "--follow", home=home, key=key)
        assert (followed.returncode, followed.stdout, followed.stderr) == (4, "out\n", "err\n")
        nap = int(ok("session", "spawn", sid, "--", "sleep", "600"))
        ok("session", "kill", sid, str(nap), "--signal", "INT")
        ended = _cli("session", "logs", sid, str(nap), "-f", home=home, key=key)
        assert ended.returncode == 128 + 2, ended.stderr
        listed = json.loads(ok("session", "ps", sid, "--json"))
        assert [(p["tag"], p["exit_code"]) for p in listed] == [("t", 4), (None, None)]
        assert "killed (SIGINT)" in ok("session", "ps", sid)
        missing = _cli("session", "logs", sid, "99999", home=home, key=key)
        assert missing.returncode == 78 and "no process 99999" in missing.stderr
    finally:
        ok("session", "close", sid)
    gone = _cli("session", "ps", sid, home=home, key=key)
    assert gone.returncode == 78 and sid in gone.stderr


def test_attach_through_the_service(service: ServiceProcess, home: Path) -> None:
    import shlex
    import shutil

    import pytest
    from tests.terminal import Tmux

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux); it drives the terminal here")
    key = add_tenant(home, "cli-attacher")
    sid = _cli("session", "start", home=home, key=key).stdout.strip()
    term = Tmux(home, env={"SANDCELL_API_KEY": key})
    try:
        sandcell = f"{shlex.quote(sys.executable)} -m sandcell session"
        term.type(f"{sandcell} attach {sid}; echo attach-exit=$?", "Enter")
        term.wait_for("Ctrl-] detaches")
        term.type("echo remote-$((6 * 7)); stty size", "Enter")
        term.wait_for("30 100")
        assert "remote-42" in term.screen()
        term.type("exit 7", "Enter")
        term.wait_for("attach-exit=7")
    finally:
        term.close()
        _cli("session", "close", sid, home=home, key=key)
