"""The people-facing side of a run that reaches outside, through the command line:

* a tool call waiting for approval while ``sandcell run`` runs in one process and a person
  decides with ``sandcell approvals list|show`` and ``sandcell approve|deny`` in others;
* a person at the run's own terminal answering the question there (a pseudo-terminal);
* ``sandcell audit show`` listing connection attempts and tool calls one a line, and ``run``'s
  one-line summary of them.

Every run is real (namespaces, cold, as root); servers are on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.integration.loopback_http import JsonHandler, serving

from sandcell.audit import AuditLog
from sandcell.policy.approvals import ApprovalStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="real sandboxed runs need root here")


class _Api(JsonHandler):
    def do_GET(self) -> None:
        self.send_json({"path": self.path})

    def do_POST(self) -> None:
        self.send_json({"created": self.json_body().get("title")})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving(_Api) as bound:
        yield bound


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def profile(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "outside.toml"
    path.write_text(
        f"""
approval = "never"
[network]
mode = "allowlist"
hosts = ["127.0.0.1:{port}"]
allow_addresses = ["127.0.0.1/32"]
[runtime]
allowed_imports = ["*"]
[checks]
disabled = ["py.network", "py.import"]
[tools.tickets]
kind = "http"
base_url = "http://127.0.0.1:{port}"
allow = ["POST /tickets"]
approval = "always"
"""
    )
    return path


# One allowed connection, one refused (an address outside the allowlist), one tool call that
# needs approval; the program prints what each gave it.
PROGRAM = """
import json, urllib.error, urllib.request, sandcell_tools as tools
out = {{}}
with urllib.request.urlopen("http://127.0.0.1:{port}/web/1", timeout=30) as r:
    out["web"] = json.load(r)["path"]
try:
    urllib.request.urlopen("http://127.0.0.2:{port}/elsewhere", timeout=30)
except urllib.error.HTTPError as e:
    out["elsewhere"] = e.code
try:
    out["tool"] = tools.call("tickets.request", method="POST", path="/tickets",
                             json={{"title": "from the cli"}})["body"]
except tools.ToolError as e:
    out["tool"] = "refused: " + str(e)
print(json.dumps(out))
"""


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "SANDCELL_HOME": str(home), "SANDCELL_APPROVER": "carol@desk"}


def sandcell(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(list(args), env=_env(home))


def _start_run(
    home: Path, profile: Path, port: int, stdin: int, *, ctty: bool = False
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "sandcell", "run", "--profile", str(profile), "--timeout", "60"]
    if ctty:
        # A session of its own whose controlling terminal is stdin, in the foreground: as a run
        # started from a shell prompt is (util-linux setsid; --wait keeps the exit status).
        if shutil.which("setsid") is None:
            pytest.skip("setsid (util-linux) is not installed")
        argv = ["setsid", "--ctty", "--wait", *argv]
    return subprocess.Popen(
        [*argv, "-c", PROGRAM.format(port=port)],
        env=_env(home),
        text=True,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _pending_tool_ticket(home: Path, run: subprocess.Popen[str]) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = sandcell(home, "approvals", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        calls = [t for t in json.loads(listed.stdout) if t.get("kind") == "tool_call"]
        if calls:
            (call,) = calls
            assert isinstance(call, dict)
            return call
        if run.poll() is not None:
            pytest.fail(f"the run ended without waiting: {run.communicate()}")
        time.sleep(0.2)
    run.kill()
    pytest.fail("no tool call ticket appeared")


def _finish(run: subprocess.Popen[str]) -> tuple[dict[str, object], str]:
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    return json.loads(stdout.splitlines()[-1]), stderr


def _run_id(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("sandcell: outside:")]
    return line.rsplit("sandcell audit show ", 1)[1].rstrip(")")


@needs_root
def test_approve_from_another_terminal_then_audit_show_lists_everything(
    home: Path, profile: Path, port: int
) -> None:
    run = _start_run(home, profile, port, stdin=subprocess.DEVNULL)
    call = _pending_tool_ticket(home, run)
    tid = str(call["id"])
    assert (call["status"], call["tool"], call["profile"]) == (
        "pending",
        "tickets.request",
        "outside",
    )

    text = sandcell(home, "approvals", "list")
    (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith(tid)]
    assert "tool" in line and "pending" in line and "tickets.request POST /tickets" in line
    shown = sandcell(home, "approvals", "show", tid)
    assert f"approval  {tid}  pending  (a tool call, not a run)" in shown.stdout
    assert "\nrequest   POST /tickets\n" in shown.stdout
    assert '"title": "from the cli"' in shown.stdout
    # Run options make no sense for a tool call: refused, and the ticket still waits.
    wrong = sandcell(home, "approve", tid, "--out", str(home / "x"))
    assert wrong.returncode != 0 and "is a tool call, not a run" in wrong.stderr

    approved = sandcell(home, "approve", tid, "--reason", "expected")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"approved: tool call {tid} (tickets.request of run ")
    out, stderr = _finish(run)
    assert out == {"web": "/web/1", "elsewhere": 403, "tool": {"created": "from the cli"}}
    # One line of what the run did outside, naming where to see it.
    assert "sandcell: outside: 2 connections (1 refused); 1 tool call (1 allowed)" in stderr
    run_id = _run_id(stderr)

    again = sandcell(home, "approve", tid)
    assert again.returncode != 0 and f"tool call approval {tid} is approved by carol@desk" in (
        again.stderr
    )

    audit = sandcell(home, "audit", "show", run_id)
    assert audit.returncode == 0, audit.stderr
    rows = audit.stdout.splitlines()
    assert any(r.startswith("# connections (profile outside): 2 attempts, 1 refused") for r in rows)
    allowed = next(r for r in rows if f"127.0.0.1:{port} allowed" in r)
    assert "address 127.0.0.1" in allowed and "status" not in allowed.split("|")[0]
    refused = next(r for r in rows if f"127.0.0.2:{port} refused" in r)
    assert "status 403" in refused
    tools = next(r for r in rows if "tickets.request allowed" in r)
    assert f"approved by carol@desk (approval {tid})" in tools
    assert "sha256 args " in tools

    shown_json = json.loads(sandcell(home, "audit", "show", "--json", run_id).stdout)
    record = shown_json["record"]
    assert len(record["network"]["connections"]) == 2
    assert record["tools"]["calls"][0]["approver"] == f"carol@desk (approval {tid})"
    assert record["tools"]["calls"][0]["args_sha256"] == call["args_sha256"]
    verify = sandcell(home, "audit", "verify")
    assert verify.returncode == 0 and verify.stdout.startswith("ok:"), verify.stdout


@needs_root
def test_deny_from_another_terminal(home: Path, profile: Path, port: int) -> None:
    run = _start_run(home, profile, port, stdin=subprocess.DEVNULL)
    tid = str(_pending_tool_ticket(home, run)["id"])
    denied = sandcell(home, "deny", tid, "--reason", "not now")
    assert denied.returncode == 0, denied.stderr
    assert denied.stdout.startswith(f"denied: tool call {tid}")
    out, stderr = _finish(run)
    assert out["tool"] == f"refused: tickets.request was denied by carol@desk (approval {tid})"
    assert "1 tool call (1 denied)" in stderr
    listed = json.loads(sandcell(home, "approvals", "list", "--all", "--json").stdout)
    (ticket,) = listed
    assert (ticket["kind"], ticket["status"], ticket["reason"]) == (
        "tool_call",
        "denied",
        "not now",
    )
    audit = sandcell(home, "audit", "show", _run_id(stderr))
    assert any(f"denied by carol@desk (approval {tid})" in r for r in audit.stdout.splitlines())


@needs_root
@pytest.mark.parametrize(("answer", "expected"), [("y", "allowed"), ("n", "denied")])
def test_a_person_at_the_runs_terminal_answers_there(
    home: Path, profile: Path, port: int, answer: str, expected: str
) -> None:
    controller, terminal = pty.openpty()
    try:
        run = _start_run(home, profile, port, stdin=terminal, ctty=True)
        os.close(terminal)
        terminal = -1
        # The question goes to stderr; read it without blocking the pipe forever.
        assert run.stderr is not None
        asked = ""
        deadline = time.monotonic() + 120
        while "approve this call? [y/N]" not in asked:
            ready, _, _ = select.select([run.stderr], [], [], 1)
            if ready:
                chunk = os.read(run.stderr.fileno(), 4096).decode()
                if not chunk:
                    pytest.fail(f"the run ended without asking: {asked}")
                asked += chunk
            assert time.monotonic() < deadline, asked
        assert "tickets.request (profile outside) needs approval" in asked
        # The whole call: the request line first, then every argument, one per line.
        assert "sandcell:   request POST /tickets\n" in asked
        assert '"title": "from the cli"' in asked
        os.write(controller, f"{answer}\n".encode())
        stdout, rest = run.communicate(timeout=120)
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    assert run.returncode == 0, rest
    out = json.loads(stdout.splitlines()[-1])
    stderr = asked + rest
    assert f"1 tool call (1 {expected})" in stderr
    with AuditLog(home / "audit.sqlite3") as log:
        entry = log.get(_run_id(stderr))
    assert entry is not None
    tools = entry.record["tools"]
    assert isinstance(tools, dict)
    (call,) = tools["calls"]
    assert call["approver"] == "terminal:carol@desk"
    assert call["decision"] == expected
    if expected == "allowed":
        assert out["tool"] == {"created": "from the cli"}
    else:
        assert out["tool"] == "refused: tickets.request was denied by terminal:carol@desk"
    # Nothing went through the queue: the person at the terminal answered.
    with ApprovalStore(home / "approvals.sqlite3") as store:
        assert store.list_tools(None) == []


def test_audit_show_rows_are_one_line_and_safe_for_a_terminal(home: Path) -> None:
    # A record as the executor writes it, appended directly: hostile host names and reasons
    # (they come from the sandbox) must neither break the rows nor drive the terminal.
    record = {
        "run_id": "f" * 32,
        "started_at": "2026-12-01T00:00:00+00:00",
        "language": "python",
        "outcome": "ok",
        "usage": {"wall_ms": 12.0},
        "backend": {"name": "namespaces"},
        "network": {
            "profile": "fetch",
            "connections": [
                {
                    "seq": 1,
                    "method": "CONNECT",
                    "host": "api.example.test",
                    "port": 443,
                    "address": "127.0.0.1",
                    "allowed": True,
                    "reason": "closed",
                    "status": 200,
                    "sni": "api.example.test",
                    "bytes_up": 517,
                    "bytes_down": 3500,
                    "started_at": 100.0,
                    "ended_at": 100.25,
                },
                {
                    "seq": 2,
                    "method": "HTTP",
                    "host": "evil\x1b[2J\ntest",
                    "port": 80,
                    "address": None,
                    "allowed": False,
                    "reason": "host evil is not in profile fetch's allowlist\r\nfake: line",
                    "status": 403,
                    "sni": None,
                    "bytes_up": 0,
                    "bytes_down": 0,
                    "started_at": 101.0,
                    "ended_at": 101.0,
                },
                {
                    "seq": 3,
                    "method": "CONNECT",
                    "host": "::1",
                    "port": 8443,
                    "address": None,
                    "allowed": False,
                    "reason": "loopback address refused",
                    "status": 403,
                    "sni": None,
                    "bytes_up": 0,
                    "bytes_down": 0,
                    "started_at": 102.0,
                    "ended_at": 102.0,
                },
            ],
            "refused": 6,
            "refused_dropped": 4,
            "bytes_up": 517,
            "bytes_down": 3500,
        },
        "tools": {
            "profile": "fetch",
            "calls": [
                {
                    "seq": 1,
                    "operation": "list",
                    "tool": "",
                    "args_sha256": None,
                    "result_sha256": "ab" * 32,
                    "decision": "allowed",
                    "reason": "ok",
                    "approver": None,
                    "request_bytes": 13,
                    "result_bytes": 400,
                    "redactions": 0,
                    "started_at": 100.0,
                    "duration_s": 0.01,
                },
                {
                    "seq": 2,
                    "operation": "call",
                    "tool": "tickets.create\u202eticket",
                    "args_sha256": "cd" * 32,
                    "result_sha256": None,
                    "decision": "denied",
                    "reason": "tickets.create_ticket was denied by bob@host (approval t1)",
                    "approver": "bob@host (approval t1)",
                    "request_bytes": 60,
                    "result_bytes": 0,
                    "redactions": 0,
                    "started_at": 100.5,
                    "duration_s": 4.5,
                },
            ],
            "unrecorded": 0,
        },
    }
    with AuditLog(home / "audit.sqlite3") as log:
        log.append(record)
    shown = sandcell(home, "audit", "show", "f" * 32)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\u202e" not in shown.stdout
    rows = [r for r in shown.stdout.splitlines() if r.startswith("# ")]
    assert "# connections (profile fetch): 7 attempts, 6 refused, 517 B up, 3.4 KiB down" in rows
    (first,) = [r for r in rows if r.startswith("#     1 CONNECT")]
    assert first == (
        "#     1 CONNECT api.example.test:443 allowed | address 127.0.0.1 | sni api.example.test"
        " | status 200 | up 517 B, down 3.4 KiB | 0.25 s | closed"
    )
    (second,) = [r for r in rows if r.startswith("#     2 HTTP")]
    assert "evil\\x1b[2J\\ntest:80 refused" in second
    assert "allowlist\\r\\nfake: line" in second
    assert any(r.startswith("#     3 CONNECT [::1]:8443 refused") for r in rows)
    assert "#   ... and 4 more refused attempts past the cap on refused records, not listed" in rows
    assert "# tool calls (profile fetch): 2 requests (1 allowed, 1 denied)" in rows
    (denied,) = [r for r in rows if r.startswith("#     2 call")]
    assert denied.startswith("#     2 call tickets.create\\u202eticket denied | denied by bob@host")
    assert f"sha256 args {'cd' * 8} result -" in denied
    assert "| 4.50 s |" in denied
    # --json keeps the record as stored; the chain covers these keys like any other.
    body = json.loads(sandcell(home, "audit", "show", "--json", "f" * 32).stdout)
    assert body["record"]["network"] == record["network"]
    assert body["record"]["tools"] == record["tools"]
    assert sandcell(home, "audit", "verify").returncode == 0


def test_approvals_list_mixes_both_kinds_newest_first(home: Path) -> None:
    from sandcell.spec import RunRequest

    with ApprovalStore(home / "approvals.sqlite3") as store:
        run_ticket = store.submit(
            RunRequest(code="print(1)"),
            profile={"name": "review", "source": "builtin", "sha256": "ab" * 32},
            findings=[],
            why="review",
        )
        call = store.submit_tool(
            profile="fetch", tool="tickets.create_ticket", args={"title": "x"}, expires_in_s=600
        )
    listed = sandcell(home, "approvals", "list")
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(call.id) and lines[1].startswith(run_ticket.id)
    as_json = json.loads(sandcell(home, "approvals", "list", "--json").stdout)
    assert [(t["kind"], t["id"]) for t in as_json] == [
        ("tool_call", call.id),
        ("run", run_ticket.id),
    ]
    shown = json.loads(sandcell(home, "approvals", "show", "--json", call.id).stdout)
    assert shown["args_sha256"] == call.args_sha256
    # Denying a tool call needs a reason like denying a run; a run id is still a run.
    assert sandcell(home, "deny", call.id, "--reason", "no").returncode == 0
    shown_run = sandcell(home, "approvals", "show", run_ticket.id)
    assert f"approval  {run_ticket.id}  pending" in shown_run.stdout
