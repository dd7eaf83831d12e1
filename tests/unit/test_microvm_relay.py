"""The run's sockets carried over the agent channel: the host's relay (``relay.py``) against the
guest agent's own forwarder code (``guest/forward.py``) over a socket pair, with real Unix-socket
services on the host side; and the host's relay against a hostile guest's frames."""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandcell.backends.microvm import relay
from sandcell.backends.microvm.channel import Channel, ChannelError, encode
from sandcell.backends.microvm.guest import bridge as guest_bridge
from sandcell.backends.microvm.guest import forward as guest_forward
from sandcell.backends.microvm.guest.port import Port
from sandcell.run_sockets import SandboxSockets


class _Service:
    """A host-side Unix socket service: each connection handled by ``handler`` on a thread."""

    def __init__(self, path: Path, handler: Callable[[socket.socket], None]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(256)
        self.handler = handler
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            self.handler(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _echo(conn: socket.socket) -> None:
    """Echo until the client's end of stream, then end ours."""
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@dataclass
class _Link:
    """A host relay and the agent's forwarder, joined by a socket pair."""

    pump: relay.Pump
    chan: Channel
    fwd: guest_forward.Forwarder
    """The agent's forwarder."""
    guest_dir: Path
    stop: threading.Event

    def connect(self, name: str = "egress.sock") -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(self.guest_dir / name))
        return s


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    d = tmp_path / "h"
    d.mkdir()
    return d


@contextlib.contextmanager
def _link(host_dir: Path, guest_dir: Path) -> Iterator[_Link]:
    host_sock, guest_sock = socket.socketpair()
    port = object.__new__(Port)
    port.fd = guest_sock.fileno()
    port.buf = bytearray()
    port.early = []
    os.set_blocking(port.fd, False)
    fwd = guest_forward.Forwarder(port)
    guest_dir.mkdir()
    for name, target in (("egress.sock", b"e"), ("tools.sock", b"t")):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(guest_dir / name))
        listener.listen(256)
        listener.setblocking(False)
        fwd.listeners[listener.fileno()] = (listener, target)
    chan = Channel(host_sock)
    pump = relay.Pump(chan, SandboxSockets(host_dir=host_dir, egress=True, tools=True))
    pump.start()
    stop = threading.Event()

    def guest_loop() -> None:
        # The shape of the agent's run loop: its port, and the forwarder's descriptors.
        while not stop.is_set():
            r, w, _ = select.select([port.fd, *fwd.rfds()], fwd.wfds(), [], 0.05)
            fwd.ready(r, w)
            if port.fd in r or port.early:
                for kind, payload in port.frames(0):
                    if kind == b"R":
                        fwd.on_host(payload)

    thread = threading.Thread(target=guest_loop, daemon=True)
    thread.start()
    try:
        yield _Link(pump=pump, chan=chan, fwd=fwd, guest_dir=guest_dir, stop=stop)
    finally:
        stop.set()
        thread.join(5)
        chan.close()
        guest_sock.close()
        for listener, _ in fwd.listeners.values():
            listener.close()
        for conn in fwd.conns.values():
            conn.sock.close()


def test_many_concurrent_connections_carry_every_byte_both_ways(
    host_dir: Path, tmp_path: Path
) -> None:
    """40 connections at once, each 600 kB up, echoed back, each end of stream carried."""
    service = _Service(host_dir / "egress.sock", _echo)
    results: dict[int, str] = {}
    with _link(host_dir, tmp_path / "g") as link:

        def client(i: int) -> None:
            payload = os.urandom(600_000)
            s = link.connect()
            got = bytearray()

            def reader() -> None:
                while data := s.recv(65536):
                    got.extend(data)

            t = threading.Thread(target=reader)
            t.start()
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # the guest-to-host end of stream
            t.join(60)
            s.close()
            ok = hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
            results[i] = "ok" if ok else f"{len(got)} bytes back"

        threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        deadline = time.monotonic() + 10
        while link.pump.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.pump.open_connections == 0
        assert not link.fwd.conns
    service.close()
    assert results == dict.fromkeys(range(40), "ok")
    assert service.accepted == 40


def test_a_flood_into_a_service_that_does_not_read_is_held_back(
    host_dir: Path, tmp_path: Path
) -> None:
    """A program that writes without end to a stalled service: the host holds at most a window,
    and another connection still works meanwhile."""
    release = threading.Event()

    def stalled(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        release.wait(60)
        while conn.recv(1 << 20):
            pass

    service = _Service(host_dir / "egress.sock", stalled)
    echo = _Service(host_dir / "tools.sock", _echo)
    with _link(host_dir, tmp_path / "g") as link:
        flood = link.connect()
        flood.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                sent += flood.send(b"x" * 65536)
            except BlockingIOError:
                time.sleep(0.01)
        held = link.pump.buffered_bytes
        # Everything the program pushed sits in socket buffers and at most one window per side.
        assert held <= relay.WINDOW + 65536, held
        assert sent < 16 << 20, sent
        other = link.connect("tools.sock")
        other.sendall(b"still-working")
        other.shutdown(socket.SHUT_WR)
        assert other.recv(100) == b"still-working"
        other.close()
        release.set()
        flood.close()
    service.close()
    echo.close()


def test_a_flood_from_a_service_to_a_program_that_does_not_read_is_held_back(
    host_dir: Path, tmp_path: Path
) -> None:
    total = 24 << 20

    def firehose(conn: socket.socket) -> None:
        block = b"y" * (1 << 20)
        for _ in range(total // len(block)):
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)

    service = _Service(host_dir / "egress.sock", firehose)
    with _link(host_dir, tmp_path / "g") as link:
        s = link.connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        time.sleep(1.5)
        assert link.pump.buffered_bytes <= relay.WINDOW + 65536
        guest_held = sum(len(c.out) for c in link.fwd.conns.values())
        assert guest_held <= relay.WINDOW
        got = 0
        while data := s.recv(1 << 20):  # then every byte arrives, and the end of stream
            got += len(data)
        assert got == total
        s.close()
    service.close()


def test_a_service_that_is_gone_refuses_the_program_connection(
    host_dir: Path, tmp_path: Path
) -> None:
    with _link(host_dir, tmp_path / "g") as link:  # nothing listens on the host side
        with link.connect() as s:
            # The refusal may come back before the program writes: then the write fails.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(b"hello")
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(10) == b""
        assert link.pump.open_connections == 0


# -- a hostile guest ------------------------------------------------------------------------------


def _frame(op: bytes, cid: int, data: bytes = b"") -> bytes:
    return relay.relay_frame(op, cid, data)


OPEN_E = _frame(relay.OPEN, 1, b"e")

HOSTILE = {
    "a short frame": encode(relay.RELAY, b"d\x00"),
    "an unknown op": OPEN_E + _frame(b"?", 1),
    "data for a connection never opened": _frame(relay.DATA, 7, b"x"),
    "data past the credit": OPEN_E + _frame(relay.DATA, 1, b"x" * (relay.WINDOW + 1)),
    "a credit for bytes never sent": OPEN_E + _frame(relay.CREDIT, 1, (1).to_bytes(4, "big")),
    "a reused id": OPEN_E + _frame(relay.OPEN, 1, b"e"),
    "a target the run does not serve": _frame(relay.OPEN, 1, b"t"),
    "an unknown target": _frame(relay.OPEN, 1, b"/etc/passwd"),
    "data after the end of stream": OPEN_E + _frame(relay.SHUT, 1) + _frame(relay.DATA, 1, b"x"),
    "a READY that is not JSON": _frame(relay.READY, 0, b"{oops"),
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_hostile_relay_frames_end_the_run(what: str, host_dir: Path) -> None:
    service = _Service(host_dir / "egress.sock", _echo)
    host_sock, guest_sock = socket.socketpair()
    chan = Channel(host_sock)
    pump = relay.Pump(chan, SandboxSockets(host_dir=host_dir, egress=True, tools=False))
    pump.start()
    try:
        guest_sock.sendall(encode(b"O", b"before") + HOSTILE[what])
        assert chan.recv(time.monotonic() + 10) == (b"O", b"before")
        with pytest.raises(ChannelError, match="relay protocol"):
            chan.recv(time.monotonic() + 10)
        assert pump.open_connections == 0
    finally:
        chan.close()
        guest_sock.close()
        service.close()


def test_frames_for_a_connection_closed_on_the_host_are_dropped(host_dir: Path) -> None:
    """The two sides close independently: late frames of a closed connection are no error."""
    host_sock, guest_sock = socket.socketpair()
    chan = Channel(host_sock)
    pump = relay.Pump(chan, SandboxSockets(host_dir=host_dir, egress=True, tools=False))
    pump.start()
    try:
        late = _frame(relay.DATA, 1, b"x") + _frame(relay.SHUT, 1) + _frame(relay.CLOSE, 1)
        # Nothing listens: the open is refused (CLOSE back), then the late frames arrive.
        guest_sock.sendall(OPEN_E + late + encode(b"Z"))
        assert chan.recv(time.monotonic() + 10) == (b"Z", b"")
        guest_sock.settimeout(5)
        back = guest_sock.recv(100)
        assert back == _frame(relay.CLOSE, 1)
    finally:
        chan.close()
        guest_sock.close()


def test_a_guest_flooding_other_frames_is_not_read_past_the_cap(host_dir: Path) -> None:
    """While the run's reader takes nothing, the host stops reading the channel."""
    host_sock, guest_sock = socket.socketpair()
    chan = Channel(host_sock)
    pump = relay.Pump(chan, SandboxSockets(host_dir=host_dir, egress=True, tools=False))
    pump.start()
    guest_sock.setblocking(False)
    frame = encode(b"O", b"z" * 60000)
    sent = 0
    try:
        deadline = time.monotonic() + 3
        rest = b""
        while time.monotonic() < deadline:
            try:
                rest = rest or frame
                n = guest_sock.send(rest)
                sent += n
                rest = rest[n:]
            except BlockingIOError:
                time.sleep(0.01)
        assert len(chan.pending) <= relay.PENDING_CAP + 2
        assert sent < 8 << 20, sent
        # The reader catches up: every frame arrives, in order, whole.
        got = 0
        while got < sent // len(frame):
            kind, payload = chan.recv(time.monotonic() + 10)
            assert (kind, len(payload)) == (b"O", 60000)
            got += 1
    finally:
        chan.close()
        guest_sock.close()


def test_the_agent_keeps_the_relay_s_window_and_limits() -> None:
    """The agent imports nothing: its copy of the flow control must match the host's, or the
    host would take a well-behaved guest for a hostile one."""
    assert guest_forward.RELAY_WINDOW == relay.WINDOW
    assert guest_forward.RELAY_CHUNK <= relay.CHUNK
    assert guest_forward.RELAY_MAX_CONNECTIONS == relay.MAX_CONNECTIONS
    assert guest_forward.RELAY_ID.size == relay.ID.size
    assert guest_bridge.GUEST_PYTHON == relay.GUEST_PYTHON
