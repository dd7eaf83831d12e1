"""The gVisor backend's ways out, attacked where they differ from the other rungs.

A run that reaches outside gets its socket directory bound read-only at ``/run/sandcell`` and
runsc's connect-only host socket setting (``--host-uds=open``); a pooled sandbox, started before
any profile is known, has an empty directory bound under ``/run/.sandcell`` that a run fills
with hard links when it takes the sandbox. These tests drive the backend with a socket
directory of their own (a Unix socket server standing in for the egress proxy) and check that
the setting loosens nothing else: the directory cannot be written, a socket bound inside never
becomes a host socket, a host socket anywhere else stays refused, the bridge runs under the
program's uid and seccomp filter, and the directory is private on the host. The proxy's and the
gateway's own checks are ``tests/escapes/test_outside.py``'s.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell import Outcome, RunRequest, input_from_path
from sandcell.backends.base import BackendResult, Collector
from sandcell.backends.warm import WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.network import bridge
from sandcell.run_sockets import BRIDGE_FILE, EGRESS_SOCKET, TOOLS_FILE, SandboxSockets
from sandcell.tools import sandcell_tools

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these tests run as root")


@pytest.fixture(scope="module", params=["cold", "pool"])
def gv(request: pytest.FixtureRequest) -> Iterator[object]:
    from sandcell.backends.gvisor import GVisorBackend

    warm = None if request.param == "cold" else WarmConfig(mode="pool", preload=(), pool_size=1)
    try:
        backend = GVisorBackend(warm=warm)
    except IsolationUnavailable as exc:
        pytest.skip(f"gVisor is not usable here: {exc}")
    if not backend.runsc.host_uds:
        backend.close()
        pytest.skip("this runsc has no --host-uds")
    yield backend
    backend.close()


class _Outside:
    """A socket directory as the executor makes it: 0700, the two client files, and an
    ``egress.sock`` whose server answers ``pong:`` and what it got."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sandcell-gvt-", dir="/tmp"))
        (self.dir / "lib").mkdir()
        shutil.copyfile(str(bridge.__file__), self.dir / BRIDGE_FILE)
        shutil.copyfile(str(sandcell_tools.__file__), self.dir / TOOLS_FILE)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(self.dir / EGRESS_SOCKET))
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()
        self.sockets = SandboxSockets(host_dir=self.dir, egress=True, tools=False)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"pong:" + conn.recv(100))

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[_Outside]:
    o = _Outside()
    yield o
    o.close()


def _run(
    gv: object,
    code: str,
    sockets: SandboxSockets | None,
    collect: Collector | None = None,
    **kw: object,
) -> BackendResult:
    result: BackendResult = gv.run(  # type: ignore[attr-defined]
        RunRequest(code=code, **kw),  # type: ignore[arg-type]
        run_id="sockets",
        collect=collect or (lambda ws: ((), ())),
        sockets=sockets,
    )
    return result


def _lines(result: BackendResult) -> list[str]:
    assert result.outcome is Outcome.OK, result.stderr
    return result.stdout.decode().splitlines()


def test_the_bridge_reaches_the_socket_and_the_report_says_so(
    gv: object, outside: _Outside
) -> None:
    code = """
import os, socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"ping")
print(s.recv(100).decode())
print(os.environ["http_proxy"], "/run/sandcell/lib" in sys.path)
import sandcell_tools
print(sandcell_tools.__file__)
"""
    lines = _lines(_run(gv, code, outside.sockets))
    assert lines == [
        "pong:ping",
        "http://127.0.0.1:3128 True",
        "/run/sandcell/lib/sandcell_tools.py",
    ]
    r = _run(gv, "print(1)", outside.sockets)
    pooled = gv._pool is not None  # type: ignore[attr-defined]
    # A pooled sandbox serves it: its socket view is filled as the run takes it.
    assert (r.start is not None and r.start.mode == "pool") is pooled, r.start
    assert r.enforcement is not None
    assert "egress proxy" in r.enforcement.layers["run_sockets"]
    assert "--host-uds=open" in r.enforcement.layers["network"]


def test_the_socket_directory_is_read_only(gv: object, outside: _Outside) -> None:
    code = """
import errno, os, socket
print(sorted(os.listdir("/run/sandcell")), sorted(os.listdir("/run/sandcell/lib")))
def attempt(what, fn):
    try:
        fn()
        print(what, "DONE")
    except OSError as exc:
        print(what, errno.errorcode[exc.errno])
attempt("create", lambda: open("/run/sandcell/x", "w"))
attempt("replace", lambda: os.rename("/run/sandcell/egress.sock", "/run/sandcell/y"))
attempt("unlink", lambda: os.unlink("/run/sandcell/egress.sock"))
attempt("write lib", lambda: open("/run/sandcell/lib/sandcell_tools.py", "a"))
attempt("bind", lambda: socket.socket(socket.AF_UNIX).bind("/run/sandcell/new.sock"))
"""
    lines = _lines(_run(gv, code, outside.sockets))
    assert lines[0] == "['egress.sock', 'lib'] ['sandcell_bridge.py', 'sandcell_tools.py']"
    assert not [line for line in lines[1:] if line.endswith("DONE")], lines
    assert len(lines) == 6, lines


def test_a_socket_bound_inside_never_becomes_a_host_socket(gv: object, outside: _Outside) -> None:
    seen: list[str] = []

    def collect(ws: Path) -> tuple[tuple[()], tuple[()]]:
        seen.extend(
            f"{p.name} {stat.S_ISSOCK(p.lstat().st_mode)}" for p in sorted(Path(ws).iterdir())
        )
        return ((), ())

    code = """
import socket
s = socket.socket(socket.AF_UNIX)
s.bind("/sandbox/inside.sock")
s.listen(1)
c = socket.socket(socket.AF_UNIX)
c.connect("/sandbox/inside.sock")
print("bound and reached inside")
"""
    assert _lines(_run(gv, code, outside.sockets, collect)) == ["bound and reached inside"]
    # The sentry keeps it: with --host-uds=open (not create) nothing is made on the host.
    assert not any(line.endswith("True") for line in seen), seen


def test_a_host_socket_in_an_input_is_refused_before_the_run(
    gv: object, outside: _Outside, tmp_path: Path
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    planted = socket.socket(socket.AF_UNIX)
    planted.bind(str(folder / "host.sock"))
    planted.listen(1)
    try:
        with pytest.raises(IsolationUnavailable, match=r"host\.sock is a Unix socket"):
            _run(gv, "print(1)", outside.sockets, inputs=(input_from_path(folder),))
        # Without ways out the sentry refuses to connect to it, as it always did.
        r = _run(
            gv,
            "import socket, errno\ns = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect('/inputs/data/host.sock'); print('CONNECTED')\n"
            "except OSError as e:\n    print(errno.errorcode[e.errno])\n",
            None,
            inputs=(input_from_path(folder),),
        )
        assert r.outcome is Outcome.OK and "CONNECTED" not in r.stdout.decode(), r
    finally:
        planted.close()


def test_the_bridge_runs_as_the_program_under_its_filter(gv: object, outside: _Outside) -> None:
    code = """
import os
me = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Uid")][0]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            name = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if name == "sandcell-bridge":
            status = open(f"/proc/{pid}/status").read().splitlines()
            uid = [l.split()[1] for l in status if l.startswith("Uid")][0]
            seccomp = [l.split()[1] for l in status if l.startswith("Seccomp")][0]
            print("bridge", uid == me, seccomp)
"""
    assert _lines(_run(gv, code, outside.sockets)) == ["bridge True 2"]


def test_the_sockets_are_private_on_the_host(gv: object, outside: _Outside) -> None:
    seen: dict[str, object] = {}

    def collect(ws: Path) -> tuple[tuple[()], tuple[()]]:
        ways = Path(ws).parent / "ways"
        st = ways.stat()
        seen["ways"] = (oct(st.st_mode & 0o777), st.st_uid)
        linked = [p for p in ways.rglob(EGRESS_SOCKET)]
        seen["linked"] = len(linked)
        seen["reached"] = subprocess.run(
            ["runuser", "-u", "sandcell-test", "--", "test", "-e", str(linked[0])],
            capture_output=True,
            check=False,
        ).returncode
        return ((), ())

    if subprocess.run(["id", "sandcell-test"], capture_output=True, check=False).returncode:
        pytest.skip("the user sandcell-test does not exist here")
    _lines(_run(gv, "print(1)", outside.sockets, collect))
    assert seen["ways"] == ("0o700", 0) and seen["linked"] == 1, seen
    assert seen["reached"] != 0, "another user reached the run's socket on the host"


def test_a_run_without_ways_out_sees_no_socket_directory(gv: object) -> None:
    # A pooled sandbox serves either kind of run: one that reaches nowhere finds no /run.
    code = """
import errno, os
for path in ("/run/sandcell", "/run"):
    try:
        print(os.listdir(path))
    except OSError as e:
        print(errno.errorcode[e.errno])
"""
    assert _lines(_run(gv, code, None)) == ["ENOENT", "ENOENT"]
