"""The namespaces backend's plans for a run's ways out (``backends/namespaces/outside.py``):
the data (environment, Landlock port rules, bwrap bind, boot plan, warm request) and the boot's
real behaviour with them (a Landlock port rule applied by the kernel, the egress bridge started
by the boot before the program), run without bubblewrap like ``test_landlock.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandcell.backends import inside
from sandcell.backends.host import landlock as L
from sandcell.backends.namespaces import bwrap, outside, warm_request
from sandcell.errors import ConfigError
from sandcell.network import bridge as bridge_module
from sandcell.run_sockets import PROXY_PORT, SANDBOX_DIR, SANDBOX_LIB, SandboxSockets
from sandcell.runtimes import runtime_for
from sandcell.spec import RunRequest

BOOT = inside.BOOT_SCRIPT
ABI = L.probe_abi()
SOCKETS = SandboxSockets(host_dir=Path("/tmp/sandcell-x"), egress=True, tools=True)
_UNSHARE = ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc")
TOOLS_ONLY = SandboxSockets(host_dir=Path("/tmp/sandcell-y"), egress=False, tools=True)


# -- the data ---------------------------------------------------------------------------------


def test_program_env_adds_the_sockets_and_keeps_the_requests_pythonpath() -> None:
    base = {"HOME": "/tmp", "PATH": "/usr/bin"}
    env = outside.program_env(base, SOCKETS, {"PYTHONPATH": "/sandbox/src", "X": "1"})
    assert env["http_proxy"] == env["HTTPS_PROXY"] == f"http://127.0.0.1:{PROXY_PORT}"
    assert env["SANDCELL_TOOLS_SOCKET"] == f"{SANDBOX_DIR}/tools.sock"
    assert env["PYTHONPATH"] == f"/sandbox/src:{SANDBOX_LIB}"
    assert env["X"] == "1" and env["HOME"] == "/tmp"
    assert outside.program_env(base, None, {"X": "1"}) == {**base, "X": "1"}
    assert "http_proxy" not in outside.program_env(base, TOOLS_ONLY, {})


def test_bridge_script_is_the_bridges_command_without_its_interpreter() -> None:
    script = outside.bridge_script(SOCKETS)
    assert script == [
        f"{SANDBOX_DIR}/lib/sandcell_bridge.py",
        f"127.0.0.1:{PROXY_PORT}",
        f"{SANDBOX_DIR}/egress.sock",
    ]
    assert outside.bridge_script(TOOLS_ONLY) is None
    assert outside.bridge_script(None) is None


def test_landlock_extras_and_report_lines() -> None:
    assert outside.landlock_extras(None) == ((), ())
    # The port is reachable for every run with sockets: without a bridge it is closed.
    assert outside.landlock_extras(TOOLS_ONLY) == ((SANDBOX_DIR,), (PROXY_PORT,))
    assert outside.layers(None, landlock_abi=7, cgroup=True) == {}
    lines = outside.layers(SOCKETS, landlock_abi=7, cgroup=True)
    assert f"connect to port {PROXY_PORT}" in lines["outside"]
    assert "cgroup" in lines["egress_bridge"]
    assert "rlimits" in outside.layers(SOCKETS, landlock_abi=7, cgroup=False)["egress_bridge"]
    assert "needs ABI 4" in outside.layers(SOCKETS, landlock_abi=3, cgroup=True)["outside"]
    assert "egress_bridge" not in outside.layers(TOOLS_ONLY, landlock_abi=7, cgroup=True)


def test_port_rules_compile_only_where_tcp_is_handled() -> None:
    plan = L.build_plan(
        runtime_paths=["/usr"],
        input_dir=None,
        abi=7,
        extra_read_only=[SANDBOX_DIR],
        connect_tcp_ports=[PROXY_PORT, PROXY_PORT],
    )
    assert dict(plan.rules)[SANDBOX_DIR] == L.RIGHTS_READ_ONLY
    assert plan.ruleset()["net_rules"] == [[PROXY_PORT, L.ACCESS_NET_CONNECT_TCP]]
    assert "tcp denied but connect to port 3128" in L.describe(plan)
    assert L.LandlockPlan.from_json(plan.to_json()) == plan
    # ABI 3 handles no TCP: nothing to open.
    assert "net_rules" not in replace(plan, abi=3).ruleset()
    # A plan without ports compiles as before (other backends read the same format).
    bare = replace(plan, connect_tcp_ports=())
    assert "net_rules" not in bare.ruleset() and "connect_tcp_ports" not in bare.to_dict()
    for bad in ((0,), (70000,), ("3128",)):
        with pytest.raises(ConfigError):
            replace(plan, connect_tcp_ports=bad)  # type: ignore[arg-type]


def test_boot_plan_carries_the_bridge_and_refuses_a_malformed_one(tmp_path: Path) -> None:
    text = L.boot_plan_json(plan=None, bridge=["/run/sandcell/lib/b.py", "127.0.0.1:3128", "s"])
    assert json.loads(text)["bridge"] == ["/run/sandcell/lib/b.py", "127.0.0.1:3128", "s"]
    assert "bridge" not in json.loads(L.boot_plan_json(plan=None))
    with pytest.raises(ConfigError):
        L.boot_plan_json(plan=None, bridge=[])
    for bad in ('"x"', "[]", "[1]"):
        path = tmp_path / "plan.json"
        path.write_text(f'{{"format": 1, "bridge": {bad}}}')
        r = subprocess.run(
            [sys.executable, "-I", str(BOOT), str(path), "python", "/nonexistent.py"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 125 and "malformed bridge" in r.stderr, r.stderr


def test_bwrap_binds_the_socket_directory_read_only() -> None:
    plan = bwrap.BwrapPlan(
        bwrap="bwrap",
        ro_dirs=(),
        symlinks=(),
        workspace=Path("/w"),
        control_dir=Path("/c"),
        etc_dir=Path("/e"),
        inputs=(),
        sockets_dir=Path("/tmp/sandcell-x"),
        env={},
        tmp_bytes=1,
        seccomp_fd=None,
        info_fd=3,
        block_fd=4,
        command=["true"],
    )
    argv = bwrap.build_argv(plan)
    i = argv.index("/tmp/sandcell-x")
    assert argv[i - 1 : i + 2] == ["--ro-bind", "/tmp/sandcell-x", SANDBOX_DIR]
    assert "/tmp/sandcell-x" not in bwrap.build_argv(replace(plan, sockets_dir=None))


def test_warm_requests_and_plans() -> None:
    plans = warm_request.LandlockPlans(runtime_for("python"))
    with_port, without = plans.for_abi(7, egress=True), plans.for_abi(7)
    assert with_port is not None and without is not None
    assert with_port["ruleset"]["net_rules"] == [[PROXY_PORT, L.ACCESS_NET_CONNECT_TCP]]
    assert "net_rules" not in without["ruleset"]
    # The socket directory is moved into the run's /sandcell tmpfs, whose root holds the rule
    # (a rule on a mount point would be hidden by the mount).
    assert "/sandcell" in with_port["read_only"] and "/sandcell" in without["read_only"]
    request = RunRequest(code="print(1)", env={"A": "b"})
    doc = warm_request.request_doc(request, env={"HOME": "/tmp"}, landlock_plan=None)
    assert (doc["sockets"], doc["bridge"], doc["python_paths"]) == (False, None, [])
    assert doc["env"] == {"HOME": "/tmp", "A": "b"}
    doc = warm_request.request_doc(
        request, env={"HOME": "/tmp"}, landlock_plan=None, sockets=SOCKETS
    )
    assert doc["sockets"] is True and doc["python_paths"] == [SANDBOX_LIB]
    assert doc["bridge"] == outside.bridge_script(SOCKETS)
    assert doc["env"]["https_proxy"] == f"http://127.0.0.1:{PROXY_PORT}"


# -- the boot, for real -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _boot(tmp_path: Path, plan_text: str, code: str) -> subprocess.CompletedProcess[str]:
    """The boot as the pid 1 of a pid namespace of its own (as in a sandbox), so that whatever
    it started ends with it."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    plan = tmp_path / "plan.json"
    plan.write_text(plan_text)
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(code))
    # A second status descriptor, as the host passes one: the boot forks and reports there.
    status_r, status_w = os.pipe()
    doc = json.loads(plan_text)
    doc["status_fd"] = status_w
    plan.write_text(json.dumps(doc))
    try:
        r = subprocess.run(
            [*_UNSHARE, sys.executable, "-I", str(BOOT), str(plan), "python", str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            pass_fds=(status_w,),
            cwd=tmp_path,
        )
    finally:
        os.close(status_w)
        os.close(status_r)
    if r.returncode != 0 and "unshare failed" in r.stderr:
        pytest.skip(f"no user namespaces here: {r.stderr.strip()}")
    return r


def _plan(tmp_path: Path, ports: tuple[int, ...]) -> L.LandlockPlan:
    assert ABI is not None
    runtime = {sys.prefix, sys.base_prefix, "/usr", *map(str, Path("/").glob("lib*"))}
    runtime.add(os.path.dirname(os.path.realpath(sys.executable)))
    return L.build_plan(
        runtime_paths=sorted(runtime),
        input_dir=None,
        work_dir=str(tmp_path),
        abi=ABI,
        connect_tcp_ports=ports,
    )


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Path]:
    """A Unix socket that answers each connection's bytes upper-cased (the proxy's stand-in)."""
    path = tmp_path / "egress.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(100).upper())

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()


def test_the_boot_starts_the_bridge_and_opens_only_its_port(tmp_path: Path, echo: Path) -> None:
    if ABI is None or ABI < 6:
        pytest.skip(f"TCP rules and signal scoping need Landlock ABI 6, the kernel has {ABI}")
    port, other = _free_port(), _free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", other))
        listener.listen(1)
        plan = L.boot_plan_json(
            plan=_plan(tmp_path, (port,)),
            bridge=[str(bridge_module.__file__), f"127.0.0.1:{port}", str(echo)],
        )
        r = _boot(
            tmp_path,
            plan,
            f"""
            import errno, os, signal, socket
            with socket.create_connection(("127.0.0.1", {port}), timeout=10) as s:
                s.sendall(b"through the bridge")
                print(s.recv(100).decode())
            for what, fn in (
                ("other port", lambda: socket.create_connection(("127.0.0.1", {other}))),
                ("bind", lambda: socket.socket().bind(("127.0.0.1", 0))),
            ):
                try:
                    fn()
                    print(what, "open")
                except OSError as exc:
                    print(what, errno.errorcode[exc.errno])
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
            others = [p for p in pids if p not in (1, os.getpid())]
            for p in others:
                try:
                    os.kill(p, signal.SIGKILL)
                    print("bridge killed")
                except OSError as exc:
                    print("kill", errno.errorcode[exc.errno])
            """,
        )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "THROUGH THE BRIDGE",
        "other port EACCES",
        "bind EACCES",
        "kill EPERM",
    ], r.stdout


def test_a_bridge_that_cannot_listen_stops_the_boot(tmp_path: Path, echo: Path) -> None:
    plan = L.boot_plan_json(
        plan=None, bridge=[str(bridge_module.__file__), "127.0.0.1:notaport", str(echo)]
    )
    r = _boot(tmp_path, plan, "print('the program ran')")
    assert r.returncode == 125, (r.stdout, r.stderr)
    assert "the egress bridge did not start" in r.stderr and "the program ran" not in r.stdout
