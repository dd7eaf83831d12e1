"""The local socket without a key: the service's own user is the local owner (SO_PEERCRED);
another uid that reaches the socket must send a key; TCP always needs one. And ``/mcp`` behind
a Host name given with ``--allowed-host``, while unknown Host names are still refused."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from tests.service.server import REPO, ServiceProcess, add_tenant

OTHER_USER = "sandcell-test"
_SERVE = (sys.executable, "-m", "sandcell", "serve")


def _over_socket(path: Path, key: str | None = None) -> httpx2.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.Client(
        base_url="http://localhost",
        headers=headers,
        timeout=120,
        transport=httpx2.HTTPTransport(uds=str(path)),
    )


def test_the_owner_needs_no_key_on_the_socket(service: ServiceProcess, home: Path) -> None:
    stranger = add_tenant(home, "socket-stranger")
    with _over_socket(service.socket) as owner:
        me = owner.get("/v1/tenant").json()
        assert me["name"] == "@local" and me["profiles"][0] == "strict"
        assert {"analysis", "unchecked"} <= set(me["profiles"])  # every installed profile
        done = owner.post("/v1/runs", json={"code": "print(6 * 7)"})
        assert done.status_code == 200, done.text
        run_id = done.json()["id"]
        assert done.json()["result"]["stdout"] == "42\n"
        assert run_id in [r["run_id"] for r in owner.get("/v1/audit").json()]
        other = owner.post("/v1/runs", json={"code": "print(1)", "profile": "analysis"})
        assert other.json()["result"]["outcome"] == "ok", other.text
    # The local owner's runs are its own: a tenant's key does not reach them.
    with service.client(stranger) as c:
        assert c.get(f"/v1/runs/{run_id}").status_code == 404
        assert c.get(f"/v1/audit/{run_id}").status_code == 404
    # TCP still asks for a key, even from this same user.
    refused = httpx2.post(f"{service.url}/v1/runs", json={"code": "print(1)"})
    assert refused.status_code == 401 and "WWW-Authenticate" in refused.headers
    # A key on the socket is that key's tenant, not the owner.
    with _over_socket(service.socket, stranger) as keyed:
        assert keyed.get("/v1/tenant").json()["name"] == "socket-stranger"
    with _over_socket(service.socket, "sc_wrong") as wrong:
        assert wrong.get("/v1/tenant").status_code == 401


def test_a_sandboxed_program_cannot_reach_the_socket(service: ServiceProcess) -> None:
    # A sandbox's processes run as the service's own uid on the host (the user namespace maps
    # its user to the caller's), so SO_PEERCRED would take them for the owner: the keyless
    # socket is safe only because no sandbox can reach it. Tried from inside, as a program would.
    code = (
        "import socket\n"
        f"path = {str(service.socket)!r}\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(path)\n"
        "    s.sendall(b'GET /v1/tenant HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "    print('CONNECTED', s.recv(200))\n"
        "except OSError as e:\n"
        "    print('refused', type(e).__name__)\n"
    )
    with _over_socket(service.socket) as owner:
        answer = owner.post("/v1/runs", json={"code": code, "profile": "unchecked"})
    result = answer.json()["result"]
    assert result["outcome"] == "ok", result
    assert result["stdout"].startswith("refused"), result["stdout"]


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    # A directory another user can traverse (the test homes are 0700), for a widened socket.
    path = Path(tempfile.mkdtemp(prefix="svc-sock-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def owned(
    tmp_path_factory: pytest.TempPathFactory, shared_dir: Path
) -> Iterator[tuple[ServiceProcess, str]]:
    """A service whose local owner is the tenant ``owner`` (one sandbox at a time), with its
    socket in ``shared_dir``, answering /mcp also as ``sandcell.test``."""
    home = tmp_path_factory.mktemp("owned-home")
    key = add_tenant(home, "owner", profiles=("strict",), max_concurrent=1)
    proc = ServiceProcess(
        home,
        args=(
            "--start", "cold",
            "--socket", str(shared_dir / "s.sock"),
            "--local-tenant", "owner",
            "--allowed-host", "sandcell.test",
        ),
    ).start()  # fmt: skip
    yield proc, key
    proc.stop()


def test_local_tenant_gives_the_owner_that_tenant(
    owned: tuple[ServiceProcess, str], shared_dir: Path
) -> None:
    proc, key = owned
    with _over_socket(shared_dir / "s.sock") as owner:
        me = owner.get("/v1/tenant").json()
        assert me["name"] == "owner" and me["profiles"] == ["strict"]
        assert me["max_concurrent"] == 1
        session = owner.post("/v1/sessions", json={})
        assert session.status_code == 201, session.text
        # Its quotas apply: the session holds its one sandbox.
        assert owner.post("/v1/runs", json={"code": "pass"}).status_code == 429
        assert owner.delete(f"/v1/sessions/{session.json()['id']}").status_code == 200
        assert owner.post("/v1/runs", json={"code": "pass"}).status_code == 200
    # What the owner made keyless is the tenant's: its key sees it.
    with proc.client(key) as c:
        assert c.get("/v1/audit").json(), "the keyless run is not the tenant's"


_RAW_REQUEST = """
import json, os, socket, sys
path, key = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
auth = f"Authorization: Bearer {key}\\r\\n" if key else ""
head = f"GET /v1/tenant HTTP/1.1\\r\\nHost: localhost\\r\\n{auth}Connection: close\\r\\n"
s.sendall(f"{head}\\r\\n".encode())
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, body = data.partition(b"\\r\\n\\r\\n")
status = int(head.split()[1])
print(json.dumps({"status": status, "body": body.decode(), "uid": os.getuid()}))
"""


def _as_other_user(path: Path, key: str = "") -> dict[str, object]:
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed")
    try:
        import pwd

        pwd.getpwnam(OTHER_USER)
    except KeyError:
        pytest.skip(f"the user {OTHER_USER} does not exist on this host")
    done = subprocess.run(
        ["runuser", "-u", OTHER_USER, "--", "/usr/bin/python3", "-c", _RAW_REQUEST, str(path), key],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_another_uid_on_the_socket_needs_a_key(
    owned: tuple[ServiceProcess, str], shared_dir: Path
) -> None:
    _, key = owned
    sock = shared_dir / "s.sock"
    assert sock.stat().st_mode & 0o777 == 0o600
    # As made, the other user cannot even connect (0600, owned by the service's user).
    blocked = subprocess.run(
        ["runuser", "-u", OTHER_USER, "--", "/usr/bin/python3", "-c",
         f"import socket; socket.socket(socket.AF_UNIX).connect({str(sock)!r})"],
        capture_output=True, text=True, timeout=60, check=False, cwd="/",
    )  # fmt: skip
    assert blocked.returncode != 0 and "PermissionError" in blocked.stderr
    # Widened (an administrator's mistake, or on purpose for a group): still no keyless access.
    sock.chmod(0o666)
    try:
        attack = _as_other_user(sock)
        assert attack["uid"] != os.geteuid()
        assert attack["status"] == 401, attack
        assert "must send a tenant's API key" in str(attack["body"])
        keyed = _as_other_user(sock, key)
        assert keyed["status"] == 200 and json.loads(str(keyed["body"]))["name"] == "owner"
    finally:
        sock.chmod(0o600)


@contextlib.asynccontextmanager
async def _mcp_as(url: str, key: str, host: str) -> AsyncIterator[object]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}", "Host": host},
            timeout=httpx2.Timeout(30, read=120),
        ) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_mcp_answers_an_allowed_host_and_refuses_others(
    owned: tuple[ServiceProcess, str],
) -> None:
    pytest.importorskip("mcp.client.streamable_http", reason="the MCP SDK is not installed")
    proc, key = owned

    async def listed(host: str) -> list[str]:
        async with _mcp_as(proc.url, key, host) as session:
            tools = await session.list_tools()  # type: ignore[attr-defined]
            return [t.name for t in tools.tools]

    assert "run_python" in anyio.run(listed, f"sandcell.test:{proc.port}")
    assert "run_python" in anyio.run(listed, f"127.0.0.1:{proc.port}")  # loopback still
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {
        "Authorization": f"Bearer {key}",
        "Accept": "application/json, text/event-stream",
    }
    for host in ("evil.example", f"evil.example:{proc.port}", "sandcell.test.evil.example"):
        refused = httpx2.post(
            f"{proc.url}/mcp", json=initialize, headers={**headers, "Host": host}, timeout=30
        )
        assert refused.status_code == 421, (host, refused.status_code, refused.text)


def test_a_bad_allowed_host_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *_SERVE,
            "--port", "0", "--no-socket", "--allowed-host", "http://x.example:80",
        ],
        env={**os.environ, "SANDCELL_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 78 and "--allowed-host" in done.stderr, done.stderr
    missing = subprocess.run(
        [*_SERVE, "--port", "0", "--no-socket", "--local-tenant", "nobody"],
        env={**os.environ, "SANDCELL_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert missing.returncode == 78 and "no tenant 'nobody'" in missing.stderr, missing.stderr
