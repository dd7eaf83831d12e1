"""Sessions: one sandbox kept alive across cells, with its limits, interrupts, expiry and cleanup.

As root through the in-process executor (cgroups, strict mode), and through the CLI as root and
as the unprivileged user (the detached session server; rlimits mode where this host gives users
no cgroups). Each test asserts outcomes and what is left on the host, never how long anything took.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, run_as_user, run_cli
from tests.integration import hostscan

from sandcell import Executor, Limits, Outcome
from sandcell.backends.host import workspace
from sandcell.errors import ConfigError
from sandcell.sessions import Session, SessionEnded
from sandcell.spec import MiB


@pytest.fixture
def session(executor: Executor) -> Iterator[Session]:
    with executor.session(limits=Limits(wall_time_s=20, memory_bytes=256 * MiB)) as s:
        yield s


def _leftovers(session_id: str, sandbox_pid: int | None, run_dir: Path) -> list[str]:
    """What a closed session left on the host (empty when nothing)."""
    left: list[str] = []
    if sandbox_pid is not None and hostscan.alive(sandbox_pid):
        left.append(f"sandbox init {sandbox_pid} alive")
    if run_dir.exists():
        left.append(f"run directory {run_dir}")
    left += [f"mount {m}" for m in hostscan.mounts_under(run_dir)]
    owner = workspace.owner_tag()
    left += [str(c) for c in hostscan.cgroups_of(owner) if c.name == f"{owner}.{session_id}"]
    return left


def _assert_gone(s: Session) -> None:
    pid, run_dir = s.sandbox_pid, s.run_dir
    assert hostscan.wait_until(lambda: not _leftovers(s.id, pid, run_dir), timeout=10), _leftovers(
        s.id, pid, run_dir
    )


def _wait_ended(s: Session, timeout: float = 60) -> str:
    assert hostscan.wait_until(lambda: s.ended is not None, timeout=timeout), "session still alive"
    assert s.ended is not None
    return s.ended


# -- state ----------------------------------------------------------------------------------


def test_state_persists_across_cells(session: Session) -> None:
    first = session.run("import json\nx = 41\nopen('notes.txt', 'w').write('kept')")
    assert first.outcome is Outcome.OK, first.stderr
    second = session.run("print(json.dumps({'x': x + 1}), open('notes.txt').read())")
    assert second.outcome is Outcome.OK, second.stderr
    assert second.stdout == '{"x": 42} kept\n'
    assert session.files() == ["notes.txt"]


def test_bash_cells_share_the_sandbox_and_are_recorded_as_bash(
    executor: Executor, session: Session
) -> None:
    wrote = session.run(
        'printf "%s" "$GREETING" > from_bash.txt; pwd; exit 4',
        language="bash",
        env={"GREETING": "hello"},
    )
    assert wrote.outcome is Outcome.ERROR and wrote.exit_code == 4, wrote.stderr
    entry = executor.audit.get(wrote.run_id)
    assert entry is not None
    assert entry.record["language"] == "bash"
    assert str(entry.record["code"]).startswith('printf "%s"')  # the program, not the wrapper
    assert session.run("print(open('from_bash.txt').read())").stdout == "hello\n"
    with pytest.raises(ConfigError, match="Bash cells"):
        session.run("print(1)", env={"X": "1"})


def test_cells_show_values_and_figures(session: Session) -> None:
    session.run("import matplotlib.pyplot as plt\nvalue = 6 * 7")
    shown = session.run("value")
    assert shown.outcome is Outcome.OK
    assert [(o.kind, o.data.get("text/plain")) for o in shown.outputs] == [("value", "42")]
    figure = session.run("plt.plot([1, 2, 3]);")
    assert figure.outcome is Outcome.OK, figure.stderr
    assert [o.kind for o in figure.outputs] == ["figure"]
    media = sorted(a.media_type for a in figure.outputs[0].artifacts)
    assert media == ["image/png", "image/svg+xml"]


def test_cell_errors_keep_the_session(session: Session) -> None:
    session.run("y = 1")
    failed = session.run("1 / 0")
    assert failed.outcome is Outcome.ERROR
    assert "ZeroDivisionError" in failed.stderr
    assert "kernel" not in failed.stderr  # the traceback shows the cell, not the kernel
    exited = session.run("import sys; sys.exit(3)")
    assert exited.outcome is Outcome.ERROR
    assert exited.exit_code == 3
    assert session.run("print(y)").stdout == "1\n"


def test_endless_cell_is_interrupted_and_state_kept(session: Session) -> None:
    session.run("counter = 7")
    looped = session.run("while True:\n    counter += 0", timeout_s=1)
    assert looped.outcome is Outcome.TIMEOUT
    assert "interrupted" in looped.reason and "kept" in looped.reason
    assert "KeyboardInterrupt" in looped.stderr
    assert session.ended is None
    after = session.run("print(counter)")
    assert after.outcome is Outcome.OK
    assert after.stdout == "7\n"


def test_cell_ignoring_sigint_ends_the_session(executor: Executor) -> None:
    s = executor.session()
    s.run("v = 1")
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    stuck = s.run(code, timeout_s=1)
    assert stuck.outcome is Outcome.TIMEOUT
    assert "did not stop" in stuck.reason and "session ended" in stuck.reason
    assert s.ended is not None
    with pytest.raises(SessionEnded, match="has ended"):
        s.run("print(v)")
    _assert_gone(s)


def test_output_cap_interrupts_the_cell_only(executor: Executor) -> None:
    with executor.session(limits=Limits(stdout_bytes=4096)) as s:
        s.run("z = 5")
        flood = s.run("while True:\n    print('x' * 100)", timeout_s=20)
        assert flood.outcome is Outcome.OUTPUT_LIMIT
        assert flood.stdout_truncated
        assert len(flood.stdout) <= 4096
        assert s.run("print(z)").stdout == "5\n"


# -- limits of the whole session ------------------------------------------------------------


def test_memory_limit_holds_across_cells(executor: Executor) -> None:
    with executor.session(limits=Limits(memory_bytes=160 * MiB)) as s:
        kept = s.run("a = b'1' * (100 * 1024 * 1024)\nprint(len(a))")
        assert kept.outcome is Outcome.OK, kept.reason
        # Alone this fits the limit; on top of the first cell's memory it does not.
        more = s.run("b = b'2' * (100 * 1024 * 1024)")
        assert more.outcome is Outcome.MEMORY_LIMIT, (more.reason, more.stderr)
        assert "session" in more.reason
        # Under cgroups the kernel is killed and the session ends (reported as such).
        if s.ended is not None:
            assert "ended" in more.reason
            _assert_gone(s)


def test_idle_timeout_ends_the_session(executor: Executor) -> None:
    s = executor.session(idle_timeout_s=1)
    s.run("w = 1")
    assert "idle" in _wait_ended(s)
    with pytest.raises(SessionEnded, match="idle"):
        s.run("print(w)")
    _assert_gone(s)


def test_idle_time_starts_when_the_sandbox_is_up(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A start longer than the idle timeout (a microVM booting cold under emulation takes
    # seconds), made so here by delaying the real sandbox's start: the session must still take
    # its first cell, not end idle the moment it opens.
    from sandcell.backends.namespaces.session import SessionSandbox

    start = SessionSandbox.start

    def slow_start(self: SessionSandbox) -> None:
        time.sleep(2.5)
        start(self)

    monkeypatch.setattr(SessionSandbox, "start", slow_start)
    s = executor.session(idle_timeout_s=2)
    time.sleep(0.5)  # the caller does something else first; the session is up, not yet idle
    first = s.run("print('up')")
    assert (first.outcome, first.stdout) == (Outcome.OK, "up\n"), first.reason
    assert "idle" in _wait_ended(s)
    _assert_gone(s)


def test_max_lifetime_ends_a_running_cell(executor: Executor) -> None:
    s = executor.session(max_lifetime_s=3)
    cell = s.run("import time\ntime.sleep(120)", timeout_s=120)
    assert cell.outcome is Outcome.TIMEOUT
    assert "maximum lifetime" in cell.reason
    assert s.ended is not None
    _assert_gone(s)


def test_max_lifetime_ends_an_idle_session(executor: Executor) -> None:
    s = executor.session(max_lifetime_s=2, idle_timeout_s=600)
    assert "maximum lifetime" in _wait_ended(s)
    _assert_gone(s)


# -- cleanup, record, policy, isolation -------------------------------------------------------


def test_close_leaves_nothing_behind(executor: Executor) -> None:
    s = executor.session()
    s.run(
        "import subprocess\np = subprocess.Popen(['sleep', '600'])\n"
        "open('big', 'wb').write(b'0' * 4096)"
    )
    pid = s.sandbox_pid
    assert pid is not None
    members = hostscan.pid_namespace_members(pid)
    assert any("sleep" in p.cmdline for p in members)
    end = s.close(exports=["big"])
    assert [a.path for a in end.artifacts] == ["big"]
    _assert_gone(s)
    assert not [p for p in members if hostscan.alive(p.pid)]
    assert s.close().reason == "closed"  # idempotent


def test_every_cell_is_a_recorded_run(session: Session, executor: Executor) -> None:
    results = [session.run("q = 2"), session.run("print(q * 21)")]
    for r in results:
        assert r.session_id == session.id
        entry = executor.audit.get(r.run_id)
        assert entry is not None
        assert entry.record["session_id"] == session.id
        assert entry.record["code"] in ("q = 2", "print(q * 21)")
        assert entry.record["outcome"] == "ok"
    assert results[1].enforcement is not None
    assert "session" in results[1].enforcement.layers


def test_denied_cell_does_not_run_and_session_continues(executor: Executor) -> None:
    with executor.session(profile="strict") as s:
        assert s.run("n = 1").outcome is Outcome.OK
        denied = s.run("n = 2\nimport ctypes")
        assert denied.outcome is Outcome.DENIED
        assert "py.native" in denied.reason
        assert denied.session_id == s.id
        entry = executor.audit.get(denied.run_id)
        assert entry is not None and entry.record["outcome"] == "denied"
        assert entry.record["session_id"] == s.id
        after = s.run("print(n)")
        assert after.outcome is Outcome.OK
        assert after.stdout == "1\n"


def test_two_sessions_cannot_see_each_other(executor: Executor) -> None:
    with executor.session() as a, executor.session() as b:
        a.run("secret = 'a-only'\nopen('a.txt', 'w').write('a')")
        probe = b.run(
            "import os\nprint('secret' in globals(), os.path.exists('a.txt'), "
            "sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
        )
        assert probe.outcome is Outcome.OK, probe.stderr
        seen_secret, seen_file, pids = probe.stdout.split(" ", 2)
        assert (seen_secret, seen_file) == ("False", "False")
        # Only b's own sandbox: its init, the boot, the kernel.
        assert len(json.loads(pids)) <= 3
        assert a.sandbox_pid is not None and b.sandbox_pid is not None
        assert hostscan.pid_namespace(a.sandbox_pid) != hostscan.pid_namespace(b.sandbox_pid)


# -- the command line -------------------------------------------------------------------------


Cli = Callable[[list[str]], "subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]"]


def _cli_cycle(call: Cli, mode_args: list[str]) -> None:
    """start, run (state kept), list, close, and the session is gone from list."""
    start = call(["session", "start", "--profile", "unchecked", "--json", *mode_args])
    assert start.returncode == 0, start.stderr
    sid = json.loads(start.stdout)["id"]
    try:
        first = call(["session", "run", sid, "--json", "-c", "x = 20\nprint('set')"])
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["session_id"] == sid
        second = call(["session", "run", sid, "-c", "print(x + 22)"])
        assert second.returncode == 0, second.stderr
        assert _text(second.stdout) == "42\n"
        value = call(["session", "run", sid, "-c", "x * 2"])
        assert "Out[1]: 40" in _text(value.stdout)
        timed = call(["session", "run", sid, "--timeout", "1", "-c", "while True: pass"])
        assert timed.returncode == 124
        listed = call(["session", "list", "--json"])
        rows = {r["id"]: r for r in json.loads(listed.stdout)}
        assert rows[sid]["backend"] == "namespaces", rows
        table = _text(call(["session", "list"]).stdout).splitlines()
        assert table[0].split()[:4] == ["ID", "PID", "PROFILE", "BACKEND"], table
        assert [line.split()[3] for line in table if line.startswith(sid)] == ["namespaces"]
    finally:
        closed = call(["session", "close", sid])
    assert closed.returncode == 0, closed.stderr
    after = call(["session", "run", sid, "-c", "print(x)"])
    assert after.returncode == 78
    assert "no live session" in _text(after.stderr)
    assert sid not in [r["id"] for r in json.loads(call(["session", "list", "--json"]).stdout)]


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def test_cli_session_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}

    def call(args: list[str]) -> subprocess.CompletedProcess[str]:
        return run_cli(args, env=env)

    _cli_cycle(call, [])


def test_cli_session_as_unprivileged_user(unpriv: UnprivEnv) -> None:
    def call(args: list[str]) -> subprocess.CompletedProcess[bytes]:
        return run_as_user(unpriv, args)

    mode = ["--isolation", unpriv.mode.value]
    _cli_cycle(call, mode)
    leftovers = hostscan.runs_dir_leftovers(unpriv.runs)
    assert not [p for p in leftovers if "/" in p], leftovers


def test_cli_idle_timeout_ends_the_server(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root; this test run is not root")
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    start = run_cli(
        ["session", "start", "--profile", "unchecked", "--idle-timeout", "1", "--json"], env=env
    )
    assert start.returncode == 0, start.stderr
    sid = json.loads(start.stdout)["id"]
    pid = json.loads((tmp_path / "home" / "sessions" / f"{sid}.json").read_text())["pid"]

    def gone() -> bool:
        return not hostscan.alive(pid)

    assert hostscan.wait_until(gone, timeout=60), "the session server outlived its idle timeout"
    assert not (tmp_path / "home" / "sessions" / f"{sid}.sock").exists()
    listed = run_cli(["session", "list", "--json"], env=env)
    assert json.loads(listed.stdout) == []


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
