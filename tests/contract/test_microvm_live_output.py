"""Live output on the microVM backend, for real: the host sees what a program printed while the
program still runs, for a run and for a session's cell.

The program prints a line on stdout and one on stderr, then waits on the run's tool socket (the
guest agent carries the connection over the same channel as the output) for a word that a server
on the host sends only once the output sink has seen both lines; then it prints more. A sink that
got output only at the end would leave the program waiting: the server gives up after a while
and the test fails. No timing is asserted.

One pooled backend (the suite's ladder executor: a restored clone per run, as a CI host with two
cores can afford); it skips with the reason where the host has no QEMU or no built guest
(``scripts/install-vm``, then ``sandcell vm build``).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import backend_unavailable, ladder_executor

from sandcell import Executor, Limits, Outcome, RunRequest
from sandcell.backends.microvm import MicroVMBackend, probe
from sandcell.backends.microvm.session import VMSessionSandbox
from sandcell.network import bridge
from sandcell.run_sockets import BRIDGE_FILE, TOOLS_FILE, TOOLS_SOCKET, SandboxSockets
from sandcell.tools import sandcell_tools

status = probe()

PROGRAM = (
    "import os, socket, sys\n"
    "print('first')\n"
    "print('warn', file=sys.stderr)\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(os.environ['SANDCELL_TOOLS_SOCKET'])\n"
    "print('got', s.recv(16).decode().strip())\n"
    "print('second')\n"
)
GIVE_UP_S = 120.0
"""How long the host's server waits for the sink before it answers with nothing (a failure)."""
STALE = (
    "the sink did not see the first lines while the program ran (a guest image built before "
    "live output holds stderr until the end: rebuild it with sandcell vm build)"
)


class _Gate:
    """A tool socket directory whose server answers ``go`` once the sink saw both lines."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sandcell-vml-", dir="/tmp"))
        (self.dir / "lib").mkdir()
        shutil.copyfile(str(bridge.__file__), self.dir / BRIDGE_FILE)
        shutil.copyfile(str(sandcell_tools.__file__), self.dir / TOOLS_FILE)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(self.dir / TOOLS_SOCKET))
        self.server.listen(4)
        self.seen = threading.Event()
        self.released_by_output: list[bool] = []
        self.told: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()
        self.sockets = SandboxSockets(host_dir=self.dir, egress=False, tools=True)

    def sink(self, stream: str, data: bytes) -> None:
        assert stream in ("stdout", "stderr")
        assert isinstance(data, bytes) and data
        with self._lock:
            self.told.append((stream, data))
            if b"first\n" in self.streamed("stdout") and b"warn\n" in self.streamed("stderr"):
                self.seen.set()

    def streamed(self, stream: str) -> bytes:
        return b"".join(d for s, d in self.told if s == stream)

    def reset(self) -> None:
        with self._lock:
            self.told.clear()
            self.seen.clear()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                released = self.seen.wait(GIVE_UP_S)
                self.released_by_output.append(released)
                if released:
                    conn.sendall(b"go\n")

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def vm(ladder_executors: dict[tuple[str, str], Executor], root_home: Path) -> MicroVMBackend:
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    backend = ladder_executor(ladder_executors, root_home, "microvm", "pool").backend
    assert isinstance(backend, MicroVMBackend)
    return backend


@pytest.fixture
def gate() -> Iterator[_Gate]:
    g = _Gate()
    yield g
    g.close()


def test_a_run_streams_its_output_while_it_runs(vm: MicroVMBackend, gate: _Gate) -> None:
    request = RunRequest(code=PROGRAM, limits=Limits(wall_time_s=GIVE_UP_S + 60))
    result = vm.run(
        request,
        run_id=uuid.uuid4().hex,
        collect=lambda _root: ((), ()),
        sockets=gate.sockets,
        on_output=gate.sink,
    )
    assert gate.released_by_output == [True], STALE
    assert result.outcome is Outcome.OK, result.reason + result.stderr.decode(errors="replace")
    assert result.stdout == b"first\ngot go\nsecond\n"
    assert gate.streamed("stdout") == result.stdout
    assert gate.streamed("stderr") == result.stderr == b"warn\n"


def test_streamed_output_stops_at_the_cap(vm: MicroVMBackend, gate: _Gate) -> None:
    code = "import sys\nfor i in range(2000):\n    print(i, 'x' * 60)\n"
    request = RunRequest(code=code, limits=Limits(stdout_bytes=5000))
    result = vm.run(
        request, run_id=uuid.uuid4().hex, collect=lambda _root: ((), ()), on_output=gate.sink
    )
    assert result.outcome is Outcome.OUTPUT_LIMIT, result.reason
    assert gate.streamed("stdout") == result.stdout
    assert len(result.stdout) == 5000 and result.stdout.startswith(b"0 xxx")


def test_a_session_cell_streams_its_output_while_it_runs(vm: MicroVMBackend, gate: _Gate) -> None:
    request = RunRequest(code="", limits=Limits(stdout_bytes=1000))
    box = vm.session_sandbox(request, session_id=uuid.uuid4().hex, sockets=gate.sockets)
    assert isinstance(box, VMSessionSandbox)
    box.start()
    try:
        cell = box.run_cell(
            PROGRAM, timeout_s=GIVE_UP_S + 60, hard_deadline=None, on_output=gate.sink
        )
        assert gate.released_by_output == [True], STALE
        assert cell.outcome is Outcome.OK, cell.reason
        assert cell.stdout == b"first\ngot go\nsecond\n"
        assert gate.streamed("stdout") == cell.stdout
        assert gate.streamed("stderr") == cell.stderr == b"warn\n"
        # The next cell streams too, with a cap of its own; nothing of the first cell's.
        gate.reset()
        cell = box.run_cell(
            "print('y' * 3000)", timeout_s=60, hard_deadline=None, on_output=gate.sink
        )
        assert cell.outcome is Outcome.OUTPUT_LIMIT, cell.reason
        assert gate.streamed("stdout") == cell.stdout == b"y" * 1000
        # Without a sink a cell runs as before.
        cell = box.run_cell("print(6 * 7)", timeout_s=60, hard_deadline=None)
        assert cell.outcome is Outcome.OK and cell.stdout == b"42\n"
    finally:
        box.teardown()
