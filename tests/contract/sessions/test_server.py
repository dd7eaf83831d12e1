"""The detached session server and its client, whatever the rung behind them: a start refused
before any sandbox exists says why, and a cell reaches a server only from the user who owns it.

These hold in the server's and client's own code, the same for every rung (the rung is only
what the server opens once it admitted its caller), so they run on the default rung, the
namespaces backend, where a server starts quickest; tests/contract/sessions/test_cli.py takes
servers of every rung through their whole life.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, run_cli
from tests.integration import hostscan


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--profile", "PROFILE_WITH_TYPO"], "unknown key 'isolaton'"),
        (["--profile", "hostile", "--backend", "namespaces"], "weaker than the minimum 'microvm'"),
        (["--memory", "-3"], "--memory must be a positive number"),
        (["--timeout", "-1"], "--timeout must be a positive number"),
        (["--timeout", "nan"], "--timeout must be a positive number"),
    ],
)
def test_cli_start_refusals_reach_the_caller(tmp_path: Path, args: list[str], said: str) -> None:
    # Refused before any sandbox exists, by the detached server or the starting command: the
    # caller must read why (not only that the server exited) and get the configuration status.
    typo = tmp_path / "typo.toml"
    typo.write_text('[isolaton]\nbackend = "gvisor"\n')
    args = [str(typo) if a == "PROFILE_WITH_TYPO" else a for a in args]
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    env.pop("SANDCELL_BACKEND", None)
    start = run_cli(["session", "start", *args], env=env)
    assert start.returncode == 78, start.stderr
    assert said in start.stderr
    assert start.stdout == ""
    listed = run_cli(["session", "list", "--json"], env=env)
    assert json.loads(listed.stdout) == []


_OTHER_USER_CLIENT = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(30)
sock.connect(sys.argv[1])
print("CONNECTED", flush=True)
body = json.dumps({"op": "run", "code": "pwned = 1\\nprint('RAN')"}).encode()
try:
    sock.sendall(len(body).to_bytes(4, "big") + body)
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
except OSError as exc:
    print("CLOSED", type(exc).__name__)
else:
    print("REPLY", reply.decode(errors="replace") if reply else "NONE")
"""


def test_session_server_refuses_another_user(unpriv: UnprivEnv) -> None:
    """The real second user reaches a root session's socket (its directories opened up to it, as
    a careless setup would) and sends a cell: the server answers nothing, and the cell never runs
    in the session."""
    work = Path(tempfile.mkdtemp(prefix="sandcell-session-"))
    try:
        work.chmod(0o755)
        home = work / "home"
        env = {**os.environ, "SANDCELL_HOME": str(home)}
        start = run_cli(["session", "start", "--profile", "unchecked", "--json"], env=env)
        assert start.returncode == 0, start.stderr
        sid = json.loads(start.stdout)["id"]
        server_pid = json.loads((home / "sessions" / f"{sid}.json").read_text())["pid"]
        try:
            sock = home / "sessions" / f"{sid}.sock"
            modes = {p: p.stat().st_mode for p in (home, sock.parent, sock)}
            for d in (home, sock.parent):
                d.chmod(d.stat().st_mode | 0o005)
            sock.chmod(0o666)
            other = subprocess.run(
                ["runuser", "-u", unpriv.user, "--", unpriv.python, "-I", "-c",
                 _OTHER_USER_CLIENT, str(sock)],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            # The attempt reached the server (no file permission stopped it first)...
            assert other.stdout.startswith("CONNECTED"), other.stdout + other.stderr
            # ...which closed the connection without a word.
            answer = other.stdout.split("\n")[1]
            assert answer == "REPLY NONE" or answer.startswith("CLOSED "), other.stdout
            for path, mode in modes.items():  # private again, as the owner's client requires
                path.chmod(mode)
            # The cell never ran: the session has no `pwned`, and still serves its own user.
            probe = run_cli(["session", "run", sid, "-c", "print('pwned' in globals())"], env=env)
            assert probe.returncode == 0, probe.stderr
            assert probe.stdout.strip() == "False", probe.stdout
        finally:
            run_cli(["session", "close", sid], env=env)
            # Gone before its directory is: a server still ending could write there again.
            hostscan.wait_until(lambda: not hostscan.alive(server_pid), timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_cli_client_sends_cells_only_to_a_server_of_its_own_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A socket served by another uid (planted where a parent of the data directory is someone
    # else's) must not receive the cell: the client checks the server's peer credentials.
    if os.geteuid() != 0:
        pytest.skip("runs as root; this test run is not root")
    from sandcell.errors import SandcellError
    from sandcell.sessions import server

    home = tmp_path / "home"
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    start = run_cli(["session", "start", "--profile", "unchecked", "--json"], env=env)
    assert start.returncode == 0, start.stderr
    sid = json.loads(start.stdout)["id"]
    try:
        monkeypatch.setattr(server, "_peer_uid", lambda conn: os.getuid() + 4242)
        with pytest.raises(SandcellError, match="not by you"):
            server.request(home, sid, {"op": "run", "code": "print(1)"}, timeout_s=30)
        monkeypatch.undo()
        ok = run_cli(["session", "run", sid, "-c", "print(6 * 7)"], env=env)
        assert ok.returncode == 0 and ok.stdout.strip() == "42", ok
    finally:
        run_cli(["session", "close", sid], env=env)
