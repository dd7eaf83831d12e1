"""``[tools.NAME]`` profile sections and the ``METHOD /path`` rules of HTTP tools."""

from __future__ import annotations

import pytest

from sandcell.policy.profiles import ProfileError, parse_profile
from sandcell.tools.definitions import HttpTool, McpTool, ToolLimits
from sandcell.tools.http_rules import parse_http_rule, split_path

GOOD = b"""
[tools.weather]
kind = "http"
base_url = "https://api.example.com/v1/"
allow = ["GET /forecast/*", "POST /reports/**"]
credential_env = "WEATHER_API_KEY"
header = "X-Api-Key"
scheme = ""
max_calls = 5

[tools.tickets]
kind = "mcp"
command = ["ticket-mcp-server", "--stdio"]
allow = ["search_tickets", "create_ticket"]
approval = { create_ticket = "always" }

[tools.remote]
kind = "mcp"
url = "http://127.0.0.1:8000/mcp"
allow = ["search"]
approval = "always"
timeout_s = 2.5
"""


def _parse(raw: bytes):  # type: ignore[no-untyped-def]
    return parse_profile(raw, name="p", source="p.toml")


def test_a_profile_with_tools_parses_into_frozen_definitions() -> None:
    weather, tickets, remote = _parse(GOOD).tools
    assert isinstance(weather, HttpTool)
    assert weather.base_url == "https://api.example.com/v1"
    assert [r.show() for r in weather.allow] == ["GET /forecast/*", "POST /reports/**"]
    assert (weather.header, weather.scheme, weather.credential_env) == (
        "X-Api-Key",
        "",
        "WEATHER_API_KEY",
    )
    assert weather.limits == ToolLimits(max_calls=5)
    assert isinstance(tickets, McpTool)
    assert tickets.command == ("ticket-mcp-server", "--stdio")
    assert tickets.approval_for("create_ticket") == "always"
    assert tickets.approval_for("search_tickets") == "never"
    assert isinstance(remote, McpTool)
    assert remote.url == "http://127.0.0.1:8000/mcp"
    assert remote.approval_for("search") == "always"
    assert remote.limits.timeout_s == 2.5
    with pytest.raises(AttributeError):
        weather.base_url = "https://evil.example"  # type: ignore[misc]


def test_absent_tools_means_none() -> None:
    assert _parse(b'description = "x"\n').tools == ()


@pytest.mark.parametrize(
    ("toml", "line", "words"),
    [
        ('[tools.x]\nkind = "ftp"\n', 2, "unknown kind"),
        ('[tools.X]\nkind = "mcp"\n', 1, "lower-case"),
        ('[tools.x]\nkind = "mcp"\ncommand = ["a"]\nurl = "http://h/"\n', 2, "one"),
        ('[tools.x]\nkind = "mcp"\nallow = ["a"]\n', 2, "command (stdio) or url"),
        ('[tools.x]\nkind = "mcp"\ncommand = []\n', 3, "must name a program"),
        ('[tools.x]\nkind = "mcp"\ncommand = ["a"]\nallow = ["ok", "bad name"]\n', 4, "'bad name'"),
        (
            '[tools.x]\nkind = "mcp"\ncommand = ["a"]\nallow = ["a"]\napproval = "maybe"\n',
            5,
            "unknown approval",
        ),
        (
            '[tools.x]\nkind = "mcp"\ncommand = ["a"]\nallow = ["a"]\n'
            'approval = { b = "always" }\n',
            5,
            "not in allow",
        ),
        ('[tools.x]\nkind = "mcp"\ncommand = ["a"]\nhosts = []\n', 4, "unknown key"),
        ('[tools.x]\nkind = "mcp"\ncommand = ["a"]\nmax_calls = 0\n', 4, "positive integer"),
        (
            '[tools.x]\nkind = "mcp"\ncommand = ["a"]\nmax_result_bytes = 1e9\n',
            4,
            "positive integer",
        ),
        ('[tools.x]\nkind = "http"\nbase_url = "ftp://h/"\n', 3, "http(s) URL"),
        ('[tools.x]\nkind = "http"\nbase_url = "https://u:p@h/"\n', 3, "credential_env"),
        (
            '[tools.x]\nkind = "http"\nbase_url = "https://h"\nallow = ["FETCH /a"]\n',
            4,
            "METHOD /path",
        ),
        ('[tools.x]\nkind = "http"\nbase_url = "https://h"\nallow = ["GET /a/../b"]\n', 4, "'..'"),
        (
            '[tools.x]\nkind = "http"\nbase_url = "https://h"\nallow = ["GET /**/b"]\n',
            4,
            "may only end",
        ),
        (
            '[tools.x]\nkind = "http"\nbase_url = "https://h"\ncredential_env = "A-B"\n',
            4,
            "environment variable",
        ),
        ('[tools.x]\nkind = "http"\nbase_url = "https://h"\nheader = "X: y"\n', 4, "valid header"),
    ],
)
def test_bad_tool_sections_are_refused_at_their_line(toml: str, line: int, words: str) -> None:
    with pytest.raises(ProfileError) as info:
        _parse(toml.encode())
    assert info.value.line == line, str(info.value)
    assert words in str(info.value)


def test_tools_must_be_a_table() -> None:
    with pytest.raises(ProfileError, match="must be a table"):
        _parse(b'tools = "all"\n')


@pytest.mark.parametrize(
    ("rule", "method", "path", "allowed"),
    [
        ("GET /forecast/*", "GET", "/forecast/paris", True),
        ("GET /forecast/*", "GET", "/forecast/paris/hourly", False),
        ("GET /forecast/*", "GET", "/forecast", False),
        ("GET /forecast/*", "POST", "/forecast/paris", False),
        ("GET /forecast/**", "GET", "/forecast/paris/hourly", True),
        ("GET /forecast/**", "GET", "/forecast", True),
        ("GET /forecast/**", "GET", "/forecasts/x", False),
        ("GET /", "GET", "/", True),
        ("GET /a.json", "GET", "/a.json", True),
    ],
)
def test_http_rules_match_whole_segments(rule: str, method: str, path: str, allowed: bool) -> None:
    assert parse_http_rule(rule).matches(method, split_path(path)) is allowed


@pytest.mark.parametrize(
    "path",
    [
        "/forecast/../admin",
        "/forecast/./x",
        "/forecast//x",
        "/forecast/%2e%2e/admin",
        "/forecast/a%2fb",
        "/forecast/a%5cb",
        "/forecast/a%00",
        "/forecast/a%25",
        "/forecast/a?x=1",
        "/forecast/a#f",
        "/forecast/a b",
        "forecast/a",
        "/" + "a" * 3000,
    ],
)
def test_paths_that_could_climb_or_smuggle_are_refused(path: str) -> None:
    with pytest.raises(ValueError):
        split_path(path)


def test_escapes_of_ordinary_characters_are_kept() -> None:
    assert split_path("/forecast/s%C3%A3o") == ("forecast", "s%C3%A3o")
