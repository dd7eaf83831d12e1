"""The host side of a run's ways out: what the directory holds, what the sandbox is told, how
records are shared out between a session's cells, and that nothing is left behind."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from sandcell.errors import ConfigError
from sandcell.policy.profiles import Profile, parse_profile
from sandcell.run_sockets import PROXY_URL, RunSockets, SandboxSockets, needs_sockets

BOTH = """
[network]
mode = "allowlist"
hosts = ["api.example.com"]
[tools.api]
kind = "http"
base_url = "https://api.example.com"
allow = ["GET /x/*"]
credential_env = "RS_TEST_KEY"
"""


def _profile(text: str) -> Profile:
    return parse_profile(text.encode(), name="rs", source="rs.toml")


def test_a_profile_without_network_or_tools_gets_nothing() -> None:
    profile = _profile("")
    assert not needs_sockets(profile)
    assert RunSockets.open(profile, approver=None, approval_timeout_s=1) is None


def test_the_directory_the_sandbox_sees_and_what_it_is_told() -> None:
    sockets = RunSockets.open(
        _profile(BOTH),
        approver=None,
        approval_timeout_s=1,
        environ={"RS_TEST_KEY": "secret-value-123"},
    )
    assert sockets is not None
    box = sockets.sandbox
    try:
        mode = box.host_dir.stat().st_mode
        assert stat.S_IMODE(mode) == 0o700 and box.host_dir.stat().st_uid == os.geteuid()
        names = sorted(str(p.relative_to(box.host_dir)) for p in box.host_dir.rglob("*"))
        assert names == [
            "egress.sock",
            "lib",
            "lib/sandcell_bridge.py",
            "lib/sandcell_tools.py",
            "tools.sock",
        ]
        assert stat.S_ISSOCK((box.host_dir / "egress.sock").stat().st_mode)
        assert len(os.fsencode(box.host_dir / "egress.sock")) < 108
        env = box.env()
        assert env["https_proxy"] == env["HTTP_PROXY"] == PROXY_URL
        assert env["SANDCELL_TOOLS_SOCKET"] == "/run/sandcell/tools.sock"
        assert "secret-value-123" not in repr(env)
        assert box.bridge_argv("/usr/bin/python3") == [
            "/usr/bin/python3",
            "-I",
            "/run/sandcell/lib/sandcell_bridge.py",
            "127.0.0.1:3128",
            "/run/sandcell/egress.sock",
        ]
        assert sockets.secrets == ("secret-value-123",)
        # A refused connection becomes the first cell's share, and only that cell's.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(box.host_dir / "egress.sock"))
            s.sendall(b"CONNECT evil.example.org:443 HTTP/1.1\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
            assert b" 403 " in answer
        # The proxy records an attempt as it closes it: just after the program saw the end.
        refused, deadline = 0, time.monotonic() + 10
        while refused == 0 and time.monotonic() < deadline:
            network = sockets.take_record()["network"]
            assert isinstance(network, dict)
            refused += int(str(network["refused"]))
            time.sleep(0.01)
        assert refused == 1
        again = sockets.take_record()["network"]
        assert isinstance(again, dict) and again["connections"] == []
    finally:
        final = sockets.close()
    assert not box.host_dir.exists()
    assert final["tools"] == {"profile": "rs", "calls": [], "unrecorded": 0}
    assert sockets.close() == {"network": None, "tools": None}


def test_a_missing_credential_fails_clearly_and_leaves_nothing(tmp_path: Path) -> None:
    before = set(Path("/tmp").glob("sandcell-*"))
    with pytest.raises(ConfigError, match=r"\$RS_TEST_KEY, which is not set"):
        RunSockets.open(_profile(BOTH), approver=None, approval_timeout_s=1, environ={})
    assert set(Path("/tmp").glob("sandcell-*")) <= before


def test_without_egress_there_is_no_bridge() -> None:
    box = SandboxSockets(host_dir=Path("/x"), egress=False, tools=True)
    assert box.bridge_argv("python3") is None
    assert "https_proxy" not in box.env()
    assert box.describe() == "tool gateway socket (host-side)"


def _refused_attempt(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(b"CONNECT evil.example.org:443 HTTP/1.1\r\n\r\n")
        while s.recv(4096):
            pass


def _cell_share(sockets: RunSockets, refused: int) -> dict[str, object]:
    """The network share of one cell that made ``refused`` refused attempts, taken once the
    proxy has recorded all of them (it records an attempt as it closes it)."""
    listed: list[object] = []
    counted, dropped, deadline = 0, 0, time.monotonic() + 10
    while counted < refused and time.monotonic() < deadline:
        network = sockets.take_record()["network"]
        assert isinstance(network, dict)
        listed += network["connections"]
        counted += int(str(network["refused"]))
        dropped += int(str(network["refused_dropped"]))
        time.sleep(0.01)
    return {"connections": listed, "refused": counted, "refused_dropped": dropped}


def test_each_cell_says_how_many_of_its_refused_attempts_are_not_listed(tmp_path: Path) -> None:
    from sandcell.network.allowlist import parse_allowlist
    from sandcell.network.caps import ProxyLimits
    from sandcell.network.proxy import EgressProxy

    proxy = EgressProxy(
        profile="rs",
        allowlist=parse_allowlist(("api.example.com",), ()),
        socket_path=tmp_path / "egress.sock",
        limits=ProxyLimits(max_refused_records=1),
    )
    proxy.start()
    sockets = RunSockets(host_dir=tmp_path, proxy=proxy, gateway=None)
    try:
        for _ in range(3):
            _refused_attempt(tmp_path / "egress.sock")
        first = _cell_share(sockets, 3)
        assert first["refused"] == 3 and first["refused_dropped"] == 2
        assert len(first["connections"]) == 1  # type: ignore[arg-type]
        _refused_attempt(tmp_path / "egress.sock")
        second = _cell_share(sockets, 1)
        assert second == {"connections": [], "refused": 1, "refused_dropped": 1}
    finally:
        final = sockets.close()
    assert isinstance(final["network"], dict) and final["network"]["refused_dropped"] == 0
