"""``sandcell run`` through the command's first step (:mod:`sandcell._entry`) against a real
``sandcell serve`` on its real local socket: the exit status, stdout and stderr are those of the
full command line (:func:`sandcell.cli.main`) for the same call; the run is sent once; a service
that is gone, a stale socket and bad input are what they are without this step."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from tests.service.server import REPO, ServiceProcess, add_tenant

# The command's first step, then (in a file named by $MODULES_OUT) the modules it loaded.
_FIRST_STEP = (
    "import os, sys\n"
    "from sandcell._entry import main\n"
    "status = main()\n"
    "with open(os.environ['MODULES_OUT'], 'w') as f:\n"
    "    f.write('\\n'.join(sorted(sys.modules)))\n"
    "sys.exit(status)\n"
)
# The full command line, as it was before the first step existed.
_FULL = "import sys\nfrom sandcell.cli import main\nsys.exit(main())\n"
# Run ids, approval ids: what differs between two runs of the same call.
_IDS = re.compile(r"\b[0-9a-f]{12,32}\b")


@pytest.fixture(scope="module")
def key(service: ServiceProcess, home: Path) -> str:
    return add_tenant(home, "fast", profiles=("strict", "analysis"))


class Call:
    def __init__(self, done: subprocess.CompletedProcess[str], modules: set[str]) -> None:
        self.status = done.returncode
        self.stdout = done.stdout
        self.stderr = done.stderr
        self.modules = modules

    @property
    def seen(self) -> tuple[int, str, str]:
        """What a person sees, ids aside."""
        return self.status, _IDS.sub("ID", self.stdout), _IDS.sub("ID", self.stderr)

    @property
    def served_here(self) -> bool:
        """Whether the first step printed the result itself (no argparse, no executor)."""
        return "argparse" not in self.modules and "sandcell.executor" not in self.modules


def _call(
    script: str, args: tuple[str, ...], *, home: Path, env: Mapping[str, str], tmp: Path
) -> Call:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    out = tmp / "modules.txt"
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home), "MODULES_OUT": str(out), **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    modules = set(out.read_text().split()) if out.exists() else set()
    return Call(done, modules)


def _runs(home: Path) -> int:
    """Runs the service knows (each tenant's, as it records who owns what)."""
    with sqlite3.connect(home / "service.sqlite3") as db:
        (count,) = db.execute("SELECT count(*) FROM owned WHERE kind = 'run'").fetchone()
    return int(count)


def _both(
    args: tuple[str, ...], *, home: Path, env: Mapping[str, str], tmp: Path
) -> tuple[Call, Call, int]:
    """The call through the first step and through the full command line, and how many runs
    the first step left in the service's books: as many as the full command line did."""
    before = _runs(home)
    fast = _call(_FIRST_STEP, args, home=home, env=env, tmp=tmp)
    sent = _runs(home) - before
    full = _call(_FULL, args, home=home, env=env, tmp=tmp)
    assert _runs(home) - before == 2 * sent, (args, sent)
    return fast, full, sent


PROGRAM = "import sys\nprint(6 * 7)\nprint('to stderr', file=sys.stderr, end='')\nsys.exit(3)\n"


def test_plain_runs_print_what_the_full_command_line_prints(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    program = tmp_path / "prog.py"
    program.write_text("print('from a file')\n")
    env = {"SANDCELL_API_KEY": key}
    for args in (
        ("run", "-c", PROGRAM),
        ("run", "-c", "pass"),
        ("run", "--lang", "bash", "-c", "echo hi; echo err >&2; exit 7"),
        ("run", str(program), "--profile", "analysis"),
        ("--home", str(home), "run", "-c", "print('é \\x1b[31m\\u202e')"),
    ):
        fast, full, sent = _both(args, home=home, env=env, tmp=tmp_path)
        assert fast.seen == full.seen, args
        assert fast.served_here and sent == 1, (args, sent)
    fast, _, _ = _both(("run", "-c", PROGRAM), home=home, env=env, tmp=tmp_path)
    assert (fast.status, fast.stdout, fast.stderr) == (3, "42\n", "to stderr")
    fast, full, sent = _both(("run", "-c", PROGRAM, "--json"), home=home, env=env, tmp=tmp_path)
    assert fast.served_here and sent == 1 and fast.status == full.status == 3
    a, b = json.loads(fast.stdout), json.loads(full.stdout)
    assert a.keys() == b.keys() and a["stdout"] == b["stdout"] == "42\n"
    assert (a["outcome"], a["exit_code"], fast.stderr) == ("error", 3, "")


def _command(args: tuple[str, ...], *, home: Path, env: Mapping[str, str]) -> Call:
    """``sandcell ARGS`` through bin/sandcell itself, started as its ``#!python`` line says."""
    script = REPO / "bin" / "sandcell"
    flags = script.read_text(encoding="utf-8").splitlines()[0].removeprefix("#!python").split()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    done = subprocess.run(
        [sys.executable, *flags, str(script), *args],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return Call(done, set())


def test_the_command_itself_prints_all_of_it_before_it_ends(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    """bin/sandcell ends a call it served without the interpreter's finalization: what it
    printed is all out first (a last line without a newline, and more than a pipe holds),
    with the same exit status as the full command line; a full report ends as it always did."""
    env = {"SANDCELL_API_KEY": key}
    big = "import sys\nprint('x' * 200_000)\nprint('end', file=sys.stderr, end='')\nsys.exit(5)"
    for args in (
        ("run", "-c", PROGRAM),
        ("run", "-c", big),
        ("run", "-c", "import subprocess"),  # held for approval: the full report
    ):
        before = _runs(home)
        command = _command(args, home=home, env=env)
        assert _runs(home) > before, args  # sent, not run here
        full = _call(_FULL, args, home=home, env=env, tmp=tmp_path)
        assert command.seen == full.seen, args
    assert (command.status, command.stdout) == (125, "")
    command = _command(("run", "-c", big), home=home, env=env)
    assert (command.status, len(command.stdout), command.stderr) == (5, 200_001, "end")
    command = _command(("run", "-c", PROGRAM, "--json"), home=home, env=env)
    assert command.status == 3 and json.loads(command.stdout)["stderr"] == "to stderr"


def _answer(service: ServiceProcess, key: str, code: str, language: str = "python") -> bytes:
    """The service's whole answer to ``POST /v1/runs``, as the first step reads it."""
    body = json.dumps({"code": code, "language": language}).encode()
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(service.socket))
        s.sendall(head.encode() + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_the_same_answer_prints_the_same_bytes_either_way(
    service: ServiceProcess, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One real answer, printed by the first step and by the full report: byte for byte the
    same stdout, stderr and exit status, as text and as --json."""
    from sandcell import _entry
    from sandcell.cli.remote import Target
    from sandcell.cli.remote_run import report_answer

    target = Target(key=key, socket=service.socket)
    for code, language in (
        (PROGRAM, "python"),
        ("print('é ü 中文 \\u2028 \\\\ \"quoted\" \\t', 1.5, 10**20)", "python"),
        ("pass", "python"),
        ("printf 'no newline'; echo to-err >&2", "bash"),
    ):
        answer = _answer(service, key, code, language)
        for as_json in (False, True):
            status = _entry._print_plain(answer, as_json=as_json)
            fast = capsys.readouterr()
            assert status is not None, (code, as_json)  # printed by the first step
            assert report_answer(target, answer, as_json=as_json) == status
            full = capsys.readouterr()
            assert (fast.out, fast.err) == (full.out, full.err), (code, as_json)


def _on_terminal(
    script: str, args: tuple[str, ...], *, home: Path, env: Mapping[str, str], tmp: Path
) -> tuple[int, str, set[str]]:
    """The call with stdout and stderr on a terminal (a pty): its status, what the terminal
    showed, and the modules it loaded."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    out = tmp / "modules.txt"
    out.unlink(missing_ok=True)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home), "MODULES_OUT": str(out), **env},
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    status = proc.wait(180)
    modules = set(out.read_text().split()) if out.exists() else set()
    return status, _IDS.sub("ID", shown.decode()), modules


def test_on_a_terminal_the_output_is_what_the_full_command_line_shows(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    env = {"SANDCELL_API_KEY": key}
    for code, served_here in (
        ("print('plain text')\nprint('tab\\tCRLF', end='\\r\\n')", True),
        ("print('\\x1b]0;title\\x07\\x1b[31mred\\u202e')", False),  # neutralised there
    ):
        fast = _on_terminal(_FIRST_STEP, ("run", "-c", code), home=home, env=env, tmp=tmp_path)
        full = _on_terminal(_FULL, ("run", "-c", code), home=home, env=env, tmp=tmp_path)
        assert fast[:2] == full[:2] and fast[0] == 0, (code, fast[1], full[1])
        assert ("argparse" not in fast[2]) is served_here, code
    assert "\\x1b]0;title" in fast[1] and "\x1b" not in fast[1]


def test_what_sandcell_has_to_say_is_the_full_reports(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    """Runs that end otherwise and refusals: sent once by the first step, and reported by the
    full command line's own code (same lines, same exit status)."""
    env = {"SANDCELL_API_KEY": key}
    for args, status in (
        (("run", "-c", "import subprocess"), 125),  # held for approval: its findings
        (("run", "--lang", "bash", "-c", "echo partial; kill -9 $$"), 137),
        (("run", "-c", "pass", "--profile", "nosuch"), 78),  # the service's 4xx
    ):
        fast, full, sent = _both(args, home=home, env=env, tmp=tmp_path)
        assert fast.status == status, (args, fast.stderr)
        assert not fast.served_here and (sent > 0) == (status != 78), (args, sent)
        assert fast.seen == full.seen, args
    wrong = {"SANDCELL_API_KEY": "sc_not-a-key"}
    fast, full, sent = _both(("run", "-c", "pass"), home=home, env=wrong, tmp=tmp_path)
    assert fast.seen == full.seen and fast.status == 78 and sent == 0
    assert "refused the key in SANDCELL_API_KEY" in fast.stderr


def test_bad_input_gets_the_full_command_lines_error(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    env = {"SANDCELL_API_KEY": key}
    for args, status, said in (
        (("run", "-c", "x", "prog.py"), 78, "either as FILE or with -c"),
        (("run",), 78, "no program given"),
        (("run", str(tmp_path / "missing.py")), 78, "does not exist"),
        (("run", "--lang", "cobol", "-c", "x"), 2, "unknown language 'cobol'"),
        (("run", "-c", "x", "--profile", "./mine.toml"), 78, "named profiles"),
    ):
        fast, full, sent = _both(args, home=home, env=env, tmp=tmp_path)
        assert fast.seen == full.seen and fast.status == status, (args, fast.stderr)
        assert said in fast.stderr and sent == 0, (args, fast.stderr)


def test_without_a_listening_service_the_run_happens_here(
    service: ServiceProcess, home: Path, key: str, tmp_path: Path
) -> None:
    """No socket, and a stale socket (a service that died): the run is in this process."""
    env = {"SANDCELL_API_KEY": key}
    elsewhere = tmp_path / "no-service"
    elsewhere.mkdir()
    stale_home = tmp_path / "stale"
    stale_home.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale_home / "service.sock"))  # bound, never listening, then closed
    assert (stale_home / "service.sock").exists()
    for where in (elsewhere, stale_home):
        before = _runs(home)
        fast = _call(_FIRST_STEP, ("run", "-c", PROGRAM), home=where, env=env, tmp=tmp_path)
        assert (fast.status, fast.stdout, fast.stderr) == (3, "42\n", "to stderr"), where
        assert "sandcell.executor" in fast.modules and _runs(home) == before
        assert (where / "audit.sqlite3").exists()  # recorded here
    gone = {"SANDCELL_API_KEY": key, "SANDCELL_URL": f"unix:{stale_home / 'service.sock'}"}
    fast = _call(_FIRST_STEP, ("run", "-c", "pass"), home=elsewhere, env=gone, tmp=tmp_path)
    full = _call(_FULL, ("run", "-c", "pass"), home=elsewhere, env=gone, tmp=tmp_path)
    assert fast.seen == full.seen and fast.status == 75  # an explicit URL: no fall back
    assert "cannot reach the service" in fast.stderr


@pytest.fixture
def broken_service(tmp_path: Path) -> Iterator[Path]:
    """A home whose socket accepts, reads the request and hangs up without an answer."""
    where = tmp_path / "broken"
    where.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(where / "service.sock"))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield where
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(10)


def test_an_answer_broken_off_is_the_same_error(broken_service: Path, tmp_path: Path) -> None:
    env = {"SANDCELL_API_KEY": "sc_any-key"}
    fast = _call(_FIRST_STEP, ("run", "-c", "pass"), home=broken_service, env=env, tmp=tmp_path)
    full = _call(_FULL, ("run", "-c", "pass"), home=broken_service, env=env, tmp=tmp_path)
    assert fast.seen == full.seen and fast.status == 75, fast.stderr
    assert "broke off the answer" in fast.stderr and fast.stdout == ""
    assert not (broken_service / "audit.sqlite3").exists()  # not run here instead
