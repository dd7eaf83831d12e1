"""The egress proxy on its own: real clients through it, and one test per attack on it.

All traffic stays on loopback: the servers listen on 127.0.0.1 (refused targets on 127.0.0.2),
names reach them through the proxy's injected resolver, and clients reach the proxy through its
Unix socket or the loopback bridge that the sandbox will use.
"""

from __future__ import annotations

import gc
import hashlib
import http.client
import io
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.errors import ConfigError
from sandcell.network import bridge as bridge_module
from sandcell.network.addresses import MapResolver
from sandcell.network.allowlist import parse_allowlist
from sandcell.network.caps import ProxyLimits
from sandcell.network.proxy import EgressProxy
from sandcell.network.records import ConnectionRecord

from .egress_servers import (
    Listener,
    RawUpstream,
    Server,
    Servers,
    exchange,
    open_tunnel,
    read_all,
    running_proxy,
    servers,
    status_of,
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with servers(tmp_path_factory.mktemp("egress-ca")) as running:
        yield running


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "no_proxy",
        "NO_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


def hosts_for(srv: Servers, *names: str) -> tuple[str, ...]:
    return tuple(f"{n}:{srv.plain.port},{srv.tls.port}" for n in names)


def only(records: tuple[ConnectionRecord, ...]) -> ConnectionRecord:
    assert len(records) == 1, records
    return records[0]


def hello_through(sock: socket.socket, server_name: str | None, srv: Servers) -> None:
    """Start TLS on an open tunnel, naming ``server_name`` (None: no SNI)."""
    context = ssl.create_default_context()
    srv.ca.configure_trust(context)
    if server_name is None:
        context.check_hostname = False
    with context.wrap_socket(sock, server_hostname=server_name) as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        tls.recv(100)


# --------------------------------------------------------------------------------------------
# Real clients


def test_urllib_with_proxy_variables_reaches_allowed_hosts(
    srv: Servers, monkeypatch: pytest.MonkeyPatch, no_proxy_env: None
) -> None:
    with running_proxy(hosts_for(srv, "api.test")) as run:
        monkeypatch.setenv("http_proxy", run.url)
        monkeypatch.setenv("https_proxy", run.url)
        opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=srv.client_tls)
        )  # the default ProxyHandler reads the variables
        with opener.open(f"http://api.test:{srv.plain.port}/plain") as answer:
            assert answer.read() == f"hello api.test:{srv.plain.port} /plain".encode()
        with opener.open(f"https://api.test:{srv.tls.port}/secure") as answer:
            assert answer.read() == f"hello api.test:{srv.tls.port} /secure".encode()
    plain, tunnel = run.proxy.report.records
    assert (plain.method, plain.host, plain.port, plain.address) == (
        "HTTP",
        "api.test",
        srv.plain.port,
        "127.0.0.1",
    )
    assert (tunnel.method, tunnel.status, tunnel.sni) == ("CONNECT", 200, "api.test")
    for record in (plain, tunnel):
        # The client may close its end as the proxy stops: either way is a normal end.
        assert record.allowed and record.reason in ("closed", "the run ended")
        assert record.bytes_up > 0 and record.bytes_down > 0
        assert record.started_at <= record.ended_at
    report = run.proxy.report
    assert report.bytes_up == plain.bytes_up + tunnel.bytes_up
    json.dumps(report.to_record())  # ready for the run record as it is


def test_http_client_tunnel(srv: Servers) -> None:
    with running_proxy(hosts_for(srv, "api.test")) as run:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", run.bridge.port, context=srv.client_tls, timeout=10
        )
        conn.set_tunnel("api.test", srv.tls.port)
        conn.request("GET", "/via-http-client")
        assert conn.getresponse().read().endswith(b"/via-http-client")
        conn.close()
    assert only(run.proxy.report.records).sni == "api.test"


def test_curl_with_https_proxy(srv: Servers) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    with running_proxy(hosts_for(srv, "api.test")) as run:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin"),
            "https_proxy": run.url,
            "http_proxy": run.url,
        }
        ok = subprocess.run(
            [curl, "-sS", "--cacert", str(srv.ca_file), f"https://api.test:{srv.tls.port}/c"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout == f"hello api.test:{srv.tls.port} /c"
        refused = subprocess.run(
            [curl, "-sS", "--cacert", str(srv.ca_file), f"https://evil.test:{srv.tls.port}/"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert refused.returncode != 0 and "403" in refused.stderr
    assert [r.allowed for r in run.proxy.report.records] == [True, False]


def tiny_wheel() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("egressdemo/__init__.py", "")
        wheel.writestr(
            "egressdemo-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: egressdemo\nVersion: 1.0\n",
        )
        wheel.writestr(
            "egressdemo-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr("egressdemo-1.0.dist-info/RECORD", "")
    return buffer.getvalue()


def test_pip_downloads_from_an_allowed_index(srv: Servers, tmp_path: Path) -> None:
    wheel = tiny_wheel()
    name = "egressdemo-1.0-py3-none-any.whl"
    digest = hashlib.sha256(wheel).hexdigest()
    srv.tls.files["/files/" + name] = wheel
    srv.tls.files["/simple/egressdemo/"] = (
        f'<html><body><a href="/files/{name}#sha256={digest}">{name}</a></body></html>'
    ).encode()
    with running_proxy(hosts_for(srv, "api.test")) as run:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin"),
            "HOME": str(tmp_path),
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }
        pip = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--index-url",
                f"https://api.test:{srv.tls.port}/simple/",
                "--cert",
                str(srv.ca_file),
                "--proxy",
                run.url,
                "-d",
                str(tmp_path / "got"),
                "egressdemo==1.0",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (tmp_path / "got" / name).read_bytes() == wheel
    assert all(r.allowed and r.sni == "api.test" for r in run.proxy.report.records)


def test_curl_through_socks5(srv: Servers) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    with running_proxy(hosts_for(srv, "api.test")) as run:
        socks = f"socks5h://127.0.0.1:{run.bridge.port}"  # the proxy resolves the name
        env = {"PATH": os.environ.get("PATH", "/usr/bin")}
        ok = subprocess.run(
            [
                curl,
                "-sS",
                "--proxy",
                socks,
                "--cacert",
                str(srv.ca_file),
                f"https://api.test:{srv.tls.port}/s",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert ok.returncode == 0 and ok.stdout.endswith("/s"), ok.stderr
        refused = subprocess.run(
            [curl, "-sS", "--proxy", socks, f"https://other.test:{srv.tls.port}/"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        # Reply 2, "connection not allowed by ruleset" (curl names it or shows the number).
        assert refused.returncode == 97, refused.stderr
        assert "(2)" in refused.stderr or "not allowed" in refused.stderr
    allowed, denied = run.proxy.report.records
    assert (allowed.method, allowed.allowed, allowed.sni) == ("SOCKS", True, "api.test")
    assert (denied.method, denied.status, denied.allowed) == ("SOCKS", 403, False)
    assert "host other.test is not in profile fetch-data's allowlist" in denied.reason


@pytest.mark.parametrize(
    ("request_bytes", "answer", "words"),
    [
        (b"\x05\x01\x02", b"\x05\xff", "without authentication"),
        (b"\x05\x01\x00\x05\x02\x00\x03\x08api.test\x01\xbb", b"\x05\x00\x05\x07", "only CONNECT"),
        (b"\x05\x01\x00\x05\x01\x00\x09" + bytes(6), b"\x05\x00\x05\x08", "address type"),
        (
            b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x01\xbb",
            b"\x05\x00\x05\x02",
            "IP address",
        ),
        (
            b"\x05\x01\x00\x05\x01\x00\x03\x04\xff\xfe\xfd\xfc\x01\xbb",
            b"\x05\x00\x05\x01",
            "not ASCII",
        ),
        (b"\x05\x01\x00\x05\x01\x00\x03\x08api.test\x00\x00", b"\x05\x00\x05\x01", "port 0"),
    ],
)
def test_socks_requests_outside_connect_to_a_listed_name_are_refused(
    request_bytes: bytes, answer: bytes, words: str
) -> None:
    with running_proxy(("api.test",)) as run:
        got = exchange(run.path, request_bytes)
    assert got.startswith(answer), got
    record = only(run.proxy.report.records)
    assert record.method == "SOCKS" and not record.allowed and words in record.reason


def test_requests_with_proxies(srv: Servers, no_proxy_env: None) -> None:
    try:
        import requests
    except ImportError:  # pip carries its own copy of requests; it is the same client
        try:
            from pip._vendor import requests  # type: ignore[no-redef]
        except ImportError:
            pytest.skip("neither requests nor pip's copy of it is installed")
    with running_proxy(hosts_for(srv, "api.test")) as run:
        proxies = {"http": run.url, "https": run.url}
        answer = requests.get(
            f"https://api.test:{srv.tls.port}/r",
            proxies=proxies,
            verify=str(srv.ca_file),
            timeout=10,
        )
        assert answer.text == f"hello api.test:{srv.tls.port} /r"
        refused = requests.get(f"http://other.test:{srv.plain.port}/", proxies=proxies, timeout=10)
        assert refused.status_code == 403
        assert "host other.test is not in profile fetch-data's allowlist" in refused.text


def test_httpx_with_proxy(srv: Servers) -> None:
    httpx = pytest.importorskip("httpx", reason="httpx is not installed")
    with (
        running_proxy(hosts_for(srv, "api.test")) as run,
        httpx.Client(proxy=run.url, verify=srv.client_tls) as client,
    ):
        assert client.get(f"https://api.test:{srv.tls.port}/h").text.endswith("/h")


def test_the_bridge_runs_on_a_bare_interpreter(srv: Servers) -> None:
    # In the sandbox it runs under the sandbox's Python, without sandcell: standard library only.
    script = Path(bridge_module.__file__)
    with running_proxy(hosts_for(srv, "api.test")) as run:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script), "127.0.0.1:0", run.path],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", f"http://api.test:{srv.plain.port}/bare")
            assert conn.getresponse().read().endswith(b"/bare")
            conn.close()
        finally:
            child.kill()
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]
    assert only(run.proxy.report.records).allowed


def test_large_downloads_arrive_whole(srv: Servers) -> None:
    size = 3 * 2**20 + 17
    with running_proxy(hosts_for(srv, "api.test")) as run:
        plain = http.client.HTTPConnection("127.0.0.1", run.bridge.port, timeout=30)
        plain.request("GET", f"http://api.test:{srv.plain.port}/big/{size}")
        assert len(plain.getresponse().read()) == size
        plain.close()
        tls = http.client.HTTPSConnection(
            "127.0.0.1", run.bridge.port, context=srv.client_tls, timeout=30
        )
        tls.set_tunnel("api.test", srv.tls.port)
        tls.request("GET", f"/big/{size}")
        assert len(tls.getresponse().read()) == size
        tls.close()
    assert all(r.allowed and r.bytes_down > size for r in run.proxy.report.records)


def test_a_slow_reader_still_gets_the_end_of_a_response(srv: Servers) -> None:
    # The client reads slowly: the last bytes are still in the proxy's buffers when the server
    # closes, and must be delivered all the same.
    size = 2 * 2**20
    with (
        running_proxy(hosts_for(srv, "api.test")) as run,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
    ):
        sock.settimeout(10)
        sock.connect(run.path)
        sock.sendall(
            f"GET http://api.test:{srv.plain.port}/big/{size} HTTP/1.1\r\n"
            f"Host: api.test:{srv.plain.port}\r\n\r\n".encode()
        )
        chunks = []
        while chunk := sock.recv(16384):
            chunks.append(chunk)
            time.sleep(0.002)
        answer = b"".join(chunks)
    assert answer.endswith(b"\r\n\r\n" + b"x" * size)
    record = only(run.proxy.report.records)  # closing after the flush loses no record
    assert record.allowed and record.reason == "closed" and record.bytes_down > size


def test_connections_open_when_the_run_ends_are_closed_and_recorded(srv: Servers) -> None:
    with running_proxy(hosts_for(srv, "api.test")) as run:
        sock, answer = open_tunnel(run.path, f"api.test:{srv.tls.port}")
        assert status_of(answer) == 200
        report = run.proxy.stop()
        assert read_all(sock) == b""
        sock.close()
    record = only(report.records)
    assert record.reason == "the run ended" and record.address == "127.0.0.1"


# --------------------------------------------------------------------------------------------
# Attacks


def test_a_host_outside_the_allowlist_is_refused_with_a_clear_error(srv: Servers) -> None:
    with running_proxy(hosts_for(srv, "api.test")) as run:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"https": run.url, "http": run.url}),
            urllib.request.HTTPSHandler(context=srv.client_tls),
        )
        with pytest.raises(urllib.error.URLError) as info:
            opener.open(f"https://other.test:{srv.tls.port}/", timeout=10)
        message = "host other.test is not in profile fetch-data's allowlist"
        assert message in str(info.value)  # the program sees why, not just a failure
        with warnings.catch_warnings():
            # http.client (3.11) leaves the refused tunnel's response open; not ours to fix.
            warnings.simplefilter("ignore", ResourceWarning)
            del info
            gc.collect()
        with pytest.raises(urllib.error.HTTPError) as plain:
            opener.open(f"http://other.test:{srv.plain.port}/", timeout=10)
        assert plain.value.code == 403 and message in plain.value.read().decode()
        plain.value.close()
        with pytest.raises(urllib.error.HTTPError) as port:
            opener.open(f"http://api.test:{srv.plain.port + 1}/", timeout=10)
        assert port.value.code == 403 and "port" in port.value.read().decode()
        port.value.close()
    assert all("other.test" not in h for _, h, _ in srv.tls.seen + srv.plain.seen)
    records = run.proxy.report.refused
    assert [(r.host, r.status, r.address) for r in records] == [
        ("other.test", 403, None),
        ("other.test", 403, None),
        ("api.test", 403, None),
    ]


def test_an_ip_literal_is_refused_unless_listed(srv: Servers) -> None:
    with running_proxy(hosts_for(srv, "api.test")) as run:
        sock, answer = open_tunnel(run.path, f"127.0.0.1:{srv.tls.port}")
        sock.close()
        assert status_of(answer) == 403 and b"IP address" in answer
        answer = exchange(
            run.path,
            f"GET http://127.0.0.1:{srv.plain.port}/ HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{srv.plain.port}\r\n\r\n".encode(),
        )
        assert status_of(answer) == 403
    with running_proxy((f"127.0.0.1:{srv.tls.port}",), allow_addresses=()) as run:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", run.bridge.port, context=srv.client_tls, timeout=10
        )
        conn.set_tunnel("127.0.0.1", srv.tls.port)  # an address: the client sends no SNI
        conn.request("GET", "/by-address")
        assert conn.getresponse().read().endswith(b"/by-address")
        conn.close()
    record = only(run.proxy.report.records)
    assert record.allowed and record.sni is None and record.address == "127.0.0.1"


def test_a_name_resolving_to_a_refused_address_is_refused(srv: Servers) -> None:
    internal = Listener("127.0.0.2")
    resolver = MapResolver(
        {
            "internal.test": ["127.0.0.2"],
            "meta.test": ["169.254.169.254"],
            "mixed.test": ["127.0.0.1", "10.1.2.3"],
            "mapped.test": ["::ffff:127.0.0.2"],
        }
    )
    rules = tuple(
        f"{n}:{internal.port}" for n in ("internal.test", "meta.test", "mixed.test", "mapped.test")
    )
    try:
        with running_proxy(rules, resolver=resolver) as run:
            answers = {}
            for name in ("internal.test", "meta.test", "mixed.test", "mapped.test"):
                sock, answers[name] = open_tunnel(run.path, f"{name}:{internal.port}")
                sock.close()
        assert not internal.was_reached()
    finally:
        internal.close()
    assert all(status_of(a) == 403 for a in answers.values()), answers
    assert b"loopback" in answers["internal.test"]
    assert b"metadata" in answers["meta.test"]
    assert b"10.1.2.3" in answers["mixed.test"]
    assert b"embeds '127.0.0.2'" in answers["mapped.test"]
    assert all(r.address is None for r in run.proxy.report.records)


def test_loopback_and_private_targets_are_refused_by_default() -> None:
    loopback = Listener("127.0.0.1")
    resolver = MapResolver({"api.test": ["127.0.0.1"]})
    try:
        with running_proxy(
            (f"api.test:{loopback.port}",), allow_addresses=(), resolver=resolver
        ) as run:
            sock, answer = open_tunnel(run.path, f"api.test:{loopback.port}")
            sock.close()
            plain = exchange(
                run.path,
                f"GET http://api.test:{loopback.port}/ HTTP/1.1\r\n"
                f"Host: api.test:{loopback.port}\r\n\r\n".encode(),
            )
        assert not loopback.was_reached()
    finally:
        loopback.close()
    assert status_of(answer) == 403 and status_of(plain) == 403
    assert b"'127.0.0.1' is a loopback address" in answer and b"allow_addresses" in answer


def test_dns_rebinding_cannot_redirect_a_checked_connection(srv: Servers) -> None:
    # The name first answers the allowed address, then a refused one on the same port.
    rebound = Listener("127.0.0.2", srv.tls.port)
    resolver = MapResolver({"api.test": [["127.0.0.1"], ["127.0.0.2"]]})
    try:
        with running_proxy(hosts_for(srv, "api.test"), resolver=resolver) as run:
            sock, answer = open_tunnel(run.path, f"api.test:{srv.tls.port}")
            assert status_of(answer) == 200
            hello_through(sock, "api.test", srv)  # a whole TLS exchange on the pinned address
            assert resolver.calls == {"api.test": 1}
            sock, answer = open_tunnel(run.path, f"api.test:{srv.tls.port}")
            sock.close()
            assert status_of(answer) == 403 and b"127.0.0.2" in answer
        assert not rebound.was_reached()
    finally:
        rebound.close()
    first, second = run.proxy.report.records
    assert first.allowed and first.address == "127.0.0.1"
    assert not second.allowed and second.address is None


@pytest.mark.parametrize("server_name", ["other.test", None])
def test_a_tunnel_whose_sni_is_not_the_connect_host_is_closed(
    srv: Servers, server_name: str | None
) -> None:
    before = len(srv.tls.seen)
    with running_proxy(hosts_for(srv, "api.test", "other.test")) as run:
        sock, answer = open_tunnel(run.path, f"api.test:{srv.tls.port}")
        assert status_of(answer) == 200
        with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
            hello_through(sock, server_name, srv)
    assert len(srv.tls.seen) == before  # not one byte reached the server
    record = only(run.proxy.report.records)
    assert not record.allowed and record.sni == server_name and record.bytes_up == 0
    assert (
        "names other.test but CONNECT asked for api.test" if server_name else "no SNI"
    ) in record.reason


def test_a_socks_tunnel_checks_the_sni_too(srv: Servers) -> None:
    with (
        running_proxy(hosts_for(srv, "api.test")) as run,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
    ):
        sock.settimeout(10)
        sock.connect(run.path)
        sock.sendall(b"\x05\x01\x00\x05\x01\x00\x03\x08api.test" + srv.tls.port.to_bytes(2, "big"))
        answer = b""
        while len(answer) < 12:
            answer += sock.recv(12 - len(answer))
        assert answer[:4] == b"\x05\x00\x05\x00"  # no authentication; succeeded
        with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
            hello_through(sock.dup(), "other.test", srv)
    record = only(run.proxy.report.records)
    assert not record.allowed and record.bytes_up == 0 and "names other.test" in record.reason


def test_a_tunnel_that_does_not_speak_tls_is_closed(srv: Servers) -> None:
    before = len(srv.plain.seen)
    with running_proxy(hosts_for(srv, "api.test")) as run:
        sock, answer = open_tunnel(run.path, f"api.test:{srv.plain.port}")
        assert status_of(answer) == 200
        sock.sendall(b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
        assert read_all(sock) == b""
        sock.close()
    assert len(srv.plain.seen) == before
    assert "did not start with a TLS ClientHello" in only(run.proxy.report.records).reason


def test_ipv6_loopback_is_refused_by_default_and_reachable_when_allowed() -> None:
    try:
        server = Server("::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    port = server.port
    get = f"GET http://api.test:{port}/six HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode()
    resolver = MapResolver({"api.test": ["::1"]})
    try:
        with running_proxy((f"api.test:{port}",), allow_addresses=(), resolver=resolver) as run:
            refused = exchange(run.path, get)
        assert status_of(refused) == 403 and b"'::1' is a loopback address" in refused
        assert server.seen == []
        with running_proxy(
            (f"api.test:{port}",), allow_addresses=("::1",), resolver=resolver
        ) as run:
            allowed = exchange(run.path, get)
        assert status_of(allowed) == 200 and allowed.endswith(b"/six")
        assert only(run.proxy.report.records).address == "::1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_wildcard_admits_names_under_it_but_not_the_domain(srv: Servers) -> None:
    resolver = MapResolver({"www.wild.test": ["127.0.0.1"], "wild.test": ["127.0.0.1"]})
    port = srv.plain.port
    with running_proxy((f"*.wild.test:{port}",), resolver=resolver) as run:
        under = exchange(
            run.path,
            f"GET http://www.wild.test:{port}/w HTTP/1.1\r\n"
            f"Host: www.wild.test:{port}\r\n\r\n".encode(),
        )
        apex = exchange(
            run.path,
            f"GET http://wild.test:{port}/w HTTP/1.1\r\nHost: wild.test:{port}\r\n\r\n".encode(),
        )
    assert status_of(under) == 200 and status_of(apex) == 403


def test_http_1_0_without_host_is_forwarded_with_the_url_host(srv: Servers) -> None:
    port = srv.plain.port
    with running_proxy(hosts_for(srv, "api.test")) as run:
        answer = exchange(run.path, f"GET http://api.test:{port}/old HTTP/1.0\r\n\r\n".encode())
    assert status_of(answer) == 200
    assert srv.plain.seen[-1] == ("GET", f"api.test:{port}", "/old")


def test_a_tunnel_to_a_listed_address_may_not_name_a_host(srv: Servers) -> None:
    with running_proxy((f"127.0.0.1:{srv.tls.port}",), allow_addresses=()) as run:
        sock, answer = open_tunnel(run.path, f"127.0.0.1:{srv.tls.port}")
        assert status_of(answer) == 200
        with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
            hello_through(sock, "api.test", srv)  # fronting a name through an address
    record = only(run.proxy.report.records)
    assert not record.allowed and "has no name" in record.reason


def test_a_flood_of_refusals_cannot_push_allowed_connections_out_of_the_record(
    srv: Servers,
) -> None:
    port = srv.plain.port
    limits = ProxyLimits(max_refused_records=3)
    with running_proxy(hosts_for(srv, "api.test"), limits=limits) as run:
        for _ in range(5):
            assert status_of(exchange(run.path, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")) == 403
        for path in ("/after-1", "/after-2"):
            answer = exchange(
                run.path, f"GET http://api.test:{port}{path} HTTP/1.1\r\n\r\n".encode()
            )
            assert status_of(answer) == 200
    report = run.proxy.report
    assert [r.host for r in report.records if r.allowed] == ["api.test", "api.test"]
    assert len(report.refused) == 3 and report.refused_dropped == 2
    record = report.to_record()
    assert record["refused_dropped"] == 2 and len(record["connections"]) == 5  # type: ignore[arg-type]


def test_a_host_header_that_disagrees_with_the_url_is_refused(srv: Servers) -> None:
    port = srv.plain.port
    before = len(srv.plain.seen)
    with running_proxy(hosts_for(srv, "api.test", "other.test")) as run:
        for host_lines in (
            f"Host: other.test:{port}\r\n",
            f"Host: api.test:{port + 1}\r\n",
            "Host: api.test\r\n",  # port 80
            f"Host: api.test:{port}\r\nHost: other.test:{port}\r\n",
            "Host: \r\n",
        ):
            answer = exchange(
                run.path, f"GET http://api.test:{port}/ HTTP/1.1\r\n{host_lines}\r\n".encode()
            )
            assert status_of(answer) == 400, (host_lines, answer)
        assert b"Host header" in exchange(
            run.path,
            f"GET http://api.test:{port}/ HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n".encode(),
        )
        same = exchange(
            run.path,
            f"GET http://API.test:{port}/ok HTTP/1.1\r\nHost: api.TEST:{port}\r\n\r\n".encode(),
        )
        assert status_of(same) == 200
    assert [p for _, _, p in srv.plain.seen[before:]] == ["/ok"]


def test_a_second_request_cannot_ride_on_a_forwarded_one(srv: Servers) -> None:
    port = srv.plain.port
    before = len(srv.plain.seen)
    with running_proxy(hosts_for(srv, "api.test")) as run:
        answer = exchange(
            run.path,
            f"POST http://api.test:{port}/one HTTP/1.1\r\nHost: api.test:{port}\r\n"
            "Content-Length: 5\r\n\r\nhello"
            f"GET /two HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n".encode(),
        )
    assert status_of(answer) == 200 and answer.count(b"HTTP/1.1") == 1
    assert b"Connection: close" in answer
    assert srv.plain.seen[before:] == [("POST", f"api.test:{port}", "/one")]
    assert srv.plain.bodies[-1] == b"hello"


def test_chunk_framing_cannot_be_read_two_ways(srv: Servers) -> None:
    port = srv.plain.port
    head = (
        f"POST http://api.test:{port}/chunked HTTP/1.1\r\nHost: api.test:{port}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    smuggled = f"GET /smuggled HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n"
    with running_proxy(hosts_for(srv, "api.test")) as run:
        fine = exchange(
            run.path, (head + "5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" + smuggled).encode()
        )
        assert status_of(fine) == 200 and fine.endswith(b"got 5 bytes")
        assert srv.plain.bodies[-1] == b"hello"
        for body in (
            "0x5\r\nhello\r\n0\r\n\r\n",
            "+5\r\nhello\r\n0\r\n\r\n",
            "5 \r\nhello\r\n0\r\n\r\n",
            "5\r\nhelloXX0\r\n\r\n",
        ):
            answer = exchange(run.path, (head + body + smuggled).encode())
            assert status_of(answer) == 400, (body, answer)
    assert all(p != "/smuggled" for _, _, p in srv.plain.seen)


def test_a_chunked_body_is_forwarded_exactly(srv: Servers) -> None:
    with running_proxy(hosts_for(srv, "api.test")) as run:
        conn = http.client.HTTPConnection("127.0.0.1", run.bridge.port, timeout=10)
        body = [b"a" * 1000, b"b" * 70000, b"c"]
        conn.request(
            "POST", f"http://api.test:{srv.plain.port}/chunks", body=iter(body), encode_chunked=True
        )
        assert conn.getresponse().read() == b"got 71001 bytes"
        conn.close()
    assert srv.plain.bodies[-1] == b"".join(body)


def test_a_connection_flood_meets_both_connection_caps(srv: Servers) -> None:
    limits = ProxyLimits(max_concurrent=3, max_connections=6)
    get = (
        f"GET http://api.test:{srv.plain.port}/ HTTP/1.1\r\nHost: api.test:{srv.plain.port}\r\n\r\n"
    ).encode()
    with running_proxy(hosts_for(srv, "api.test"), limits=limits) as run:
        for _ in range(2):
            assert status_of(exchange(run.path, get)) == 200
        held = []
        for _ in range(3):
            sock, answer = open_tunnel(run.path, f"api.test:{srv.tls.port}")
            assert status_of(answer) == 200
            held.append(sock)
        busy = exchange(run.path, get)
        assert status_of(busy) == 503 and b"at once" in busy
        held[0].sendall(b"not tls")  # the proxy ends that tunnel, freeing a place
        assert read_all(held[0]) == b""
        assert status_of(exchange(run.path, get)) == 200
        spent = exchange(run.path, get)
        assert status_of(spent) == 429 and b"cap of 6 connections" in spent
        for sock in held:
            sock.close()
    methods = [r.method for r in run.proxy.report.records if r.status in (429, 503)]
    assert methods == ["UNREAD", "UNREAD"]


def test_byte_floods_are_cut_at_the_run_caps(srv: Servers) -> None:
    limits = ProxyLimits(max_bytes_down=200_000, max_bytes_up=100_000)
    port = srv.plain.port
    with running_proxy(hosts_for(srv, "api.test"), limits=limits) as run:
        down = exchange(
            run.path,
            f"GET http://api.test:{port}/big/1000000 HTTP/1.1\r\n"
            f"Host: api.test:{port}\r\n\r\n".encode(),
        )
        assert 0 < len(down) <= 200_000
        up = exchange(
            run.path,
            f"POST http://api.test:{port}/up HTTP/1.1\r\n"
            f"Host: api.test:{port}\r\nContent-Length: 500000\r\n\r\n".encode()
            + b"u" * 500_000,
            cut_ok=True,
        )
        assert b"got 500000 bytes" not in up
    first, second = run.proxy.report.records
    assert "download cap of 200000 bytes" in first.reason
    assert "upload cap of 100000 bytes" in second.reason
    assert run.proxy.report.bytes_down <= 200_000 and run.proxy.report.bytes_up <= 100_000
    assert all(len(b) < 500_000 for b in srv.plain.bodies)


def test_a_tls_download_is_cut_at_the_cap(srv: Servers) -> None:
    with running_proxy(
        hosts_for(srv, "api.test"), limits=ProxyLimits(max_bytes_down=300_000)
    ) as run:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", run.bridge.port, context=srv.client_tls, timeout=10
        )
        conn.set_tunnel("api.test", srv.tls.port)
        conn.request("GET", "/big/2000000")
        with pytest.raises((http.client.IncompleteRead, ssl.SSLError, ConnectionError)):
            conn.getresponse().read()
        conn.close()
    assert "download cap" in only(run.proxy.report.records).reason


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40) + b"\r\n\r\n", 400),
        (b"GET /relative HTTP/1.1\r\nHost: api.test\r\n\r\n", 400),
        (b"GET https://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 400),
        (b"CONNECT api.test HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT api.test:99999 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT a\x00b.test:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT [::1 HTTP/1.1\r\n\r\n", 400),
        (b"GET http://api.test/ HTTP/1.1\nHost: api.test\n\n\r\n\r\n", 400),
        (b"GET http://api.test/ HTTP/1.1\r\nX: y\r\n folded\r\n\r\n", 400),
        (b"GET http://api.test/ HTTP/9.9\r\n\r\n", 505),
        (
            b"POST http://api.test/ HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            b"POST http://api.test/ HTTP/1.1\r\nHost: api.test\r\n"
            b"Transfer-Encoding: xchunked\r\n\r\n",
            501,
        ),
        (b"GET http://u@api.test/ HTTP/1.1\r\n\r\n", 400),
        (b"GET http://api.test/ HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431),
        (b"GET http://api.test/ HTTP/1.1\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n", 431),
    ],
)
def test_malformed_and_oversized_requests_are_refused(
    srv: Servers, request_bytes: bytes, status: int
) -> None:
    with running_proxy(("api.test",)) as run:
        answer = exchange(run.path, request_bytes)
        assert status_of(answer) == status, answer
        assert b"sandcell egress proxy:" in answer
    record = only(run.proxy.report.records)
    assert not record.allowed and record.status == status and record.address is None


def test_a_slow_client_is_answered_408() -> None:
    with running_proxy(("api.test",), limits=ProxyLimits(idle_timeout_s=0.3)) as run:
        answer = exchange(run.path, b"GET http://api.test/ HTTP/1.1\r\nHost: ap")
        assert status_of(answer) == 408
    assert only(run.proxy.report.records).status == 408


def test_an_idle_tunnel_is_closed(srv: Servers) -> None:
    with running_proxy(hosts_for(srv, "api.test"), limits=ProxyLimits(idle_timeout_s=0.3)) as run:
        sock, answer = open_tunnel(run.path, f"api.test:{srv.tls.port}")
        assert status_of(answer) == 200
        assert read_all(sock) == b""  # no ClientHello: the proxy gives up and closes
        sock.close()
    assert only(run.proxy.report.records).reason == "idle for 0.3 s"


def test_the_socket_is_private_new_and_gone_after_stop(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    proxy = EgressProxy(profile="p", allowlist=parse_allowlist(()), socket_path=path)
    with proxy:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(ConfigError, match="exists"):
            EgressProxy(profile="p", allowlist=parse_allowlist(()), socket_path=path).start()
    assert not path.exists()
    assert proxy.stop() is proxy.report  # stopping again gives the same report
    assert proxy.report.records == ()


@pytest.fixture
def raw_upstream() -> Iterator[RawUpstream]:
    upstream = RawUpstream(body_bytes=len(SMUGGLED))
    yield upstream
    upstream.close()


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n"


@pytest.mark.parametrize(
    "named",
    ["Host, Content-Length", "content-length", "HOST", "close, Transfer-Encoding"],
)
def test_a_connection_header_cannot_unname_what_the_proxy_checked(
    raw_upstream: RawUpstream, named: str
) -> None:
    # Dropped after the checks, Host and the body's framing would leave the server to read
    # the body as a second request, for any host it serves.
    port = raw_upstream.port
    framing = (
        "Transfer-Encoding: chunked\r\n"
        if "Transfer" in named
        else f"Content-Length: {len(SMUGGLED)}\r\n"
    )
    body = f"{len(SMUGGLED):x}\r\n".encode() + SMUGGLED + b"\r\n0\r\n\r\n"
    with running_proxy((f"api.test:{port}",)) as run:
        answer = exchange(
            run.path,
            f"POST http://api.test:{port}/one HTTP/1.1\r\nHost: api.test:{port}\r\n"
            f"Connection: {named}\r\n{framing}\r\n".encode()
            + (body if "Transfer" in named else SMUGGLED),
        )
    assert status_of(answer) == 400, answer
    assert b"the Connection header names" in answer
    assert raw_upstream.accepted == 0
    record = only(run.proxy.report.records)
    assert not record.allowed and record.address is None


def test_the_upstream_receives_exactly_the_checked_head_and_body() -> None:
    upstream = RawUpstream(body_bytes=5)
    port = upstream.port
    try:
        with running_proxy((f"api.test:{port}",)) as run:
            answer = exchange(
                run.path,
                f"POST http://api.test:{port}/p?q=1 HTTP/1.1\r\nHost: api.test:{port}\r\n"
                "Connection: keep-alive, X-Hop\r\nX-Hop: between the program and the proxy\r\n"
                "Proxy-Authorization: Basic eA==\r\nX-End: kept\r\nContent-Length: 5\r\n\r\n"
                "hello".encode(),
            )
        assert status_of(answer) == 200 and answer.endswith(b"ok")
        assert upstream.received() == (
            f"POST /p?q=1 HTTP/1.1\r\nHost: api.test:{port}\r\nX-End: kept\r\n"
            "Content-Length: 5\r\nConnection: close\r\n\r\nhello".encode()
        )
    finally:
        upstream.close()


def test_an_http_1_0_request_is_sent_with_the_url_host_and_without_its_hop_by_hop_headers() -> None:
    upstream = RawUpstream()
    port = upstream.port
    try:
        with running_proxy((f"api.test:{port}",)) as run:
            request = (
                f"GET http://api.test:{port}/old HTTP/1.0\r\nConnection: X-A\r\nX-A: 1\r\n\r\n"
            )
            answer = exchange(run.path, request.encode())
        assert status_of(answer) == 200
        assert upstream.received() == (
            f"GET /old HTTP/1.0\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n".encode()
        )
    finally:
        upstream.close()
