"""The tool gateway on its own: real upstreams on loopback, a real client in another process,
and one test per attack.

Upstreams: an HTTP API on 127.0.0.1 that checks the credential header, and an MCP server built
with the official ``mcp`` SDK (``tests/mcp_ticket_server.py``) over stdio and over streamable
HTTP on 127.0.0.1. The client is the standalone ``sandcell_tools`` module, copied to a directory
of its own and run by a Python without sandcell, with an environment that holds no credential:
as it will run in the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.integration.loopback_http import serving_mcp

from sandcell.policy.profiles import parse_profile
from sandcell.tools import sandcell_tools
from sandcell.tools.approval import ApprovalDecision, ApprovalRequest
from sandcell.tools.definitions import ToolDefinition
from sandcell.tools.gateway import ToolGateway
from sandcell.tools.records import ToolCallRecord

pytest.importorskip("mcp", reason="the MCP SDK (extra 'tools') is not installed")

SERVER = Path(__file__).resolve().parents[1] / "mcp_ticket_server.py"
API_KEY = "wx-key-7f3a9c21d4e8b6f0"
TICKETS_TOKEN = "tk-secret-5b2e8d7c1a9f3e64"
CLIENT_PYTHON = "/usr/bin/python3"


class _Api(BaseHTTPRequestHandler):
    """/v1/forecast/CITY (JSON), /v1/echo/x (echoes the credential), /v1/admin/keys (never
    allowed). Every request without the right credential is answered 401."""

    seen: list[tuple[str, str]] = []  # noqa: RUF012 - one server per test module

    def _answer(self) -> None:
        self.seen.append((self.command, self.path))
        if self.headers.get("X-Api-Key") != API_KEY:
            self._send(401, {"error": "bad credential"})
        elif self.path.startswith("/v1/forecast/"):
            self._send(200, {"city": self.path.split("/")[3].split("?")[0], "temp": 21})
        elif self.path.startswith("/v1/echo/"):
            self._send(200, {"you_sent": self.headers.get("X-Api-Key")})
        elif self.path.startswith("/v1/big/"):
            self._send(200, {"blob": "x" * 200_000})
        else:
            self._send(404, {"error": "no such path"})

    do_GET = do_POST = do_DELETE = _answer

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with serving_mcp(TICKETS_TOKEN) as url:
        yield url


def _profile(api: str, mcp_url: str, **extra: str) -> tuple[ToolDefinition, ...]:
    toml = f"""
[tools.weather]
kind = "http"
base_url = "{api}"
allow = ["GET /forecast/*", "GET /echo/*", "GET /big/*"]
credential_env = "WEATHER_API_KEY"
header = "X-Api-Key"
scheme = ""
max_result_bytes = {extra.get("weather_result", "100000")}

[tools.tickets]
kind = "mcp"
command = ["{sys.executable}", "{SERVER}", "stdio"]
allow = ["search_tickets", "create_ticket", "echo_secret", "big"]
credential_env = "TICKETS_TOKEN"
approval = {{ create_ticket = "always" }}
max_result_bytes = 50000
max_request_bytes = 2000
rate_per_minute = {extra.get("rate", "30")}

[tools.remote]
kind = "mcp"
url = "{mcp_url}"
allow = ["search_tickets", "echo_secret"]
credential_env = "TICKETS_TOKEN"
"""
    return parse_profile(toml.encode(), name="tooltest", source="tooltest.toml").tools


HOST_ENV = {"WEATHER_API_KEY": API_KEY, "TICKETS_TOKEN": TICKETS_TOKEN}


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Short: a Unix socket path holds at most 107 bytes.
    path = Path(f"/tmp/sct-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def client_dir(tmp_path: Path) -> Path:
    shutil.copy(sandcell_tools.__file__, tmp_path / "sandcell_tools.py")
    return tmp_path


def client(client_dir: Path, socket_path: Path, code: str) -> dict[str, object]:
    """Run ``code`` in a separate Python that has no sandcell and no credential; it prints one
    JSON value, returned here (with what else it printed)."""
    if not os.access(CLIENT_PYTHON, os.X_OK):
        pytest.skip(f"{CLIENT_PYTHON} (a Python without sandcell) is missing")
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(client_dir)!r})\n"
        "import sandcell_tools as tools\n"
        "def attempt(f, *a, **k):\n"
        "    try:\n"
        "        return {'ok': f(*a, **k)}\n"
        "    except tools.ToolError as e:\n"
        "        return {'error': str(e)}\n" + code
    )
    env = {"PATH": "/usr/bin:/bin", "SANDCELL_TOOLS_SOCKET": str(socket_path)}
    done = subprocess.run(
        [CLIENT_PYTHON, "-I", "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert API_KEY not in done.stdout + done.stderr
    assert TICKETS_TOKEN not in done.stdout + done.stderr
    return {"value": json.loads(done.stdout.splitlines()[-1]), "stdout": done.stdout}


def no_secret_in(value: object) -> None:
    text = json.dumps(value)
    assert API_KEY not in text
    assert TICKETS_TOKEN not in text


def _last(gw: ToolGateway) -> ToolCallRecord:
    return gw.records[-1]


# ------------------------------------------------------------------------------------------
# What works


def test_list_and_calls_from_a_separate_process_over_the_socket(
    api: str, mcp_url: str, sock_dir: Path, client_dir: Path
) -> None:
    path = sock_dir / "tools.sock"
    with ToolGateway(
        profile="tooltest", tools=_profile(api, mcp_url), environ=HOST_ENV, socket_path=path
    ) as gw:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        out = client(
            client_dir,
            path,
            "print(json.dumps({"
            "'list': tools.list(),"
            "'forecast': tools.call('weather.request', method='GET', path='/forecast/paris'),"
            "'stdio': tools.call('tickets.search_tickets', query='refund', limit=1),"
            "'http': tools.call('remote.search_tickets', query='login'),"
            "}))",
        )["value"]
    assert isinstance(out, dict)
    names = {e["name"] for e in out["list"]}
    assert names == {
        "weather.request",
        "tickets.search_tickets",
        "tickets.create_ticket",
        "tickets.echo_secret",
        "tickets.big",
        "remote.search_tickets",
        "remote.echo_secret",
    }
    search = next(e for e in out["list"] if e["name"] == "tickets.search_tickets")
    assert search["input_schema"]["required"] == ["query"]
    assert (
        next(e for e in out["list"] if e["name"] == "tickets.create_ticket")["approval"] == "always"
    )
    assert out["forecast"] == {
        "status": 200,
        "content_type": "application/json",
        "body": {"city": "paris", "temp": 21},
    }
    assert out["stdio"]["structuredContent"]["result"] == [
        {"id": 1, "title": "refund for order 17", "status": "open"}
    ]
    assert out["http"]["structuredContent"]["result"][0]["title"] == "login broken"
    report = gw.report
    assert [r.decision for r in report.records] == ["allowed"] * 4
    assert [r.operation for r in report.records] == ["list", "call", "call", "call"]
    call = report.records[2]
    assert call.tool == "tickets.search_tickets" and call.args_sha256 and call.result_sha256
    assert call.request_bytes > 0 and call.result_bytes > 0 and call.approver is None
    assert json.dumps(report.to_record())
    assert not path.exists()


def test_the_bash_command_calls_a_tool(
    api: str, mcp_url: str, sock_dir: Path, client_dir: Path
) -> None:
    path = sock_dir / "tools.sock"
    with ToolGateway(
        profile="tooltest", tools=_profile(api, mcp_url), environ=HOST_ENV, socket_path=path
    ):
        done = subprocess.run(
            [
                CLIENT_PYTHON,
                "-m",
                "sandcell_tools",
                "call",
                "weather.request",
                "--json",
                '{"method": "GET", "path": "/forecast/oslo"}',
            ],
            cwd=client_dir,
            env={"PATH": "/usr/bin:/bin", "SANDCELL_TOOLS_SOCKET": str(path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        refused = subprocess.run(
            [
                CLIENT_PYTHON,
                "-m",
                "sandcell_tools",
                "call",
                "weather.request",
                "--json",
                '{"method": "GET", "path": "/admin/keys"}',
            ],
            cwd=client_dir,
            env={"PATH": "/usr/bin:/bin", "SANDCELL_TOOLS_SOCKET": str(path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["body"]["city"] == "oslo"
    assert refused.returncode == 1
    assert "not allowed by tool weather" in refused.stderr


def test_an_approved_call_records_its_approver(api: str, mcp_url: str) -> None:
    asked: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision(approved=True, approver="ann")

    gw = ToolGateway(
        profile="tooltest", tools=_profile(api, mcp_url), environ=HOST_ENV, approver=approve
    )
    from sandcell.tools.protocol import Request

    answer = gw.execute(
        Request(op="call", tool="tickets.create_ticket", args={"title": "t"}), request_bytes=1
    )
    assert answer["ok"], answer
    assert [a.tool for a in asked] == ["tickets.create_ticket"]
    assert asked[0].args == {"title": "t"}
    assert (_last(gw).decision, _last(gw).approver) == ("allowed", "ann")


# ------------------------------------------------------------------------------------------
# Attacks, from the separate client process over the real socket


@pytest.fixture
def gateway(api: str, mcp_url: str, sock_dir: Path) -> Iterator[ToolGateway]:
    path = sock_dir / "tools.sock"
    with ToolGateway(
        profile="tooltest", tools=_profile(api, mcp_url), environ=HOST_ENV, socket_path=path
    ) as gw:
        yield gw


def _one(client_dir: Path, gw: ToolGateway, call: str) -> dict[str, object]:
    assert gw.socket_path is not None
    value = client(client_dir, gw.socket_path, f"print(json.dumps(attempt({call})))")["value"]
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize(
    ("call", "words"),
    [
        ("tools.call, 'tickets.delete_everything'", "not in the allow list of tool tickets"),
        ("tools.call, 'payroll.pay', amount=1", "no tool 'payroll'"),
        (
            "tools.call, 'weather.request', method='DELETE', path='/forecast/x'",
            "DELETE /forecast/x is not allowed",
        ),
        (
            "tools.call, 'weather.request', method='GET', path='/admin/keys'",
            "not allowed by tool weather",
        ),
        (
            "tools.call, 'weather.request', method='GET', path='/forecast/x/y'",
            "not allowed by tool weather",
        ),
        ("tools.call, 'weather.request', method='GET', path='/forecast/../admin/keys'", "'..'"),
        ("tools.call, 'weather.request', method='GET', path='/forecast/%2e%2e'", "refused escape"),
    ],
)
def test_a_call_outside_the_allow_list_is_refused(
    gateway: ToolGateway, client_dir: Path, call: str, words: str
) -> None:
    seen = len(_Api.seen)
    result = _one(client_dir, gateway, call)
    assert words in str(result.get("error")), result
    assert _last(gateway).decision == "refused"
    assert len(_Api.seen) == seen  # nothing reached the API


@pytest.mark.parametrize(
    ("call", "words"),
    [
        ("tools.call, 'tickets.search_tickets', query='r', limit='many'", "limit"),
        ("tools.call, 'tickets.search_tickets', limit=1", "'query' is a required property"),
        (
            "tools.call, 'weather.request', method='GET', path='/forecast/x',"
            " headers={'X-Api-Key': 'x'}",
            "Additional properties",
        ),
        (
            "tools.call, 'weather.request', method='GET', path='/forecast/x', query={'a': 1}",
            "query/a",
        ),
    ],
)
def test_arguments_that_break_the_schema_are_refused(
    gateway: ToolGateway, client_dir: Path, call: str, words: str
) -> None:
    result = _one(client_dir, gateway, call)
    assert "do not fit its schema" in str(result.get("error")), result
    assert words in str(result["error"])
    assert _last(gateway).decision == "refused"


def test_an_oversized_request_is_refused(gateway: ToolGateway, client_dir: Path) -> None:
    result = _one(client_dir, gateway, "tools.call, 'tickets.search_tickets', query='r' * 5000")
    assert "above tickets.search_tickets's limit of 2000" in str(result.get("error")), result
    # Past the frame limit, the request is not even read.
    huge = _one(
        client_dir, gateway, "tools.call, 'weather.request', method='GET', path='/' + 'a' * 300000"
    )
    assert "above the limit" in str(huge.get("error")), huge
    assert _last(gateway).operation == "invalid"


def test_an_oversized_result_is_refused(gateway: ToolGateway, client_dir: Path) -> None:
    mcp = _one(client_dir, gateway, "tools.call, 'tickets.big', size=80000")
    assert "above its limit of 50000" in str(mcp.get("error")), mcp
    assert _last(gateway).decision == "failed"
    http = _one(client_dir, gateway, "tools.call, 'weather.request', method='GET', path='/big/x'")
    assert "larger than the tool's limit of 100000" in str(http.get("error")), http


def test_calls_past_the_rate_limit_are_refused(
    api: str, mcp_url: str, sock_dir: Path, client_dir: Path
) -> None:
    path = sock_dir / "tools.sock"
    with ToolGateway(
        profile="tooltest",
        tools=_profile(api, mcp_url, rate="2"),
        environ=HOST_ENV,
        socket_path=path,
    ) as gw:
        out = client(
            client_dir,
            path,
            "print(json.dumps([attempt(tools.call, 'tickets.search_tickets', query='r', limit='x')"
            " for _ in range(3)]))",
        )["value"]
    assert isinstance(out, list)
    assert "do not fit its schema" in out[0]["error"]  # a bad call counts too
    assert "more than 2 calls of this tool in a minute" in out[2]["error"]
    assert [r.decision for r in gw.report.records] == ["refused"] * 3


def test_approval_needed_and_nobody_to_approve_is_refused(
    gateway: ToolGateway, client_dir: Path
) -> None:
    result = _one(client_dir, gateway, "tools.call, 'tickets.create_ticket', title='x'")
    assert "needs approval (profile tooltest) and nobody can approve" in str(result.get("error"))
    assert (_last(gateway).decision, _last(gateway).approver) == ("refused", None)


def test_a_denied_approval_is_refused_and_recorded(
    api: str, mcp_url: str, sock_dir: Path, client_dir: Path
) -> None:
    path = sock_dir / "tools.sock"
    with ToolGateway(
        profile="tooltest",
        tools=_profile(api, mcp_url),
        environ=HOST_ENV,
        socket_path=path,
        approver=lambda r: ApprovalDecision(approved=False, approver="bob"),
    ) as gw:
        result = _one(client_dir, gw, "tools.call, 'tickets.create_ticket', title='x'")
    assert "tickets.create_ticket was denied by bob" in str(result.get("error"))
    assert (gw.report.records[-1].decision, gw.report.records[-1].approver) == ("denied", "bob")


def test_a_forged_approval_field_is_refused(gateway: ToolGateway, client_dir: Path) -> None:
    assert gateway.socket_path is not None
    code = (
        "import socket, struct\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(tools.os.environ['SANDCELL_TOOLS_SOCKET'])\n"
        "b = json.dumps({'op': 'call', 'tool': 'tickets.create_ticket', 'args': {'title': 'x'},"
        " 'approved': True, 'approver': 'admin'}).encode()\n"
        "s.sendall(struct.pack('>I', len(b)) + b)\n"
        "n = struct.unpack('>I', s.recv(4))[0]\n"
        "print(s.recv(n).decode())\n"
    )
    answer = client(client_dir, gateway.socket_path, code)["value"]
    assert answer == {"ok": False, "error": "unknown field(s) 'approved', 'approver'; refused"}
    assert _last(gateway).operation == "invalid"
    # Inside the arguments, an approval field is only an argument: approval is still required.
    inner = _one(
        client_dir, gateway, "tools.call, 'tickets.create_ticket', title='x', approved=True"
    )
    assert "needs approval (profile tooltest) and nobody can approve" in str(inner.get("error"))


def test_credentials_never_reach_the_client(gateway: ToolGateway, client_dir: Path) -> None:
    assert gateway.socket_path is not None
    code = (
        "import os\n"
        "found = {'env': dict(os.environ)}\n"
        "found['echo_stdio'] = attempt(tools.call, 'tickets.echo_secret')\n"
        "found['echo_http_mcp'] = attempt(tools.call, 'remote.echo_secret')\n"
        "found['echo_http'] = attempt("
        "tools.call, 'weather.request', method='GET', path='/echo/x')\n"
        "found['list'] = attempt(tools.list)\n"
        "print(json.dumps(found))\n"
    )
    out = client(client_dir, gateway.socket_path, code)  # asserts no secret in all it printed
    value = out["value"]
    assert isinstance(value, dict)
    no_secret_in(value)
    assert "[REDACTED:known_secret]" in json.dumps(value["echo_stdio"])
    assert "[REDACTED:known_secret]" in json.dumps(value["echo_http_mcp"])
    assert value["echo_http"]["ok"]["body"] == {"you_sent": "[REDACTED:known_secret]"}
    assert set(value["env"]) <= {"PATH", "SANDCELL_TOOLS_SOCKET", "LC_CTYPE"}
    assert sum(r.redactions for r in gateway.records) >= 3
    assert set(gateway.secrets) == {API_KEY, TICKETS_TOKEN}


@pytest.mark.parametrize(
    "frame",
    [
        b"",  # connect and close
        b"\x00\x00",  # half a header
        struct.pack(">I", 10) + b"{",  # announced more than sent
        struct.pack(">I", 0xFFFFFFFF),  # 4 GiB announced
        struct.pack(">I", 4) + b"\xff\xfe\xfd\xfc",  # not UTF-8
        struct.pack(">I", 5) + b"[1,2]",  # not an object
        struct.pack(">I", 14) + b'{"op":"sudo"} ',
    ],
)
def test_malformed_frames_are_refused_and_the_gateway_keeps_serving(
    gateway: ToolGateway, frame: bytes
) -> None:
    assert gateway.socket_path is not None
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(gateway.socket_path))
        s.sendall(frame)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    if answer:
        size = struct.unpack(">I", answer[:4])[0]
        body = json.loads(answer[4 : 4 + size])
        assert body["ok"] is False and body["error"]
    assert _last(gateway).operation == "invalid"
    assert _last(gateway).decision == "refused"
    # The next, well-formed request is served.
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(gateway.socket_path))
        s.sendall(struct.pack(">I", 13) + b'{"op":"list"}')
        size = struct.unpack(">I", s.recv(4))[0]
        assert size > 0


def test_a_missing_credential_stops_the_gateway_from_starting(api: str, mcp_url: str) -> None:
    from sandcell.errors import ConfigError

    with pytest.raises(ConfigError, match=r"needs its credential in \$WEATHER_API_KEY"):
        ToolGateway(profile="tooltest", tools=_profile(api, mcp_url), environ={})


def test_an_upstream_that_cannot_start_fails_clearly(tmp_path: Path) -> None:
    from sandcell.tools.protocol import Request

    toml = b'[tools.gone]\nkind = "mcp"\ncommand = ["/nonexistent/mcp-server"]\nallow = ["a"]\n'
    tools = parse_profile(toml, name="gone", source="gone.toml").tools
    gw = ToolGateway(profile="gone", tools=tools, environ={})
    listed = gw.execute(Request(op="list"), request_bytes=13)
    assert listed["ok"] and listed["result"][0]["name"] == "gone"  # type: ignore[index]
    assert "the MCP server failed" in listed["result"][0]["error"]  # type: ignore[index]
    called = gw.execute(Request(op="call", tool="gone.a", args={}), request_bytes=1)
    assert not called["ok"] and "the MCP server failed" in str(called["error"])
    assert gw.stop().records[-1].decision == "failed"


def test_the_client_without_a_socket_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDCELL_TOOLS_SOCKET", raising=False)
    with pytest.raises(sandcell_tools.ToolError, match=r"\$SANDCELL_TOOLS_SOCKET is not set"):
        sandcell_tools.list()
