"""The example profiles under examples/profiles load and allow what their comments say."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.conftest import run_cli

from sandcell.network.allowlist import normalise_host
from sandcell.policy.profiles import load_profile
from sandcell.run_sockets import needs_sockets
from sandcell.tools.definitions import HttpTool, McpTool
from sandcell.tools.http_rules import split_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "profiles"


def test_every_example_profile_loads_and_reaches_outside() -> None:
    paths = sorted(EXAMPLES.glob("*.toml"))
    assert [p.name for p in paths] == ["fetch-data.toml", "tickets-tools.toml"]
    for path in paths:
        profile = load_profile(str(path))
        assert profile.name == path.stem and profile.description
        assert needs_sockets(profile), path


def test_fetch_data_allows_its_hosts_on_https_only_and_nothing_else() -> None:
    profile = load_profile(str(EXAMPLES / "fetch-data.toml"))
    assert profile.allows_network() and not profile.tools
    allowlist = profile.network.allowlist
    assert [r.show() for r in allowlist.rules] == [
        "pypi.org:443",
        "files.pythonhosted.org:443",
        "api.open-meteo.com:443",
    ]
    assert allowlist.allow_addresses == ()  # public addresses only

    def allowed(host: str, port: int) -> bool:
        return allowlist.rule_for(normalise_host(host), port) is not None

    assert allowed("pypi.org", 443) and allowed("PyPI.org.", 443)
    assert not allowed("pypi.org", 80) and not allowed("evil.pypi.org", 443)
    assert not allowed("example.com", 443) and not allowed("127.0.0.1", 443)
    assert (profile.network.max_connections, profile.network.max_mb_down) == (200, 256)
    assert profile.runtime.languages == ("python",)


def test_tickets_tools_has_an_http_and_an_mcp_tool_and_no_network() -> None:
    profile = load_profile(str(EXAMPLES / "tickets-tools.toml"))
    assert not profile.allows_network()
    weather, tickets = profile.tools
    assert isinstance(weather, HttpTool) and isinstance(tickets, McpTool)
    assert weather.credential_env == "WEATHER_API_KEY"
    assert any(r.matches("GET", split_path("/forecast/oslo")) for r in weather.allow)
    assert not any(r.matches("POST", split_path("/forecast/oslo")) for r in weather.allow)
    assert not any(r.matches("GET", split_path("/admin/keys")) for r in weather.allow)
    assert tickets.allow == ("search_tickets", "create_ticket")
    assert tickets.approval_for("create_ticket") == "always"
    assert tickets.approval_for("search_tickets") == "never"
    assert tickets.credential_env == "TICKETS_TOKEN"
    # The server it names is the repository's, run from the repository root.
    assert (ROOT / tickets.command[1]).is_file()
    allowed = profile.import_allowlist()
    assert allowed is not None and "sandcell_tools" in allowed


def test_tickets_tools_lists_its_operations_from_the_repository_root() -> None:
    pytest.importorskip("mcp", reason="the MCP SDK (extra 'tools') is not installed")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("the example's MCP server runs with the repository's .venv/bin/python")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": os.pathsep.join(sys.path),
        "WEATHER_API_KEY": "example-weather-key",
        "TICKETS_TOKEN": "example-tickets-token",
    }
    out = run_cli(
        ["tools", "list", "--profile", "examples/profiles/tickets-tools.toml"], env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines() if not line.startswith(" ")]
    assert names == ["weather.request", "tickets.search_tickets", "tickets.create_ticket"]
    assert "[approval: always]" in out.stdout and "example-" not in out.stdout
