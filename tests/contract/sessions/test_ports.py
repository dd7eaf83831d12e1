"""Ports of a session (issue 23): a server the program starts inside the sandbox is reached from
outside only through sandcell (``connect_port``, ``forward_port``), only on the profile's
``[ingress] ports``, every connection recorded; the sandbox still reaches nothing outside.

Real sandboxes on every rung (the microVM's from the pool): a cell starts ``python -m
http.server`` in the background with ``subprocess.Popen`` and waits until it accepts, and the
host GETs a file the cell wrote."""

from __future__ import annotations

import socket
import urllib.request
import uuid

import pytest
from tests.contract.sessions.rungs import open_session
from tests.contract.sessions.test_outside import refused_on_wasm

from sandcell import Executor, Limits
from sandcell.network.ingress import PortClosed, PortNotAllowed
from sandcell.policy.profiles import Profile, parse_profile
from sandcell.sessions import PauseMode, Session
from sandcell.spec import MiB

PORT = 8000
CLOSED = 8001
"""Listed in the profile, but nothing listens there."""
UNLISTED = 8002
LIMITS = Limits(wall_time_s=120, memory_bytes=512 * MiB)


def web_profile(ports: tuple[int, ...] = (PORT, CLOSED)) -> Profile:
    text = f"""
approval = "never"
[ingress]
ports = [{", ".join(map(str, ports))}]
[ceilings]
wall_time_s = 300
[runtime]
allowed_imports = ["*"]
[checks]
disabled = ["py.network", "py.import", "py.subprocess", "py.process"]
"""
    return parse_profile(text.encode(), name="session-ports", source="session-ports.toml")


SERVE = """
import socket, subprocess, sys, time
open("page.txt", "w").write("{body}\\n")
server = subprocess.Popen(
    [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
for _ in range(1200):
    try:
        socket.create_connection(("127.0.0.1", {port}), 1).close()
        break
    except OSError:
        if server.poll() is not None:
            raise SystemExit(f"the server ended: {{server.returncode}}")
        time.sleep(0.05)
else:
    raise SystemExit("the server did not listen")
print("serving")
"""


def serve(s: Session, body: str, port: int = PORT) -> None:
    result = s.run(SERVE.format(body=body, port=port))
    assert result.ok and "serving" in result.stdout, (result.reason, result.stderr[-2000:])


def http_get(sock: socket.socket, path: str) -> bytes:
    with sock:
        sock.settimeout(60)
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def record_of(ex: Executor, run_id: str) -> dict[str, object]:
    entry = ex.audit.get(run_id)
    assert entry is not None, run_id
    return dict(entry.record)


def test_a_server_in_the_session_is_reached_through_sandcell_and_recorded(
    rung: str, ex: Executor
) -> None:
    refused_on_wasm(rung, ex, web_profile())
    body = f"page-{uuid.uuid4().hex}"
    with open_session(ex, profile=web_profile(), limits=LIMITS) as s:
        assert s.ingress_ports == (PORT, CLOSED)
        serve(s, body)
        reply = http_get(s.connect_port(PORT, by="tester"), "/page.txt")
        assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(f"{body}\n".encode()), reply
        host, port = s.forward_port(PORT, by="forwarder")
        assert host == "127.0.0.1"
        # Read to the end of stream: a connection is recorded as it ends, before its caller is
        # told, so the next cell's record has it.
        forwarded = http_get(socket.create_connection((host, port), timeout=60), "/page.txt")
        assert forwarded.endswith(f"{body}\n".encode()), forwarded
        after = s.run("print('next cell')")
        # After the cell: its record took them; these go into the session's last entry (a
        # browser-like client that stops at the body's length included: the session's end
        # waits for its record).
        with urllib.request.urlopen(f"http://{host}:{port}/page.txt", timeout=60) as r:
            assert r.read() == f"{body}\n".encode()
        last = http_get(s.connect_port(PORT, by="late"), "/page.txt")
        assert last.endswith(f"{body}\n".encode())
        session_id = s.id
    ingress = record_of(ex, after.run_id)["ingress"]
    assert isinstance(ingress, dict) and ingress["ports"] == [PORT, CLOSED], ingress
    conns = ingress["connections"]
    assert isinstance(conns, list) and [c["by"] for c in conns] == ["tester", "forwarder"], conns
    for conn in conns:
        assert conn["allowed"] and conn["port"] == PORT and conn["reason"] == "closed", conn
        assert conn["bytes_to_sandbox"] > 0 and conn["bytes_from_sandbox"] > len(body), conn
        assert conn["ended_at"] >= conn["started_at"], conn
    leftover = [
        e.record
        for e in ex.audit.list(limit=50)
        if e.record.get("kind") == "session_ingress" and e.record.get("session_id") == session_id
    ]
    assert len(leftover) == 1, leftover
    late = leftover[0]["ingress"]
    assert isinstance(late, dict), late
    assert sorted(c["by"] for c in late["connections"]) == ["forwarder", "late"], late


def test_ports_the_profile_does_not_list_are_refused_and_recorded(rung: str, ex: Executor) -> None:
    refused_on_wasm(rung, ex, web_profile())
    with open_session(ex, profile=web_profile(), limits=LIMITS) as s:
        # A server on a port the profile does not list: the host never reaches it (on the
        # namespaces rung Landlock does not even let the program bind it).
        cell = s.run(
            "import socket\n"
            "s = socket.socket()\n"
            "try:\n"
            f"    s.bind(('127.0.0.1', {UNLISTED})); s.listen(); print('bound')\n"
            "except OSError as e:\n"
            "    print('bind refused', e.errno)\n"
        )
        assert cell.ok, cell.stderr
        with pytest.raises(PortNotAllowed, match=f"port {UNLISTED} is not in the profile"):
            s.connect_port(UNLISTED)
        with pytest.raises(PortNotAllowed):
            s.forward_port(UNLISTED)
        after = s.run("pass")
    conns = record_of(ex, after.run_id)["ingress"]["connections"]  # type: ignore[index]
    assert [(c["port"], c["allowed"]) for c in conns] == [(UNLISTED, False)], conns
    if ex.backend.name == "namespaces":
        assert "bind refused" in cell.stdout, cell.stdout


def test_a_profile_without_ingress_has_no_ports(ex: Executor) -> None:
    with open_session(ex, limits=LIMITS) as s:
        assert s.ingress_ports == ()
        with pytest.raises(PortNotAllowed, match="lists no ingress ports"):
            s.connect_port(PORT)


def test_nothing_listening_is_a_clear_error(rung: str, ex: Executor) -> None:
    refused_on_wasm(rung, ex, web_profile())
    with open_session(ex, profile=web_profile(), limits=LIMITS) as s:
        with pytest.raises(PortClosed, match=f"nothing accepted a connection on port {CLOSED}"):
            s.connect_port(CLOSED)
        after = s.run("pass")
    conns = record_of(ex, after.run_id)["ingress"]["connections"]  # type: ignore[index]
    assert [(c["port"], c["allowed"]) for c in conns] == [(CLOSED, False)], conns


ATTACK = """
import socket, urllib.request
results = {}
# The host's loopback server, from inside: the sandbox has no network of its own.
try:
    urllib.request.urlopen("http://127.0.0.1:%(host_port)d/", timeout=5)
    results["host"] = "reached"
except OSError as e:
    results["host"] = "refused"
# The ingress socket, as if it were the agent: a second hello and a made-up data id are closed.
for line in (b"hello\\n", b"data 0123456789abcdef0123456789abcdef\\n", b"open x 8000\\n"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/sandcell/ingress.sock")
        s.sendall(line)
        s.settimeout(30)
        results[line.split()[0].decode()] = s.recv(100) or b"closed"
    except OSError as e:
        results[line.split()[0].decode()] = "error"
    finally:
        s.close()
print(results)
"""


def test_the_sandbox_still_cannot_reach_out(rung: str, ex: Executor) -> None:
    refused_on_wasm(rung, ex, web_profile())
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen()
    with host, open_session(ex, profile=web_profile(), limits=LIMITS) as s:
        serve(s, "still-served")
        result = s.run(ATTACK % {"host_port": host.getsockname()[1]})
        assert result.ok, result.stderr
        said = result.stdout
        assert "'host': 'refused'" in said, said
        for word in ("hello", "data", "open"):
            assert f"'{word}': b'closed'" in said or f"'{word}': 'error'" in said, said
        # The real agent still carries the host's connections.
        reply = http_get(s.connect_port(PORT), "/page.txt")
        assert reply.endswith(b"still-served\n"), reply


def test_a_resumed_session_has_ports_of_its_own(rung: str, ex: Executor) -> None:
    refused_on_wasm(rung, ex, web_profile())
    with open_session(ex, profile=web_profile(), limits=LIMITS) as s:
        # Sockets (the ingress gate's) keep a session's pause to its files, on every rung.
        assert PauseMode.MEMORY not in s.pause_modes
        serve(s, "before the pause")
        s.pause(mode=PauseMode.FILES)
    with ex.resume(s.id, profile=web_profile()) as back:
        # Its files came back, its server did not (a files pause keeps no process).
        with pytest.raises(PortClosed):
            back.connect_port(PORT)
        serve(back, "after the resume")
        reply = http_get(back.connect_port(PORT), "/page.txt")
        assert reply.endswith(b"after the resume\n"), reply
