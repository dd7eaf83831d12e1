"""Live output on the microVM backend, piece by piece: the guest agent's output batches (what
goes on the port, when, and never more than the cap) and the host's side (what reaches the run's
output sink, in order, while the run is still going, never more than the cap).

The guest half runs the agent's own code (the guest package, ``microvm/guest``) on a
FIFO standing in for its port; the host half runs :func:`drive` against a thread that speaks the
agent's side of the channel over a socket pair. A real VM is ``tests/contract/
test_microvm_live_output.py``'s.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.backends.host.supervise import keep
from sandcell.backends.microvm import channel
from sandcell.backends.microvm.drive import drive
from sandcell.backends.microvm.guest import batch as guest_batch
from sandcell.backends.microvm.guest.port import Port
from sandcell.spec import Limits, RunRequest


class _Port:
    """The agent's port on a FIFO; ``frames()`` parses what the agent wrote so far."""

    def __init__(self, tmp_path: Path) -> None:
        fifo = tmp_path / "port"
        os.mkfifo(fifo)
        self.reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        # Room for a whole batch and its header: the test reads only after the agent wrote.
        fcntl.fcntl(self.reader, fcntl.F_SETPIPE_SZ, 1 << 20)
        self.port = Port(str(fifo))
        self.parser = channel.FrameReader()

    def frames(self) -> list[tuple[bytes, bytes]]:
        try:
            data = os.read(self.reader, 1 << 20)
        except BlockingIOError:
            data = b""
        return self.parser.feed(data)

    def close(self) -> None:
        os.close(self.port.fd)
        os.close(self.reader)


@pytest.fixture
def port(tmp_path: Path) -> Iterator[_Port]:
    p = _Port(tmp_path)
    yield p
    p.close()


def test_small_writes_are_held_then_sent_together(port: _Port) -> None:
    batch = guest_batch.Batch(port.port, b"O", 1000)
    for line in (b"a\n", b"b\n", b"c\n"):
        batch.add(line)
    assert port.frames() == [], "small writes went out one by one"
    assert batch.since is not None
    batch.flush_due(batch.since)  # not yet due
    assert port.frames() == []
    batch.flush_due(batch.since + guest_batch.BATCH_DELAY_S)
    assert port.frames() == [(b"O", b"a\nb\nc\n")]
    assert batch.wait(0.0) is None, "nothing is held after a flush"


def test_a_large_read_goes_at_once(port: _Port) -> None:
    batch = guest_batch.Batch(port.port, b"E", 1 << 20)
    data = b"x" * guest_batch.BATCH_BYTES
    batch.add(data)
    assert port.frames() == [(b"E", data)]


def test_never_more_than_the_cap_and_the_cap_passed_goes_at_once(port: _Port) -> None:
    # The agent's cap is the host's plus one byte: that byte tells the host the cap was passed.
    batch = guest_batch.Batch(port.port, b"O", 11)
    batch.add(b"0123456789")
    assert port.frames() == []
    batch.add(b"abcdef")
    batch.add(b"more")
    assert port.frames() == [(b"O", b"0123456789a")]
    batch.flush()
    assert port.frames() == [], "bytes past the cap were sent"


def test_a_new_cell_sends_what_is_held_first_and_gets_its_own_cap(port: _Port) -> None:
    batch = guest_batch.Batch(port.port, b"O", 4)
    batch.add(b"abc")
    batch.reset(4)
    assert port.frames() == [(b"O", b"abc")]
    batch.add(b"defgh")
    assert port.frames() == [(b"O", b"defg")]


def test_the_select_wait_is_bounded_by_what_is_held(port: _Port) -> None:
    idle, busy = guest_batch.Batch(port.port, b"O", 100), guest_batch.Batch(port.port, b"E", 100)
    assert guest_batch.select_timeout([idle, busy], 1.0) == 1.0
    busy.add(b"x")
    assert guest_batch.select_timeout([idle, busy], 1.0) <= guest_batch.BATCH_DELAY_S


def test_keep_tells_the_sink_only_what_fits() -> None:
    buf = bytearray()
    told: list[tuple[str, bytes]] = []

    def sink(stream: str, data: bytes) -> None:
        told.append((stream, data))

    assert keep(buf, 5, b"abc", "stdout", sink)
    assert not keep(buf, 5, b"defg", "stdout", sink)
    assert not keep(buf, 5, b"hij", "stdout", sink)
    assert bytes(buf) == b"abcde"
    assert told == [("stdout", b"abc"), ("stdout", b"de")]
    assert keep(bytearray(), 5, b"", "stderr", sink) and len(told) == 2


class _FakeAgent(threading.Thread):
    """The agent's side of one run: reads the job up to ``G``, sends ``first`` on stdout and
    ``warn`` on stderr, waits until ``release`` is set (by the host's sink, or a timeout),
    then sends the rest of the output, more than the stdout cap, and its exit report."""

    def __init__(self, sock: socket.socket, release: threading.Event) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.release = release
        self.released_by_output: bool | None = None

    def run(self) -> None:
        reader = channel.FrameReader(allowed=frozenset({b"J", b"F", b"D", b"S", b"G", b"K"}))
        seen: list[bytes] = []
        while b"G" not in seen:
            data = self.sock.recv(1 << 16)
            if not data:
                return
            seen += [kind for kind, _ in reader.feed(data)]
        self.sock.sendall(channel.encode(b"O", b"first\n") + channel.encode(b"E", b"warn\n"))
        self.released_by_output = self.release.wait(30)
        self.sock.sendall(channel.encode(b"O", b"second\n") + channel.encode(b"O", b"z" * 100))
        report = {"exit_code": 0, "signal": None, "oom_kill": 0, "cpu_ms": 1, "peak_bytes": 1}
        self.sock.sendall(channel.encode(b"X", json.dumps(report).encode()))
        self.sock.sendall(channel.encode(b"Z"))


def test_the_host_hands_output_to_the_sink_while_the_run_goes_on(tmp_path: Path) -> None:
    host, guest = socket.socketpair()
    release = threading.Event()
    agent = _FakeAgent(guest, release)
    agent.start()
    told: list[tuple[str, bytes]] = []

    def sink(stream: str, data: bytes) -> None:
        told.append((stream, data))
        got = {s: b"".join(d for t, d in told if t == s) for s in ("stdout", "stderr")}
        if got["stdout"] == b"first\n" and got["stderr"] == b"warn\n":
            release.set()

    request = RunRequest(code="pass", limits=Limits(stdout_bytes=50, wall_time_s=60))
    try:
        ended = drive(
            channel.Channel(host),
            request,
            run_id="live-output-test",
            sink_dir=tmp_path / "export",
            stop=threading.Event(),
            alive=lambda: True,
            export_budget=1 << 20,
            max_entries=100,
            on_output=sink,
        )
    finally:
        agent.join(timeout=30)
        host.close()
        guest.close()
    assert agent.released_by_output, "the sink saw nothing before the program went on"
    assert ended.reported and ended.stopped_by == "stdout" and ended.stdout_truncated
    streamed = b"".join(d for s, d in told if s == "stdout")
    assert streamed == bytes(ended.stdout) and len(streamed) == 50
    assert streamed.startswith(b"first\nsecond\nzzz")
    assert [d for s, d in told if s == "stderr"] == [b"warn\n"]
