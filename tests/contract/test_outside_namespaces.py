"""The namespaces backend's side of a run's ways out (``backends/namespaces/outside.py``): what
holds inside the sandbox around the egress bridge and the socket directory, in every start mode
and for sessions. The proxy's and gateway's own checks are attacked in
``tests/escapes/test_outside.py``; these tests attack the bridge and the bind from the program.

Every server listens on 127.0.0.1; nothing else is contacted.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.conftest import Sandbox

from sandcell import Executor, Limits, Outcome
from sandcell.spec import MiB

UNCHECKED = Path(__file__).resolve().parents[2] / "src/sandcell/policy/builtin/unchecked.toml"
API_KEY = f"ns-{secrets.token_hex(8)}"


class _Hello(BaseHTTPRequestHandler):
    """Answers every GET with its path, and whether the tool's credential came with it."""

    def do_GET(self) -> None:
        keyed = self.headers.get("X-Api-Key") == API_KEY
        data = f"hello {self.path} keyed={keyed}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Served:
    port: int
    profile: str
    """An allowlist naming the server, and an http tool in front of it."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("ns-outside")
    for p in (folder, *folder.parents):
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)  # the user identity reads the profile
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    text = UNCHECKED.read_text()
    network = (
        f'[network]\nmode = "allowlist"\nhosts = ["127.0.0.1:{port}"]\n'
        'allow_addresses = ["127.0.0.1/32"]\n'
    )
    tools = f"""
[tools.hello]
kind = "http"
base_url = "http://127.0.0.1:{port}"
allow = ["GET /**"]
credential_env = "NS_HELLO_KEY"
header = "X-Api-Key"
scheme = ""
"""
    text = text[: text.index("[network]")] + network + text[text.index("[isolation]") :] + tools
    profile = folder / "outside.toml"
    profile.write_text(text)
    profile.chmod(0o644)
    yield Served(port=port, profile=str(profile))
    server.shutdown()
    server.server_close()


PROBE = """
import errno, json, os, signal, socket, sys, urllib.request
import sandcell_tools

def err(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

me = os.getpid()
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
own = open("/proc/self/cgroup").read()

def kill(pid):
    os.kill(pid, signal.SIGKILL)

def write():
    open("/run/sandcell/planted", "w")

def bind():
    s = socket.socket()
    s.bind(("127.0.0.1", 3128 + 1))

def direct():
    socket.create_connection(("127.0.0.1", PORT), timeout=5).close()

out = {
    "others": len(others),
    "same_cgroup": [open(f"/proc/{p}/cgroup").read() == own for p in others],
    "kill": [err(lambda p=p: kill(p)) for p in others],
    "mem": [err(lambda p=p: open(f"/proc/{p}/mem", "rb")) for p in others],
    "write": err(write),
    "bind": err(bind),
    "direct": err(direct),
    "listing": sorted(os.listdir("/run/sandcell")),
    "lib_on_path": "/run/sandcell/lib" in sys.path,
    "fetched": urllib.request.urlopen("http://127.0.0.1:PORT/probe", timeout=20).read().decode(),
    "tool": sandcell_tools.call("hello.request", method="GET", path="/tool")["body"],
}
print(json.dumps(out))
"""


def test_the_bridge_is_out_of_the_programs_reach(sandbox: Sandbox, served: Served) -> None:
    """The program reaches the allowlisted server through the bridge and the tool through the
    gateway, while the bridge (the only other process but pid 1) shares its cgroup and cannot
    be killed or read by it, the socket directory is read-only, binding TCP stays denied and a
    direct connection to the server does not get through."""
    if sandbox.backend != "namespaces":
        pytest.skip("the namespaces backend's bridge; other rungs run theirs in their own way")
    res = sandbox.run(
        PROBE.replace("PORT", str(served.port)),
        profile=served.profile,
        host_env={"NS_HELLO_KEY": API_KEY},
    )
    assert res["outcome"] == "ok", res
    out = json.loads(str(res["stdout"]))
    assert out["fetched"] == "hello /probe keyed=False", out
    assert out["tool"] == "hello /tool keyed=True", out
    assert out["listing"] == ["egress.sock", "lib", "tools.sock"], out
    assert out["lib_on_path"], out
    # The bridge, forked by pid 1 before the program: in the run's cgroup, out of its reach.
    assert out["others"] == 1, out
    assert out["same_cgroup"] == [True], out
    assert out["kill"] == ["EPERM"], out
    assert out["mem"] == ["EACCES"], out
    assert out["write"] in ("EROFS", "EACCES"), out
    assert out["bind"] == "EACCES", out
    assert out["direct"] == "EACCES", out
    layers = res["enforcement"]["layers"]  # type: ignore[index]
    assert "egress proxy" in layers["outside"] and "egress_bridge" in layers, layers
    network = res["network"]
    assert isinstance(network, dict), res
    assert [(c["port"], c["allowed"]) for c in network["connections"]] == [(served.port, True)]


def test_a_session_reaches_the_proxy_and_the_gateway(root_home: Path, served: Served) -> None:
    """A session's sandbox gets its ways out once, for all its cells: the kernel finds the tool
    client on its path, and every cell's egress goes through the bridge the boot started."""
    import os

    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root")
    os.environ["NS_HELLO_KEY"] = API_KEY
    try:
        with (
            Executor(home=root_home, profile=served.profile) as ex,
            ex.session(limits=Limits(wall_time_s=20, memory_bytes=256 * MiB)) as s,
        ):
            # Read to the end of the connection, not to the body's length: the proxy keeps
            # its record before closing its side, so the end means the record is there for
            # this cell's share (on a loaded host it once came after the share was taken).
            first = s.run(
                "import os, socket, urllib.parse as p\n"
                "proxy = p.urlsplit(os.environ['http_proxy'])\n"
                "c = socket.create_connection((proxy.hostname, proxy.port), timeout=20)\n"
                f"host = '127.0.0.1:{served.port}'\n"
                "head = f'GET http://{host}/cell1 HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n'\n"
                "c.sendall(head.encode())\n"
                "reply = b''\n"
                "while chunk := c.recv(65536):\n"
                "    reply += chunk\n"
                "page = reply.partition(b'\\r\\n\\r\\n')[2]\n"
                "print(page.decode())"
            )
            second = s.run(
                "import sandcell_tools as t\n"
                "print(page.decode(), t.call('hello.request', method='GET', path='/c2')['body'])"
            )
    finally:
        os.environ.pop("NS_HELLO_KEY", None)
    assert first.outcome is Outcome.OK, first
    assert first.stdout.strip() == "hello /cell1 keyed=False", first.stdout
    assert second.outcome is Outcome.OK, second
    assert second.stdout.strip() == "hello /cell1 keyed=False hello /c2 keyed=True"
    assert first.network is not None and second.tools is not None
    connections, calls = first.network["connections"], second.tools["calls"]
    assert isinstance(connections, list) and isinstance(calls, list)
    assert [c["allowed"] for c in connections] == [True], connections
    assert [c["tool"] for c in calls] == ["hello.request"], calls
    assert second.enforcement is not None
    assert "egress_bridge" in second.enforcement.layers, second.enforcement.layers
