"""The host's ingress gate and the in-sandbox agent, on this host's loopback (no sandbox: the
agent is the very file the sandbox runs, in a thread here), and the profile's ``[ingress]``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.errors import ConfigError
from sandcell.network import ingress
from sandcell.network.ingress import (
    IngressGate,
    IngressUnavailable,
    PortClosed,
    PortNotAllowed,
)
from sandcell.network.ingress_agent import Agent, parse_ports
from sandcell.policy.profiles import parse_profile
from sandcell.run_sockets import RunSockets


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Echo:
    """A TCP server on the host's loopback that sends back what it reads, upper-cased."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    @staticmethod
    def _one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())


@pytest.fixture
def echo() -> Iterator[_Echo]:
    server = _Echo()
    yield server
    server.sock.close()


def _gate(tmp_path: Path, ports: tuple[int, ...]) -> IngressGate:
    gate = IngressGate(ports=ports, socket_path=tmp_path / "ingress.sock")
    gate.start()
    return gate


def _agent(gate: IngressGate, ports: tuple[int, ...]) -> Agent:
    agent = Agent(str(gate.socket_path), frozenset(ports))
    threading.Thread(target=agent.serve, daemon=True).start()
    return agent


def _round_trip(sock: socket.socket, data: bytes) -> bytes:
    with sock:
        sock.settimeout(30)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def test_a_connection_is_carried_and_recorded(tmp_path: Path, echo: _Echo) -> None:
    closed = _free_port()
    gate = _gate(tmp_path, (echo.port, closed))
    try:
        _agent(gate, (echo.port, closed))
        assert _round_trip(gate.connect(echo.port, by="me"), b"hello there") == b"HELLO THERE"
        with pytest.raises(PortNotAllowed, match="not in the profile's"):
            gate.connect(1, by="me")
        with pytest.raises(PortClosed, match=f"port {closed}"):
            gate.connect(closed, by="me")
    finally:
        gate.stop()
    records = gate.records
    assert [(r.seq, r.port, r.allowed, r.by) for r in records] == [
        (1, echo.port, True, "me"),
        (2, 1, False, "me"),
        (3, closed, False, "me"),
    ]
    first = records[0]
    assert (first.bytes_to_sandbox, first.bytes_from_sandbox, first.reason) == (11, 11, "closed")


def test_only_the_first_connection_is_the_control_one(tmp_path: Path, echo: _Echo) -> None:
    gate = _gate(tmp_path, (echo.port,))
    try:
        _agent(gate, (echo.port,))
        assert _round_trip(gate.connect(echo.port), b"a") == b"A"
        # What a program in the sandbox could send on the socket: each is closed unanswered.
        for line in (b"hello\n", b"data " + b"0" * 32 + b"\n", b"x" * 1000, b"fail 1 no\n"):
            with socket.socket(socket.AF_UNIX) as rogue:
                rogue.connect(str(gate.socket_path))
                rogue.sendall(line)
                rogue.settimeout(30)
                try:
                    said = rogue.recv(10)
                except ConnectionResetError:
                    said = b""  # closed with bytes unread
                assert said == b""
        assert _round_trip(gate.connect(echo.port), b"still") == b"STILL"
    finally:
        gate.stop()


def test_without_an_agent_a_connection_is_refused(
    tmp_path: Path, echo: _Echo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingress, "AGENT_WAIT_S", 0.2)
    gate = _gate(tmp_path, (echo.port,))
    try:
        with pytest.raises(IngressUnavailable, match="agent is not connected"):
            gate.connect(echo.port)
    finally:
        gate.stop()
    assert [r.allowed for r in gate.records] == [False]


def test_stopping_ends_the_streams_and_records_them(tmp_path: Path, echo: _Echo) -> None:
    gate = _gate(tmp_path, (echo.port,))
    _agent(gate, (echo.port,))
    sock = gate.connect(echo.port, by="open")
    sock.sendall(b"x")
    sock.settimeout(30)
    assert sock.recv(1) == b"X"
    gate.stop()
    assert sock.recv(10) == b""
    sock.close()
    [record] = gate.records
    assert record.allowed and record.reason == "the session ended" and record.by == "open"
    with pytest.raises(IngressUnavailable, match="ended"):
        gate.connect(echo.port)


def test_run_sockets_take_each_cells_share(tmp_path: Path, echo: _Echo) -> None:
    text = f"[ingress]\nports = [{echo.port}]\n"
    profile = parse_profile(text.encode(), name="ports-unit", source="ports-unit.toml")
    assert RunSockets.open(profile, approver=None, approval_timeout_s=1) is None  # a run: none
    sockets = RunSockets.open(profile, approver=None, approval_timeout_s=1, ingress=True)
    assert sockets is not None and sockets.ingress is not None
    try:
        assert sockets.sandbox.ingress == (echo.port,)
        argv = sockets.sandbox.ingress_argv("/usr/bin/python3")
        assert argv is not None and argv[-2:] == ["/run/sandcell/ingress.sock", str(echo.port)]
        assert (sockets.sandbox.host_dir / "lib" / "sandcell_ingress.py").is_file()
        _agent(sockets.ingress, (echo.port,))
        _round_trip(sockets.ingress.connect(echo.port, by="cell-1"), b"1")
        first = sockets.take_record()["ingress"]
        _round_trip(sockets.ingress.connect(echo.port, by="cell-2"), b"2")
    finally:
        left = sockets.close()
    assert isinstance(first, dict) and [c["by"] for c in first["connections"]] == ["cell-1"]
    rest = left["ingress"]
    assert isinstance(rest, dict) and [c["by"] for c in rest["connections"]] == ["cell-2"]


def test_the_profiles_ingress_section() -> None:
    def ports(text: str) -> tuple[int, ...]:
        profile = parse_profile(text.encode(), name="p", source="p.toml")
        return profile.ingress.ports

    assert ports("") == ()
    assert ports("[ingress]\nports = [8000, 8888]\n") == (8000, 8888)
    for bad, why in (
        ("[ingress]\nports = [3128]\n", "egress bridge"),
        ("[ingress]\nports = [0]\n", "1-65535"),
        ("[ingress]\nports = [70000]\n", "1-65535"),
        ("[ingress]\nports = [80, 80]\n", "more than once"),
        ('[ingress]\nports = ["80"]\n', "list of integers"),
        ("[ingress]\nport = 80\n", "unknown key"),
    ):
        with pytest.raises(ConfigError, match=why):
            ports(bad)
    assert parse_ports("8000,8001") == {8000, 8001}
    with pytest.raises(ValueError):
        parse_ports("")


def test_a_flood_of_silent_connections_costs_the_host_bounded_threads(
    tmp_path: Path, echo: _Echo
) -> None:
    gate = _gate(tmp_path, (echo.port,))
    rogues: list[socket.socket] = []
    try:
        _agent(gate, (echo.port,))
        assert _round_trip(gate.connect(echo.port), b"a") == b"A"
        before = threading.active_count()
        made = 0
        for _ in range(300):
            rogue = socket.socket(socket.AF_UNIX)
            rogue.setblocking(False)
            rogues.append(rogue)
            try:
                rogue.connect(str(gate.socket_path))
                made += 1
            except BlockingIOError:
                pass  # the listener's backlog is full: refused by the kernel itself
        # Wait until the gate has taken every connection made (the agent's control one, its
        # data one, and the rogues).
        deadline = time.monotonic() + 60
        while gate._accepted < 2 + made and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate._accepted == 2 + made
        assert threading.active_count() - before <= ingress.MAX_GREETING + 1
        for rogue in rogues:
            rogue.close()
        assert _round_trip(gate.connect(echo.port), b"b") == b"B"
    finally:
        for rogue in rogues:
            rogue.close()
        gate.stop()
