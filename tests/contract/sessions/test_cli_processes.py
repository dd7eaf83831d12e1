"""A session's background processes and terminals through the command line: ``sandcell session
spawn|ps|logs|kill`` with a real detached session server, and ``attach`` driven through a real
terminal (tmux): keys typed there reach bash in the session, a resize of the terminal reaches
its PTY, the shell's exit ends the attach with its status, and Ctrl-] detaches, leaving it
running for a later attach.

The server's process requests are the same on every rung (the session's process manager is
tests/contract/sessions/test_processes.py's), so this runs on the namespaces rung, as root with
a data directory of its own. Every wait is for the expected text, with a deadline only for a
run that went wrong.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.terminal import Tmux

Cli = Callable[..., "subprocess.CompletedProcess[str]"]
DEADLINE_S = 60.0
TICKS = "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.2; done"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[tuple[Cli, Path]]:
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    env["SANDCELL_HOME"] = str(home)

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), env=env, timeout=300)

    yield call, home


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def _start(call: Cli) -> str:
    return str(json.loads(_ok(call("session", "start", "--json")))["id"])


def test_spawn_ps_logs_and_kill(cli: tuple[Cli, Path]) -> None:
    call, _ = cli
    sid = _start(call)
    try:
        ticks = int(_ok(call("session", "spawn", sid, "--tag", "ticks", "--", TICKS)))
        followed = call("session", "logs", sid, str(ticks), "--follow")
        assert (followed.returncode, followed.stdout, followed.stderr) == (
            0,
            "1\n2\n3\n",
            "e1\ne2\ne3\n",
        )
        three = int(_ok(call("session", "spawn", sid, "--", "bash", "-c", "echo a b; exit 3")))
        assert call("session", "logs", sid, str(three), "-f").returncode == 3
        assert _ok(call("session", "logs", sid, str(three))) == "a b\n"
        nap = json.loads(_ok(call("session", "spawn", sid, "--json", "--", "sleep", "600")))
        assert nap["argv"] == ["sleep", "600"] and nap["command"] is None
        doomed = int(_ok(call("session", "spawn", sid, "--", "sleep 600; echo never")))

        listed = {p["pid"]: p for p in json.loads(_ok(call("session", "ps", sid, "--json")))}
        assert sorted(listed) == sorted([ticks, three, nap["pid"], doomed])
        assert (listed[ticks]["tag"], listed[ticks]["exit_code"]) == ("ticks", 0)
        assert not listed[nap["pid"]]["exited"]

        _ok(call("session", "kill", sid, str(nap["pid"])))  # TERM, as kill(1)
        _ok(call("session", "kill", sid, str(doomed), "--signal", "KILL"))
        assert call("session", "logs", sid, str(nap["pid"]), "-f").returncode == 128 + 15
        assert call("session", "logs", sid, str(doomed), "-f").returncode == 128 + 9
        table = _ok(call("session", "ps", sid))
        assert "killed (SIGTERM)" in table and "killed (SIGKILL)" in table, table
        assert "exited 3" in table and "ticks" in table, table

        missing = call("session", "kill", sid, "99999")
        assert missing.returncode == 78 and "no process 99999" in missing.stderr
        refused = call("session", "spawn", sid, "--", "rm -rf /")
        assert refused.returncode == 78 and "not started" in refused.stderr
        no_tty = call("session", "attach", sid)
        assert no_tty.returncode == 78 and "needs a terminal" in no_tty.stderr
        bad = call("session", "kill", sid, str(ticks), "--signal", "NOPE")
        assert bad.returncode == 78 and "NOPE" in bad.stderr
    finally:
        call("session", "close", sid)
    gone = call("session", "ps", sid)
    assert gone.returncode == 78 and "no live session" in gone.stderr


def test_attach_in_a_real_terminal(cli: tuple[Cli, Path]) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux); it drives the terminal here")
    call, home = cli
    sid = _start(call)
    term = Tmux(home)
    sandcell = f"{shlex.quote(sys.executable)} -m sandcell session"
    try:
        term.type(f"{sandcell} attach {sid}; echo attach-exit=$?", "Enter")
        attached = term.wait_for("Ctrl-] detaches")
        pid = int(attached.split("attached to pid ")[1].split()[0])
        term.type("clear; echo hi-$((6 * 7)) $TERM; tty; stty size", "Enter")
        shown = term.wait_for("30 100")
        assert "hi-42 " in shown and "/dev/pts/" in shown, shown
        assert "TERM environment variable not set" not in shown, shown

        term.tmux("resize-window", "-t", "t", "-x", "90", "-y", "25")
        term.type("stty size", "Enter")
        term.wait_for("25 90")

        # Ctrl-] detaches; the shell runs on, and a later attach joins it again.
        term.type("C-]")
        term.wait_for("attach-exit=0")
        assert "detached" in term.screen()
        listed = {p["pid"]: p for p in json.loads(_ok(call("session", "ps", sid, "--json")))}
        assert listed[pid]["exited"] is False and listed[pid]["pty"] == {"rows": 25, "cols": 90}

        term.type("clear", "Enter")
        term.type(f"{sandcell} attach {sid} {pid}; echo again-exit=$?", "Enter")
        term.wait_for(f"attached to pid {pid}")
        term.type("echo back-$((40 + 2))", "Enter")
        term.wait_for("back-42")
        term.type("exit 5", "Enter")
        term.wait_for("again-exit=5")
        [ended] = json.loads(_ok(call("session", "ps", sid, "--json")))
        assert (ended["pid"], ended["exited"], ended["exit_code"]) == (pid, True, 5)
    finally:
        term.close()
        call("session", "close", sid)
