"""Sessions without a sandbox: the framing, the registry, and the kernel's protocol.

The kernel is run as a plain local process here (it is standalone), with a socket pair on its
standard input as in the sandbox, so its protocol, interrupts and state are tested directly.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.backends.cell import CellScope, kernel_message
from sandcell.backends.cell.channel import ChannelError, FrameDecoder, encode
from sandcell.errors import ConfigError
from sandcell.sessions import registry

KERNEL = Path(__file__).resolve().parents[2] / "src/sandcell/backends/inside/_kernel.py"


def test_frames_decode_across_chunk_boundaries() -> None:
    data = encode({"op": "cell", "id": 1}) + encode({"op": "done", "text": "é" * 10})
    decoder = FrameDecoder(max_bytes=1024)
    got: list[dict[str, object]] = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        got += list(decoder.messages())
    assert got == [{"op": "cell", "id": 1}, {"op": "done", "text": "é" * 10}]
    assert not decoder.pending


def test_frames_over_the_cap_or_not_objects_are_refused() -> None:
    big = FrameDecoder(max_bytes=8)
    big.feed((1 << 30).to_bytes(4, "big"))
    with pytest.raises(ChannelError, match="over the 8 cap"):
        list(big.messages())
    bad = FrameDecoder(max_bytes=64)
    bad.feed(len(b"[1]").to_bytes(4, "big") + b"[1]")
    with pytest.raises(ChannelError, match="not a JSON object"):
        list(bad.messages())


def test_registry_ids_and_stale_entries(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a session id"):
        registry.check_id("../../etc")
    with pytest.raises(ConfigError, match="longer than a unix socket allows"):
        registry.socket_path(tmp_path / ("x" * 120), "0123456789abcdef")
    dead = registry.Entry(
        id="0123456789abcdef",
        pid=2**22 + 1,
        owner=f"{2**22 + 1}-1",
        profile="strict",
        created_at="now",
        idle_timeout_s=1,
        max_lifetime_s=2,
    )
    registry.write(tmp_path, dead)
    (tmp_path / "sessions" / f"{dead.id}.sock").touch()
    assert registry.read(tmp_path, dead.id) == dead
    assert registry.entries(tmp_path) == []  # its server is gone: swept
    assert list((tmp_path / "sessions").iterdir()) == []
    assert (tmp_path / "sessions").stat().st_mode & 0o777 == 0o700


class _Kernel:
    def __init__(self) -> None:
        self.host, kernel_end = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(KERNEL)],
            stdin=kernel_end.fileno(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        kernel_end.close()
        self.seq = 0
        # One decoder for the channel's life: the kernel sends "started" and "done" back to
        # back, and one read may hold both (a decoder per message would drop the second).
        self.decoder = FrameDecoder(max_bytes=1 << 20)
        self.received: list[dict[str, object]] = []

    def message(self) -> dict[str, object]:
        while not self.received:
            if not select.select([self.host], [], [], 60)[0]:
                raise ChannelError("the kernel did not answer within 60 s")
            chunk = self.host.recv(65536)
            if not chunk:
                raise ChannelError("the kernel closed the channel")
            self.decoder.feed(chunk)
            self.received += self.decoder.messages()
        return self.received.pop(0)

    def recv(self) -> dict[str, object]:
        """The next reply, past the ``started`` a cell that starts sends first."""
        while True:
            msg = self.message()
            if msg.get("op") != "started":
                return msg

    def cell(self, code: str, *, interrupt: bool = False) -> dict[str, object]:
        self.seq += 1
        self.host.sendall(encode({"op": "cell", "id": self.seq, "code": code}))
        # The host interrupts a cell only once it has said this (cell_interrupt.py).
        assert self.message() == {"op": "started", "id": self.seq}
        if interrupt:
            assert self.proc.stdout is not None
            assert self.proc.stdout.readline() == b"looping\n"
            os.kill(self.proc.pid, signal.SIGINT)
        return self.recv()


@pytest.fixture
def kernel() -> Iterator[_Kernel]:
    k = _Kernel()
    hello = k.message()
    assert hello["op"] == "hello" and hello["display"] is False
    yield k
    k.host.close()
    k.proc.wait(timeout=30)
    for stream in (k.proc.stdout, k.proc.stderr):
        assert stream is not None
        stream.close()


def test_kernel_keeps_state_and_reports_each_cell(kernel: _Kernel) -> None:
    assert kernel.cell("x = 20")["status"] == "ok"
    assert kernel.cell("import sys; sys.stdin.read()")["status"] == "ok"  # /dev/null, not ctl
    failed = kernel.cell("x / 0")
    assert (failed["status"], failed["error"]) == ("error", "ZeroDivisionError")
    exited = kernel.cell("raise SystemExit(4)")
    assert (exited["status"], exited["exit_code"]) == ("exit", 4)
    assert kernel.cell("print('x is', x + 22, flush=True)")["status"] == "ok"
    assert kernel.proc.stdout is not None
    assert kernel.proc.stdout.readline() == b"x is 42\n"


def test_sigint_interrupts_a_cell_not_the_kernel(kernel: _Kernel) -> None:
    kernel.cell("y = 1")
    reply = kernel.cell("print('looping', flush=True)\nwhile True:\n    y += 0", interrupt=True)
    assert reply["status"] == "interrupted"
    # Between cells SIGINT is ignored: the kernel stays up.
    os.kill(kernel.proc.pid, signal.SIGINT)
    assert kernel.cell("print(json_ok := y)")["status"] == "ok"
    assert kernel.proc.poll() is None


def test_kernel_scopes_have_their_own_variables_and_directories(
    kernel: _Kernel, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()

    def ask(code: str, scope: CellScope | None = None) -> str:
        """The reply's status and, when ok, what the cell printed."""
        kernel.seq += 1
        kernel.host.sendall(encode(kernel_message(kernel.seq, code, scope)))
        reply = kernel.recv()
        assert reply["id"] == kernel.seq
        if reply["status"] != "ok" or not code:
            return str(reply["status"])
        assert kernel.proc.stdout is not None
        return kernel.proc.stdout.readline().decode().strip()

    one = CellScope(name="one", cwd=str(tmp_path / "a"))
    home = ask("import os\nx = 'main'\nprint(os.getcwd(), flush=True)")
    assert ask("x = 1\nprint(__name__, flush=True)", one) == "__main__"
    assert ask("x = 2\nprint('set', flush=True)", CellScope(name="two")) == "set"
    assert ask("import os\nprint(x, os.getcwd(), flush=True)", one) == f"1 {tmp_path / 'a'}"
    # The first cell of "two" gave no directory: the kernel's, at that moment.
    two = "import os\nprint(x, os.getcwd(), flush=True)"
    assert ask(two, CellScope(name="two")) == f"2 {home}"
    assert ask("print(x, os.getcwd(), flush=True)") == f"main {home}"
    assert ask("", CellScope(name="one", drop=True)) == "ok"
    assert ask("x", one) == "error"  # dropped: a fresh namespace
    assert ask("print(x, flush=True)", CellScope(name="two")) == "2"
    # A scope whose directory is gone fails its cells, not the kernel.
    assert ask("x = 3", CellScope(name="lost", cwd=str(tmp_path / "none"))) == "error"
    # A malformed scope is a protocol error, never a cell in the main namespace.
    kernel.host.sendall(encode({"op": "cell", "id": 99, "code": "x = 'forged'", "scope": 7}))
    assert kernel.recv() == {"op": "done", "id": 99, "status": "error", "error": "protocol"}
    assert ask("print(x, flush=True)") == "main"


def test_kernel_ends_when_the_channel_closes() -> None:
    k = _Kernel()
    assert json.loads(json.dumps(k.recv()))["op"] == "hello"
    k.host.close()
    assert k.proc.wait(timeout=30) == 0
    for stream in (k.proc.stdout, k.proc.stderr):
        assert stream is not None
        stream.close()
