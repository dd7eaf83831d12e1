"""The ways out of a run, attacked on every backend and start mode: the egress proxy (a network
allowlist) and the tool gateway (governed tools with host-held credentials).

A run under an allowlist profile still has no route anywhere: its only way out is the bridge on
its own 127.0.0.1:3128 to the host's proxy, which checks every connection against the profile.
A run under a tools profile reaches the host's gateway through one socket and never sees a
credential. Every server here listens on 127.0.0.1 (or 127.0.0.2, a loopback address the
allowlists never name); nothing else is ever contacted.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import wasm_cannot
from tests.integration.egress_servers import Servers, servers
from tests.integration.loopback_http import serving_mcp

from sandcell import ConfigError

from .conftest import END, Attack, Listener

API_KEY = f"wx-{secrets.token_hex(12)}"
TICKETS_TOKEN = f"tk-{secrets.token_hex(12)}"
HOST_ENV = {"WEATHER_API_KEY": API_KEY, "TICKETS_TOKEN": TICKETS_TOKEN}

UNCHECKED = (
    Path(__file__).resolve().parents[2]
    / "src"
    / "sandcell"
    / "policy"
    / "builtin"
    / "unchecked.toml"
)


def _profile_text(network: str = "", tools: str = "") -> str:
    """The built-in ``unchecked`` profile (no static checks: the sandbox is what is attacked)
    with another ``[network]`` section and ``tools`` appended."""
    text = UNCHECKED.read_text()
    start = text.index("[network]")
    end = text.index("[isolation]")
    net = network or '[network]\nmode = "none"\nhosts = []\n'
    return text[:start] + net + "\n" + text[end:] + "\n" + tools


class _Api(BaseHTTPRequestHandler):
    """/v1/forecast/CITY, /v1/echo/x (echoes the credential), /v1/big/x (200 kB), anything else
    404; every request without the credential is answered 401."""

    seen: list[tuple[str, str, str | None]] = []  # noqa: RUF012 - one server per module

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("X-Api-Key")))
        if self.headers.get("X-Api-Key") != API_KEY:
            self._send(401, {"error": "bad credential"})
        elif self.path.startswith("/v1/forecast/"):
            self._send(200, {"city": self.path.split("/")[3], "temp": 21})
        elif self.path.startswith("/v1/echo/"):
            self._send(200, {"you_sent": self.headers.get("X-Api-Key")})
        elif self.path.startswith("/v1/big/"):
            self._send(200, {"blob": "x" * 200_000})
        else:
            self._send(404, {"error": "no such path"})

    do_GET = do_POST = _answer

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Outside:
    """The module's loopback servers and the profiles that name them."""

    web: Servers
    api_url: str
    decoy: Listener
    """A listener on 127.0.0.1 that no profile names: it must never be reached."""
    decoy2: Listener
    """A listener on 127.0.0.2, an address no profile names."""
    net: str
    """Profile: the web servers' two ports on 127.0.0.1, and ``api.test`` (the profile's own
    entry for 127.0.0.1) at the TLS port; loopback explicitly allowed."""
    by_name: str
    """Profile: ``api.test`` (its own entry: 127.0.0.1) at the plain server's port, loopback
    NOT allowed (the default)."""
    capped: str
    """Profile: the plain server, at most 6 connections, 2 at once, 1 MiB down."""
    tools: str
    """Profile: the weather HTTP tool and the tickets MCP tool (stdio)."""
    both: str
    """Profile: the network allowlist and the tools."""


def _listener(address: str) -> Listener:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen(16)
    return Listener(sock=sock, port=sock.getsockname()[1]).start()


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outside]:
    folder = tmp_path_factory.mktemp("outside")
    for p in (folder, *folder.parents):
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)  # the user identity reads the profiles and the CA
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    decoy, decoy2 = _listener("127.0.0.1"), _listener("127.0.0.2")
    # The MCP upstream over streamable HTTP, started once: a stdio server would be started per
    # run (the gateway's own tests cover stdio).
    with servers(folder) as web, serving_mcp(TICKETS_TOKEN) as mcp_url:
        web.ca_file.chmod(0o644)
        plain, tls = web.plain.port, web.tls.port
        allow = '\nallow_addresses = ["127.0.0.1/32"]\n'
        # api.test is the profile's own host entry (never looked up): a name for the TLS tests.
        net = (
            f'[network]\nmode = "allowlist"\nhosts = ["127.0.0.1:{plain},{tls}", '
            f'"api.test:{tls}"]\nresolve = ["api.test=127.0.0.1"]{allow}'
        )
        tools = f"""
[tools.weather]
kind = "http"
base_url = "http://127.0.0.1:{api.server_address[1]}/v1"
allow = ["GET /forecast/*", "GET /echo/*", "GET /big/*"]
credential_env = "WEATHER_API_KEY"
header = "X-Api-Key"
scheme = ""
max_result_bytes = 100000

[tools.tickets]
kind = "mcp"
url = "{mcp_url}"
allow = ["search_tickets", "create_ticket", "echo_secret"]
credential_env = "TICKETS_TOKEN"
approval = {{ create_ticket = "always" }}
"""
        profiles = {
            "net": _profile_text(net),
            "by_name": _profile_text(
                f'[network]\nmode = "allowlist"\nhosts = ["api.test:{plain}"]\n'
                'resolve = ["api.test=127.0.0.1"]\n'
            ),
            "capped": _profile_text(
                f'[network]\nmode = "allowlist"\nhosts = ["127.0.0.1:{plain}"]{allow}'
                "max_connections = 6\nmax_concurrent = 2\nmax_mb_down = 1\n"
            ),
            "tools": _profile_text(tools=tools),
            "both": _profile_text(net, tools),
        }
        paths = {}
        for name, text in profiles.items():
            path = folder / f"{name}.toml"
            path.write_text(text)
            path.chmod(0o644)
            paths[name] = str(path)
        yield Outside(
            web=web,
            api_url=f"http://127.0.0.1:{api.server_address[1]}/v1",
            decoy=decoy,
            decoy2=decoy2,
            **paths,
        )
    api.shutdown()
    api.server_close()
    decoy.stop()
    decoy2.stop()


def _run(attack: Attack, body: str, profile: str, **kw: Any) -> dict[str, object]:
    if attack.sandbox.backend == "wasm" and profile != "unchecked":
        # A profile with an allowlist or tools is refused before the run on the wasm rung:
        # the refusal is checked, then the rest of the test (the proxy, the gateway) cannot apply.
        with pytest.raises(ConfigError, match="no network and no governed tools"):
            attack.run(body, profile=profile, host_env=HOST_ENV, **kw)
        wasm_cannot(attack.sandbox, "outside")
    return attack.run(body, profile=profile, host_env=HOST_ENV, **kw)


def _connections(result: Mapping[str, object]) -> list[dict[str, Any]]:
    network = result.get("network")
    assert isinstance(network, dict), f"no network record: {result}"
    rows = network["connections"]
    assert isinstance(rows, list)
    return rows


def _calls(result: Mapping[str, object]) -> list[dict[str, Any]]:
    tools = result.get("tools")
    assert isinstance(tools, dict), f"no tools record: {result}"
    rows = tools["calls"]
    assert isinstance(rows, list)
    return rows


def _seen_paths(out: Outside) -> set[str]:
    return {path for _m, _h, path in (*out.web.plain.seen, *out.web.tls.seen)}


# Program-side helpers: plain urllib, so the proxy variables are all that leads out.
FETCH = """
import json, ssl, urllib.error, urllib.request

def fetch(url, cafile=None):
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=20, context=ctx) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
"""


def test_allowed_hosts_are_reached_through_the_proxy_and_recorded(
    attack: Attack, outside: Outside
) -> None:
    token = secrets.token_hex(4)
    plain, tls = outside.web.plain.port, outside.web.tls.port
    body = (
        FETCH
        + f"""
print("proxy", os.environ.get("https_proxy"), os.environ.get("http_proxy"))
print("plain", *fetch("http://127.0.0.1:{plain}/plain-{token}"))
print("tls", *fetch("https://127.0.0.1:{tls}/tls-{token}", cafile="/inputs/ca.pem"))
print("name", *fetch("https://api.test:{tls}/name-{token}", cafile="/inputs/ca.pem"))
blocked("nothing else tried", "-")
"""
    )
    res = _run(attack, body, outside.net, inputs=[outside.web.ca_file])
    out = attack.expect_blocked(res)
    assert "proxy http://127.0.0.1:3128 http://127.0.0.1:3128" in out, out
    assert f"plain 200 hello 127.0.0.1:{plain} /plain-{token}" in out, out
    assert f"tls 200 hello 127.0.0.1:{tls} /tls-{token}" in out, out
    assert f"name 200 hello api.test:{tls} /name-{token}" in out, out
    rows = _connections(res)
    assert [(r["method"], r["host"], r["port"], r["allowed"]) for r in rows] == [
        ("HTTP", "127.0.0.1", plain, True),
        ("CONNECT", "127.0.0.1", tls, True),
        ("CONNECT", "api.test", tls, True),
    ], rows
    assert all(r["address"] == "127.0.0.1" and r["bytes_down"] > 0 for r in rows), rows
    assert rows[1]["sni"] is None, rows  # an IP literal sends no SNI
    assert rows[2]["sni"] == "api.test", rows
    assert {f"/plain-{token}", f"/tls-{token}", f"/name-{token}"} <= _seen_paths(outside)


def test_hosts_outside_the_allowlist_are_refused_with_a_clear_error(
    attack: Attack, outside: Outside
) -> None:
    plain = outside.web.plain.port
    body = (
        FETCH
        + f"""
for url in ("http://127.0.0.2:{outside.decoy2.port}/", "http://127.0.0.1:{outside.decoy.port}/",
            "http://localhost:{plain}/", "http://example.invalid/"):
    code, text = fetch(url)
    (blocked if code == 403 else breach)(url, f"{{code}} {{text.strip()}}")
"""
    )
    res = _run(attack, body, outside.net)
    out = attack.expect_blocked(res, attempts=4)
    assert "-> 403 sandcell egress proxy: 127.0.0.2 is an IP address that profile" in out, out
    assert "-> 403 sandcell egress proxy: 127.0.0.1 is an IP address that profile" in out, out
    assert "-> 403 sandcell egress proxy: host localhost is not in profile" in out, out
    assert "-> 403 sandcell egress proxy: host example.invalid is not in profile" in out, out
    rows = _connections(res)
    assert len(rows) == 4 and not any(r["allowed"] for r in rows), rows
    assert all(r["address"] is None for r in rows), rows
    assert not outside.decoy.seen and not outside.decoy2.seen


def test_a_listed_name_that_resolves_to_loopback_is_refused_by_default(
    attack: Attack, outside: Outside
) -> None:
    token = secrets.token_hex(4)
    body = (
        FETCH
        + f"""
code, text = fetch("http://api.test:{outside.web.plain.port}/name-{token}")
(blocked if code == 403 else breach)("a listed name resolving to loopback", f"{{code}} {{text}}")
"""
    )
    res = _run(attack, body, outside.by_name)
    out = attack.expect_blocked(res, attempts=1)
    assert "loopback" in out, out
    (row,) = _connections(res)
    assert not row["allowed"] and row["address"] is None, row
    assert f"/name-{token}" not in _seen_paths(outside)


def test_a_tunnel_whose_tls_names_another_host_is_cut(attack: Attack, outside: Outside) -> None:
    tls = outside.web.tls.port
    body = f"""
import ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"CONNECT 127.0.0.1:{tls} HTTP/1.1\\r\\nHost: 127.0.0.1:{tls}\\r\\n\\r\\n")
head = s.recv(4096)
ctx = ssl.create_default_context(cafile="/inputs/ca.pem")
ctx.check_hostname = False
try:
    t = ctx.wrap_socket(s, server_hostname="other.test")
    t.sendall(b"GET /sni HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n")
    breach("a TLS session naming another host", t.recv(200))
except (ssl.SSLError, OSError) as exc:
    blocked("a TLS session naming another host", type(exc).__name__)
"""
    res = _run(attack, body, outside.net, inputs=[outside.web.ca_file])
    attack.expect_blocked(res, attempts=1)
    (row,) = _connections(res)
    assert row["method"] == "CONNECT" and not row["allowed"], row
    assert row["sni"] == "other.test" and "other.test" in row["reason"], row
    assert "/sni" not in _seen_paths(outside)


def test_a_host_header_that_disagrees_with_the_url_is_refused(
    attack: Attack, outside: Outside
) -> None:
    token = secrets.token_hex(4)
    plain = outside.web.plain.port
    body = f"""
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"GET http://127.0.0.1:{plain}/hdr-{token} HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n")
head = s.recv(4096).split(b"\\r\\n")[0].decode()
(blocked if " 400 " in head else breach)("a Host header naming another host", head)
"""
    res = _run(attack, body, outside.net)
    attack.expect_blocked(res, attempts=1)
    (row,) = _connections(res)
    assert not row["allowed"] and row["status"] == 400, row
    assert f"/hdr-{token}" not in _seen_paths(outside)


def test_direct_sockets_and_raw_dns_do_not_leave_an_allowlisted_run(
    attack: Attack, outside: Outside, udp_listener: Listener
) -> None:
    token = secrets.token_hex(4)
    plain = outside.web.plain.port
    refused = (
        "(errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM)"
    )
    body = f"""
def direct(port):
    def go():
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /direct-{token} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        return s.recv(64)
    return go
attempt("a direct connection to an allowed server", direct({plain}), ok={refused})
attempt("a direct connection to a decoy", direct({outside.decoy.port}), ok={refused})

def dns():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(3)
    query = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")
    u.sendto(query, ("127.0.0.1", {udp_listener.port}))
    return u.recvfrom(512)
try:
    got = dns()
    breach("a raw DNS query to the host", got)
except (TimeoutError, ConnectionRefusedError, OSError) as exc:
    blocked("a raw DNS query to the host", errname(exc))
"""
    res = _run(attack, body, outside.net)
    attack.expect_blocked(res, attempts=3)
    assert _connections(res) == [], "nothing went through the proxy"
    assert f"/direct-{token}" not in _seen_paths(outside)
    assert not outside.decoy.seen
    assert not udp_listener.seen, udp_listener.seen


def test_connection_and_byte_floods_are_capped(attack: Attack, outside: Outside) -> None:
    plain = outside.web.plain.port
    body = (
        FETCH
        + f"""
codes = [fetch("http://127.0.0.1:{plain}/flood")[0] for _ in range(5)]
print("codes", codes)
got = 0
try:
    with urllib.request.urlopen("http://127.0.0.1:{plain}/big/3000000", timeout=20) as r:
        while chunk := r.read(65536):
            got += len(chunk)
except Exception as exc:
    print("cut", type(exc).__name__)
(blocked if got < 3000000 else breach)("3 MB down past a 1 MiB cap", got)
codes = [fetch("http://127.0.0.1:{plain}/flood")[0] for _ in range(3)]
(blocked if codes.count(429) >= 2 else breach)("connections past the cap", codes)
"""
    )
    res = _run(attack, body, outside.capped)
    out = attack.expect_blocked(res, attempts=2)
    assert "codes [200, 200, 200, 200, 200]" in out, out
    rows = _connections(res)
    assert sum(r["allowed"] for r in rows) <= 6, rows
    assert sum(r["status"] == 429 for r in rows) >= 2, rows
    assert sum(r["bytes_down"] for r in rows) <= 1024 * 1024 + 64 * 1024, rows


def test_the_proxy_and_gateway_sockets_do_not_lead_to_each_other(
    attack: Attack, outside: Outside
) -> None:
    token = secrets.token_hex(4)
    plain = outside.web.plain.port
    body = f"""
import json, struct
frame = json.dumps({{"op": "list"}}).encode()
frame = struct.pack(">I", len(frame)) + frame

def exchange(sock, data):
    # Nothing coming back within 3 s is an answer too: the other side waits for what it speaks.
    sock.settimeout(3)
    sock.sendall(data)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except OSError:
        pass
    sock.close()
    return got

def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s

got = exchange(unix("/run/sandcell/egress.sock"), frame)
(breach if b"weather" in got else blocked)("a tool listing asked of the proxy socket", got[:40])
got = exchange(socket.create_connection(("127.0.0.1", 3128)), frame)
(breach if b"weather" in got else blocked)("a tool listing asked of the bridge", got[:40])
request = b"GET http://127.0.0.1:{plain}/abuse-{token} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
got = exchange(unix("/run/sandcell/tools.sock"), request)
(breach if b"hello" in got else blocked)("an HTTP request sent to the gateway socket", got[:60])
connect = b"CONNECT 127.0.0.1:{plain} HTTP/1.1\\r\\n\\r\\n"
got = exchange(unix("/run/sandcell/tools.sock"), connect)
(breach if b" 200 " in got else blocked)("a tunnel asked of the gateway socket", got[:60])
"""
    res = _run(attack, body, outside.both, wall_time_s=60)
    attack.expect_blocked(res, attempts=4)
    assert f"/abuse-{token}" not in _seen_paths(outside)
    assert all(not r["allowed"] for r in _connections(res))
    assert all(c["operation"] == "invalid" for c in _calls(res)), _calls(res)


TOOLS = """
import sandcell_tools as tools

def outcome(fn, *a, **k):
    try:
        return ("ok", fn(*a, **k))
    except tools.ToolError as exc:
        return ("refused", str(exc))
"""


def test_tool_calls_are_checked_by_the_gateway_and_recorded(
    attack: Attack, outside: Outside
) -> None:
    body = (
        TOOLS
        + """
names = sorted(t["name"] for t in tools.list())
print("names", names)
print("forecast", outcome(tools.call, "weather.request", method="GET", path="/forecast/oslo"))
for what, args in (
    ("a path outside the allow list", dict(method="GET", path="/admin/keys")),
    ("a method outside the allow list", dict(method="POST", path="/forecast/oslo")),
):
    kind, why = outcome(tools.call, "weather.request", **args)
    (blocked if kind == "refused" else breach)(what, why)
kind, why = outcome(tools.call, "tickets.search_tickets", query="refund", limit="many")
(blocked if kind == "refused" else breach)("arguments that break the schema", why)
kind, why = outcome(tools.call, "weather.request", method="GET", path="/big/x")
(blocked if kind == "refused" else breach)("an oversized result", why)
kind, why = outcome(tools.call, "tickets.delete_everything")
(blocked if kind == "refused" else breach)("a tool the profile does not allow", why)
import socket, struct
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["SANDCELL_TOOLS_SOCKET"])
frame = json.dumps({"op": "call", "tool": "tickets.create_ticket", "args": {"title": "x"},
                    "approved": True, "approver": "admin"}).encode()
s.sendall(struct.pack(">I", len(frame)) + frame)
n = struct.unpack(">I", s.recv(4))[0]
answer = json.loads(s.recv(n))
(blocked if not answer["ok"] else breach)("a forged approval", answer)
"""
    )
    res = _run(attack, "import json\n" + body, outside.tools, wall_time_s=60)
    out = attack.expect_blocked(res, attempts=6)
    assert "names ['tickets.create_ticket', 'tickets.echo_secret', 'tickets.search_tickets'" in out
    assert "forecast ('ok', {'status': 200" in out and "'city': 'oslo'" in out, out
    calls = _calls(res)
    decisions = [(c["operation"], c["tool"], c["decision"]) for c in calls]
    assert decisions == [
        ("list", "", "allowed"),
        ("call", "weather.request", "allowed"),
        ("call", "weather.request", "refused"),
        ("call", "weather.request", "refused"),
        ("call", "tickets.search_tickets", "refused"),
        ("call", "weather.request", "failed"),
        ("call", "tickets.delete_everything", "refused"),
        ("invalid", "", "refused"),
    ], decisions
    allowed = calls[1]
    assert allowed["args_sha256"] and allowed["result_sha256"] and allowed["result_bytes"] > 0
    # The upstream only ever saw the allowed call, each with the credential the host added.
    api_paths = [(m, p) for m, p, key in _Api.seen if key == API_KEY]
    assert ("GET", "/v1/forecast/oslo") in api_paths
    assert not any(p.startswith("/v1/admin") for _m, p, _k in _Api.seen)


def test_no_credential_is_anywhere_the_program_can_reach(attack: Attack, outside: Outside) -> None:
    body = (
        TOOLS
        + f"""
SECRETS = [bytes.fromhex(h) for h in {[API_KEY.encode().hex(), TICKETS_TOKEN.encode().hex()]!r}]

def look(where, data):
    for s in SECRETS:
        if s in data:
            breach("a credential found in " + where)
            return

look("the environment", json.dumps(dict(os.environ)).encode())
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                look(f"/proc/{{pid}}/{{name}}", open(f"/proc/{{pid}}/{{name}}", "rb").read())
            except OSError:
                pass
# The runtime (the interpreter's prefix, its packages) is the host's read-only install: the
# gateway never writes there, and walking it through a user-space kernel takes most of a minute.
skip = {{"/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/opt", sys.prefix,
        sys.base_prefix}}
files = 0
for root, dirs, names in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip and d != "site-packages"]
    for name in names:
        path = os.path.join(root, name)
        try:
            if os.path.isfile(path) and os.path.getsize(path) < 4 << 20:
                look(path, open(path, "rb").read())
                files += 1
        except OSError:
            pass
look("the tool list", json.dumps(tools.list()).encode())
echoes = (("weather.request", dict(method="GET", path="/echo/x")), ("tickets.echo_secret", {{}}))
for call in echoes:
    kind, value = outcome(tools.call, call[0], **call[1])
    look("the result of " + call[0], json.dumps(value).encode())
    print("echo", kind, json.dumps(value)[:120])
blocked(f"a search of the environment, /proc and {{files}} files", "nothing found")
"""
    )
    res = _run(attack, "import json\n" + body, outside.tools, wall_time_s=60)
    out = attack.expect_blocked(res, attempts=1)
    assert out.count("[REDACTED:known_secret]") >= 2, out
    assert API_KEY not in out and TICKETS_TOKEN not in out
    assert not res["leaks"], res["leaks"]


def test_bash_programs_reach_the_proxy_and_the_tools_command(
    attack: Attack, outside: Outside
) -> None:
    if attack.sandbox.start != "cold":
        pytest.skip("bash runs start cold in every start mode: the cold params cover them")
    token = secrets.token_hex(4)
    plain = outside.web.plain.port
    code = f"""
if command -v curl >/dev/null; then
  curl -s -o /dev/null -w 'curl %{{http_code}}\\n' http://127.0.0.1:{plain}/bash-{token}
else
  python3 -c 'import urllib.request as u; print("curl", u.urlopen("http://127.0.0.1:{plain}/bash-{token}").status)'
fi
python3 -m sandcell_tools list | grep -c '"name"'
echo {END}
"""
    res = _run(attack, code, outside.both, lang="bash", raw=True)
    assert res["outcome"] == "ok", res
    out = str(res["stdout"])
    assert "curl 200" in out and out.splitlines()[1] == "4", out
    assert f"/bash-{token}" in _seen_paths(outside)
    assert [r["allowed"] for r in _connections(res)] == [True]
    assert [c["operation"] for c in _calls(res)] == ["list"]


def test_a_run_without_an_allowlist_gets_no_proxy(attack: Attack, outside: Outside) -> None:
    body = """
print("vars", sorted(k for k in os.environ if "proxy" in k.lower() or "SANDCELL" in k))
attempt("the proxy port", lambda: socket.create_connection(("127.0.0.1", 3128), timeout=5),
        ok=(errno.ECONNREFUSED, errno.EACCES))
attempt("the proxy socket", lambda: os.stat("/run/sandcell/egress.sock"), ok=(errno.ENOENT,))
"""
    res = _run(attack, body, outside.tools)
    out = attack.expect_blocked(res, attempts=2)
    assert "vars ['SANDCELL_SOCKETS', 'SANDCELL_TOOLS_SOCKET']" in out, out
    assert res["network"] is None and res["tools"] is not None
    # Neither: no socket directory at all.
    body = """
print("vars", sorted(k for k in os.environ if "proxy" in k.lower() or "SANDCELL" in k))
attempt("the socket directory", lambda: os.listdir("/run/sandcell"), ok=(errno.ENOENT,))
"""
    res = _run(attack, body, "unchecked")
    out = attack.expect_blocked(res, attempts=1)
    assert "vars []" in out, out
    assert res["network"] is None and res["tools"] is None


def test_the_results_and_the_record_agree(attack: Attack, outside: Outside) -> None:
    """What ``audit show`` reads is what the result said, under the hash chain."""
    if attack.identity != "root":
        pytest.skip("the record is read in this process as root; the user's CLI writes the same")
    plain = outside.web.plain.port
    res = _run(
        attack,
        FETCH + f'print(fetch("http://127.0.0.1:{plain}/rec")[0]); blocked("x", "-")',
        outside.net,
    )
    attack.expect_blocked(res, attempts=1)
    from sandcell.audit import AuditLog

    log = AuditLog(attack.home / "audit.sqlite3")
    try:
        entry = log.get(str(res["run_id"]))
    finally:
        log.close()
    assert entry is not None
    assert entry.record["network"] == res["network"]
    assert [r["allowed"] for r in _connections(res)] == [True]
