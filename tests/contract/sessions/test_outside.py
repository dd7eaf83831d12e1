"""Sessions that reach outside: one egress proxy and one tool gateway for the session's life,
and each cell's record holds exactly what that cell did. On every rung, as root through the
in-process executor (the CLI paths of sessions are the same Session object); the microVM's
session is one of the pool's clones, as every in-process session of this package."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from tests.contract.sessions.rungs import open_session
from tests.integration.loopback_http import JsonHandler, serving

from sandcell import ConfigError, Executor, Limits
from sandcell.policy.profiles import Profile, parse_profile
from sandcell.sessions import PauseRefused
from sandcell.spec import MiB

KEY = f"key-{secrets.token_hex(10)}"


class _Api(JsonHandler):
    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}" or self.path.startswith("/web")
        self.send_json({"path": self.path, "ok": ok}, 200 if ok else 401)


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    with serving(_Api) as port:
        yield port


def _profile(port: int) -> Profile:
    text = f"""
approval = "never"
[network]
mode = "allowlist"
hosts = ["127.0.0.1:{port}"]
allow_addresses = ["127.0.0.1/32"]
[runtime]
allowed_imports = ["*"]
[checks]
disabled = ["py.network", "py.import"]
[tools.api]
kind = "http"
base_url = "http://127.0.0.1:{port}"
allow = ["GET /items/*"]
credential_env = "SESSION_API_KEY"
"""
    return parse_profile(text.encode(), name="session-outside", source="session-outside.toml")


CELL = """
import json, urllib.request, sandcell_tools
with urllib.request.urlopen("http://127.0.0.1:{port}/web/{n}", timeout=20) as r:
    print("web", r.status)
print("tool", sandcell_tools.call("api.request", method="GET", path="/items/{n}")["status"])
"""


def refused_on_wasm(rung: str, ex: Executor, profile: Profile) -> None:
    """On the wasm rung, assert that a session with ``profile`` (which has ways out) is refused
    before it starts, then skip: the rung has no network and no governed tools."""
    if rung != "wasm":
        return
    with pytest.raises(ConfigError, match="no network and no governed tools"):
        open_session(ex, profile=profile)
    pytest.skip(
        "wasm: the rung has no network and no governed tools (its programs run as WebAssembly, "
        "without sockets); a profile with ways out is refused before the session starts "
        "(asserted), and the checks of the ways out do not apply"
    )


def test_each_cell_records_its_own_connections_and_calls(
    rung: str, ex: Executor, api: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSION_API_KEY", KEY)
    profile = _profile(api)
    refused_on_wasm(rung, ex, profile)
    with open_session(
        ex, profile=profile, limits=Limits(wall_time_s=30, memory_bytes=256 * MiB)
    ) as s:
        first = s.run(CELL.format(port=api, n=1))
        second = s.run(CELL.format(port=api, n=2) + "print(len(dir()))")
    for n, result in ((1, first), (2, second)):
        assert result.ok, (result.reason, result.stderr)
        assert "web 200" in result.stdout and "tool 200" in result.stdout, result.stdout
        assert result.network is not None and result.tools is not None
        conns = result.network["connections"]
        assert isinstance(conns, list) and len(conns) == 1, conns
        assert conns[0]["allowed"] and conns[0]["port"] == api, conns
        calls = result.tools["calls"]
        assert isinstance(calls, list) and len(calls) == 1, calls
        assert calls[0]["decision"] == "allowed", calls
        assert KEY not in result.stdout


def test_a_session_with_ways_out_keeps_its_files_and_comes_back_with_new_ones(
    rung: str, ex: Executor, api: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its proxy's and gateway's connections live on the host, so no rung pauses its memory
    (a restored sandbox would hold connections to nothing, or to something else); a files pause
    keeps the workspace and the resumed session gets ways out of its own, recorded anew. A
    profile parsed by the caller is not found by name: the resume is given it."""
    monkeypatch.setenv("SESSION_API_KEY", KEY)
    profile = _profile(api)
    refused_on_wasm(rung, ex, profile)
    s = open_session(ex, profile=profile, limits=Limits(wall_time_s=30, memory_bytes=256 * MiB))
    first = s.run(CELL.format(port=api, n=1) + "open('kept', 'w').write('kept')")
    assert first.ok, (first.reason, first.stderr)
    with pytest.raises(PauseRefused):
        s.pause(mode="memory")
    assert s.ended is None
    s.pause(mode="files")
    with pytest.raises(ConfigError, match="session-outside"):
        ex.resume(s.id)
    with ex.resume(s.id, profile=profile) as back:
        again = back.run(CELL.format(port=api, n=3) + "print(open('kept').read())")
    assert again.ok, (again.reason, again.stderr)
    assert "web 200" in again.stdout and "tool 200" in again.stdout and "kept" in again.stdout
    assert again.network is not None and len(again.network["connections"]) == 1
