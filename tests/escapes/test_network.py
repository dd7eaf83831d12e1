"""Escapes through the network: the sandbox has its own network namespace with only a loopback
interface, so nothing reaches the host's loopback services, the local network or the internet.

Host-side listeners answer ``PONG`` to whatever reaches them and record it; a test fails if the
attack saw the answer or the listener saw the attack.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
from tests.conftest import wasm_cannot

if TYPE_CHECKING:
    from .conftest import Attack, Listener

# Refusals that show no route out: the sandbox's own loopback refusing, no route, Landlock.
NET_BLOCKED = (
    "(errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM)"
)


def _tcp_connect(host: str, port: int, family: str = "AF_INET", ok: str = NET_BLOCKED) -> str:
    return f"""
    def connect():
        s = socket.socket(socket.{family}, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(({host!r}, {port}))
            return s.recv(16) or "connected"
        finally:
            s.close()
    attempt("tcp connect to {host}:{port}", connect, ok={ok})
    """


def test_blocks_tcp_to_host_loopback(attack: Attack, tcp_listener: Listener) -> None:
    res = attack.run(_tcp_connect("127.0.0.1", tcp_listener.port))
    attack.expect_blocked(res, attempts=1)
    assert not tcp_listener.stop(), f"[{attack.identity}] ESCAPE: {tcp_listener.seen}"


def test_blocks_tcp6_to_host_loopback(attack: Attack) -> None:
    # Pyodide's emulation refuses an AF_INET6 connect with 'bad family' and no errno.
    wasm_cannot(attack.sandbox, "sockets")
    try:
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"the host has no IPv6 loopback to listen on: {exc}")
    from .conftest import Listener

    srv.listen(4)
    lst = Listener(sock=srv, port=srv.getsockname()[1]).start()
    try:
        ok = NET_BLOCKED
        if attack.sandbox.backend == "microvm":
            # The guest's loopback has no ::1 address at all; no device leads out of the guest.
            ok = ok[:-1] + ", errno.EADDRNOTAVAIL)"
        res = attack.run(_tcp_connect("::1", lst.port, "AF_INET6", ok))
        attack.expect_blocked(res, attempts=1)
    finally:
        seen = lst.stop()
    assert not seen, f"[{attack.identity}] ESCAPE: {seen}"


def test_blocks_tcp_to_private_network(attack: Attack) -> None:
    res = attack.run(_tcp_connect("10.0.0.1", 80) + _tcp_connect("192.168.1.1", 443))
    attack.expect_blocked(res, attempts=2)


def test_blocks_tcp_to_internet(attack: Attack) -> None:
    res = attack.run(_tcp_connect("1.1.1.1", 53) + _tcp_connect("8.8.8.8", 443))
    attack.expect_blocked(res, attempts=2)


def test_blocks_udp_to_host_loopback(attack: Attack, udp_listener: Listener) -> None:
    """A datagram to the host's UDP port lands in the sandbox's own loopback, where nobody listens:
    no answer comes back and the host socket receives nothing."""
    body = f"""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    try:
        for _ in range(3):
            s.sendto(b"BREACH datagram", ("127.0.0.1", {udp_listener.port}))
        reply = s.recv(16)
    except OSError as exc:
        blocked("udp round trip to the host", errname(exc))
    else:
        breach(f"the host answered {{reply!r}}")
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)
    assert not udp_listener.stop(), f"[{attack.identity}] ESCAPE: {udp_listener.seen}"


def test_blocks_dns_resolution(attack: Attack) -> None:
    wasm_cannot(attack.sandbox, "dns")
    body = """
    for name in ("example.com", "pypi.org"):
        attempt(f"resolve {name}", lambda name=name: socket.getaddrinfo(name, 80))
    def query():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        # A DNS query for example.com, type A, sent straight to a public resolver.
        q = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")
        s.sendto(q, ("8.8.8.8", 53))
        return s.recv(512)
    attempt("raw dns query to 8.8.8.8", query)
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=3)


def test_blocks_network_interfaces(attack: Attack) -> None:
    """Only ``lo`` exists (netlink is refused by seccomp, so /proc/net/dev is the fallback)."""
    wasm_cannot(attack.sandbox, "interfaces")
    body = """
    try:
        names = [n for _, n in socket.if_nameindex()]
        how = "if_nameindex"
    except OSError:
        with open("/proc/net/dev") as f:
            names = [line.split(":")[0].strip() for line in f.readlines()[2:]]
        how = "/proc/net/dev"
    if set(names) - {"lo"}:
        breach(f"interfaces {names!r} ({how})")
    else:
        blocked("find a network interface", f"only {names!r} ({how})")
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=1)


def test_blocks_bash_dev_tcp(attack: Attack, tcp_listener: Listener) -> None:
    body = f"""
    if ( exec 3<>/dev/tcp/127.0.0.1/{tcp_listener.port} ) 2>/dev/null; then
        echo "BREACH /dev/tcp connected to the host"
    else
        echo "blocked: bash /dev/tcp to the host -> failed"
    fi
    if ( exec 3<>/dev/tcp/1.1.1.1/53 ) 2>/dev/null; then
        echo "BREACH /dev/tcp connected to 1.1.1.1"
    else
        echo "blocked: bash /dev/tcp to 1.1.1.1 -> failed"
    fi
    echo ATTACK-COMPLETE
    """
    res = attack.run(_dedent(body), raw=True, lang="bash")
    attack.expect_blocked(res, attempts=2)
    assert not tcp_listener.stop(), f"[{attack.identity}] ESCAPE: {tcp_listener.seen}"


def test_blocks_curl_and_wget(attack: Attack, tcp_listener: Listener) -> None:
    port = tcp_listener.port
    body = f"""
    for url in http://127.0.0.1:{port}/ http://1.1.1.1/ https://example.com/; do
        if command -v curl >/dev/null; then
            if timeout 10 curl -sS -m 5 -o /dev/null "$url" 2>/dev/null; then
                echo "BREACH curl $url"
            else
                echo "blocked: curl $url -> failed"
            fi
        else
            echo "blocked: curl $url -> curl absent"
        fi
        if command -v wget >/dev/null; then
            if timeout 10 wget -q -T 5 -t 1 -O /dev/null "$url" 2>/dev/null; then
                echo "BREACH wget $url"
            else
                echo "blocked: wget $url -> failed"
            fi
        else
            echo "blocked: wget $url -> wget absent"
        fi
    done
    echo ATTACK-COMPLETE
    """
    res = attack.run(_dedent(body), raw=True, lang="bash")
    attack.expect_blocked(res, attempts=6)
    assert not tcp_listener.stop(), f"[{attack.identity}] ESCAPE: {tcp_listener.seen}"


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text).strip("\n") + "\n"
