"""Code mode end to end: the agent under a profile that reaches outside, through the real executor
and sandbox, with a scripted model.

The model is told its tools as a typed Python API and its allowlisted hosts; its program calls a
governed HTTP tool (a loopback API that wants a key only the host holds) and an MCP tool (the
official SDK's server over stdio), or fetches from a loopback web server through the run's
proxy, reduces the results in the sandbox and prints two lines. Only those lines reach the
model; the calls and connections are in the run's record.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.conftest import REPO, run_cli

from sandcell import Executor
from sandcell.agent import Agent, Answer
from sandcell.models.base import Message
from sandcell.models.fake import Scripted, ScriptedModel, Turn, call
from sandcell.policy.profiles import Profile, load_profile

SERVER = Path(__file__).resolve().parents[1] / "mcp_ticket_server.py"
API_KEY = f"wx-{secrets.token_hex(12)}"
TICKETS_TOKEN = f"tk-{secrets.token_hex(12)}"
CSV = b"day,visits\nmon,120\ntue,95\nwed,143\n"


class _Api(BaseHTTPRequestHandler):
    """/v1/forecast/CITY with the right X-Api-Key; /data.csv for anyone; else 401/404."""

    def do_GET(self) -> None:
        if self.path == "/data.csv":
            self._send(200, CSV, "text/csv")
        elif self.headers.get("X-Api-Key") != API_KEY:
            self._send(401, b'{"error": "bad credential"}', "application/json")
        elif self.path.startswith("/v1/forecast/"):
            body = {"city": self.path.split("/")[3], "temp": 21, "rain_mm": [0.0, 1.5, 4.25]}
            self._send(200, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b'{"error": "no such path"}', "application/json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[Executor]:
    if os.geteuid() != 0:
        pytest.skip("the agent's contract tests use the in-process executor, which runs as root")
    with Executor(home=tmp_path / "home", profile="strict") as ex:
        yield ex


def _profile(tmp_path: Path, name: str, sections: str) -> Profile:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        'description = "code mode test"\napproval = "on_findings"\n'
        '[runtime]\nlanguages = ["python"]\nallowed_imports = []\n' + sections
    )
    return load_profile(str(path))


def _ask(
    executor: Executor, profile: Profile, turns: Sequence[Turn], question: str
) -> tuple[Answer, ScriptedModel]:
    model = ScriptedModel(turns)
    return Agent(executor, model, profile=profile).ask(question), model


def _seen(messages: Sequence[Message]) -> str:
    return "\n".join(m.content for m in messages)


TOOLS_CODE = """\
import sandcell_tools

found = sandcell_tools.call("tickets.search_tickets", query="refund", limit=50)
still_open = [t for t in found["structuredContent"]["result"] if t["status"] == "open"]
oslo = sandcell_tools.call("weather.request", method="GET", path="/forecast/oslo")
print("open refund tickets:", len(still_open))
print("oslo rain mm:", sum(oslo["body"]["rain_mm"]))
"""
TOOLS_ANSWER = (
    '```answer\n{"explanation": "2 refund tickets are open; Oslo expects 5.75 mm of rain.", '
    '"figures": [{"name": "open refund tickets", "value": 2, "run": 1}, '
    '{"name": "rain", "value": 5.75, "unit": "mm", "run": 1}]}\n```'
)


def test_the_model_calls_governed_tools_from_code_and_sees_only_what_it_printed(
    executor: Executor, port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mcp", reason="the MCP SDK (extra 'tools') is not installed")
    monkeypatch.setenv("WEATHER_API_KEY", API_KEY)
    monkeypatch.setenv("TICKETS_TOKEN", TICKETS_TOKEN)
    profile = _profile(
        tmp_path,
        "code-mode-tools",
        f"""
[tools.weather]
kind = "http"
base_url = "http://127.0.0.1:{port}/v1"
allow = ["GET /forecast/*"]
credential_env = "WEATHER_API_KEY"
header = "X-Api-Key"
scheme = ""

[tools.tickets]
kind = "mcp"
command = ["{sys.executable}", "{SERVER}", "stdio"]
allow = ["search_tickets", "create_ticket"]
credential_env = "TICKETS_TOKEN"
approval = {{ create_ticket = "always" }}
""",
    )
    turns = [f"Plan: call the tools.\n\n```python\n{TOOLS_CODE}```\n", TOOLS_ANSWER]
    answer, model = _ask(executor, profile, turns, "How many refund tickets are open?")
    assert answer.stop_reason == "answered", answer.message

    # The prompt: the typed API with the server's own schema, and how to use it.
    system = model.calls[0][0].content
    assert "def tickets__search_tickets(*, query: str, limit: int = 10) -> McpResult:" in system
    assert 'sandcell_tools.call("weather.request", method=..., path=...' in system
    assert "Each call waits for a person's approval" in system  # create_ticket
    assert "Only what the program prints comes back to you" in system

    (attempt,) = answer.attempts
    assert attempt.ok, attempt.reason
    assert "open refund tickets: 2" in attempt.stdout and "oslo rain mm: 5.75" in attempt.stdout
    # What came back to the model is what the program printed, not the tools' raw results.
    assert "open refund tickets: 2" in model.calls[1][-1].content
    told = _seen([m for m in model.calls[-1] if m.role != "assistant"])
    assert "refund for order 17" not in told and "rain_mm" not in told
    everything = _seen(model.calls[-1]) + attempt.stdout + attempt.stderr
    assert API_KEY not in everything and TICKETS_TOKEN not in everything

    # Both calls are in the run's record, allowed, and nothing else was called.
    assert attempt.run_id is not None
    entry = executor.audit.get(attempt.run_id)
    assert entry is not None
    tools = entry.record["tools"]
    assert isinstance(tools, dict) and tools["profile"] == "code-mode-tools"
    calls = [(c["tool"], c["decision"]) for c in tools["calls"] if c["operation"] == "call"]
    assert calls == [("tickets.search_tickets", "allowed"), ("weather.request", "allowed")]


NET_CODE = """\
import csv, io, urllib.request

with urllib.request.urlopen("http://127.0.0.1:%PORT%/data.csv", timeout=20) as r:
    rows = list(csv.DictReader(io.StringIO(r.read().decode())))
print("days:", len(rows))
print("visits:", sum(int(r["visits"]) for r in rows))
"""
NET_ANSWER = Scripted(
    tool_calls=(
        call(
            "answer",
            explanation="358 visits over 3 days.",
            figures=[{"name": "visits", "value": 358, "run": 1}],
        ),
    )
)


def test_the_model_is_told_its_hosts_and_its_program_reaches_them_through_the_proxy(
    executor: Executor, port: int, tmp_path: Path
) -> None:
    profile = _profile(
        tmp_path,
        "code-mode-net",
        f'[network]\nmode = "allowlist"\nhosts = ["127.0.0.1:{port}"]\n'
        'allow_addresses = ["127.0.0.1/32"]\n',
    )
    code = NET_CODE.replace("%PORT%", str(port))
    # Native tool calling this time: run_code's own description names the proxy too.
    turns = [Scripted(tool_calls=(call("run_code", code=code),)), NET_ANSWER]
    answer, model = _ask(executor, profile, turns, "How many visits in data.csv?")
    assert answer.stop_reason == "answered", answer.message
    run_code = model.tools[0][0]
    assert "no network" not in run_code.description and "proxy" in run_code.description
    system = model.calls[0][0].content
    assert "No network" not in system and f"127.0.0.1:{port}" in system
    assert "sandcell_tools" not in system  # no tools, no tool API
    (attempt,) = answer.attempts
    assert "visits: 358" in attempt.stdout
    assert attempt.run_id is not None
    entry = executor.audit.get(attempt.run_id)
    assert entry is not None
    network = entry.record["network"]
    assert isinstance(network, dict)
    seen = [(c["host"], c["port"], c["allowed"]) for c in network["connections"]]
    assert seen == [("127.0.0.1", port, True)]


def test_the_example_profile_and_script_answer_through_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the MCP SDK (extra 'tools') is not installed")
    if os.geteuid() != 0:
        pytest.skip("this run uses the root sandbox path; this test run is not root")
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("the example's MCP server runs with the repository's .venv/bin/python")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "SANDCELL_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO / "src"),
        "WEATHER_API_KEY": API_KEY,
        "TICKETS_TOKEN": TICKETS_TOKEN,
    }
    question = "How many refund tickets are still open?"
    args = ["--profile", "examples/profiles/tickets-tools.toml", "--json"]
    script = "scripted:examples/agent/open_refunds.turns.json"
    proc = run_cli(["ask", question, *args, "--model", script], env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["stop_reason"] == "answered" and body["profile"] == "tickets-tools"
    (attempt,) = body["attempts"]
    assert "open refund tickets: 2" in attempt["stdout"]
    assert API_KEY not in proc.stdout and TICKETS_TOKEN not in proc.stdout
    shown = run_cli(["audit", "show", attempt["run_id"]], env=env, cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    assert "tickets.search_tickets" in shown.stdout
