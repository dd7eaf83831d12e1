"""Governed tool calls waiting for a person, decided over ``/v1/tool-approvals`` and with the CLI
through the service: a real run calls a tool whose profile says ``approval = "always"``, the call
waits in the queue, the tenant approves (the call goes ahead) or denies it (the program gets the
refusal); another tenant never sees or decides it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from tests.integration.loopback_http import JsonHandler, serving
from tests.service.server import REPO, ServiceProcess, add_approver, add_tenant


class _Api(JsonHandler):
    created: list[str] = []  # noqa: RUF012 - one server per module

    def do_POST(self) -> None:
        title = self.json_body().get("title")
        self.created.append(str(title))
        self.send_json({"id": len(self.created), "title": title})


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    with serving(_Api) as port:
        yield port


@pytest.fixture(scope="module")
def keys(service: ServiceProcess, home: Path, api: int) -> dict[str, str]:
    # A profile of the service's home (loaded by name, as a tenant's profiles are).
    (home / "profiles").mkdir(exist_ok=True)
    (home / "profiles" / "queued-tools.toml").write_text(
        f"""
approval = "never"
[tools.tickets]
kind = "http"
base_url = "http://127.0.0.1:{api}"
allow = ["POST /tickets"]
approval = "always"
"""
    )
    keys = {
        "ann": add_tenant(home, "tools-ann", profiles=("queued-tools",)),
        "bob": add_tenant(home, "tools-bob", profiles=("queued-tools",)),
    }
    keys["ann-approver"] = add_approver(home, "tools-ann", "lead")
    return keys


CALL = """
import json, sandcell_tools as tools
try:
    print(json.dumps({{"ok": tools.call("tickets.request", method="POST", path="/tickets",
                                        json={{"title": "{title}"}})}}))
except tools.ToolError as e:
    print(json.dumps({{"error": str(e)}}))
"""


def _submit(c: httpx2.Client, title: str) -> str:
    answer = c.post(
        "/v1/runs",
        json={"code": CALL.format(title=title), "wait": False, "limits": {"wall_time_s": 60}},
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _waiting(c: httpx2.Client, title: str) -> dict[str, object]:
    deadline = time.monotonic() + 90
    while True:
        listed = c.get("/v1/tool-approvals").json()
        mine = [t for t in listed if title in t["args_preview"]]
        if mine:
            return dict(mine[0])
        assert time.monotonic() < deadline, "no tool call was filed"
        time.sleep(0.1)


def _finished(c: httpx2.Client, run_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 90
    while True:
        body = c.get(f"/v1/runs/{run_id}").json()
        if body["status"] == "finished":
            return dict(body["result"])
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def _cli(*args: str, home: Path, key: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home), "SANDCELL_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_tool_call_is_approved_over_the_api(
    service: ServiceProcess, keys: dict[str, str]
) -> None:
    title = f"approve-{time.time_ns()}"
    with (
        service.client(keys["ann"]) as ann,
        service.client(keys["bob"]) as bob,
        service.client(keys["ann-approver"]) as approver,
    ):
        run_id = _submit(ann, title)
        ticket = _waiting(ann, title)
        tid = str(ticket["id"])
        assert tid.startswith("t") and ticket["kind"] == "tool_call"
        assert ticket["status"] == "pending" and ticket["tool"] == "tickets.request"
        assert ticket["run_id"] == run_id and ticket["profile"] == "queued-tools"
        # Another tenant: not listed, not shown, not decided, as if it did not exist.
        assert tid not in [t["id"] for t in bob.get("/v1/tool-approvals?status=all").json()]
        assert bob.get(f"/v1/tool-approvals/{tid}").status_code == 404
        assert bob.post(f"/v1/tool-approvals/{tid}/approve", json={}).status_code == 404
        assert bob.post(f"/v1/tool-approvals/{tid}/deny", json={"reason": "x"}).status_code == 404
        assert ann.get(f"/v1/tool-approvals/{tid[:8]}").status_code == 404  # no prefixes
        assert ann.get("/v1/tool-approvals?status=bogus").status_code == 400
        shown = ann.get(f"/v1/tool-approvals/{tid}").json()
        assert title in shown["args_preview"] and len(shown["args_sha256"]) == 64
        # The whole call: its request line, never redacted, and arguments that match the hash.
        assert shown["request_line"] == "POST /tickets" and shown["intact"] is True
        # The key that submitted the run does not approve its tool call (the profile leaves
        # submitter_may_approve off); the tenant's approver key does.
        selfish = ann.post(f"/v1/tool-approvals/{tid}/approve", json={"reason": "me"})
        assert selfish.status_code == 403, selfish.text
        assert "approver key" in selfish.json()["detail"]
        assert ann.get(f"/v1/tool-approvals/{tid}").json()["status"] == "pending"
        assert tid in [t["id"] for t in approver.get("/v1/tool-approvals").json()]
        decided = approver.post(f"/v1/tool-approvals/{tid}/approve", json={"reason": "fine"})
        assert decided.status_code == 200, decided.text
        assert decided.json()["status"] == "approved"
        assert decided.json()["decided_by"] == "approver:tools-ann/lead"
        result = _finished(ann, run_id)
        assert result["outcome"] == "ok", result
        answer = json.loads(str(result["stdout"]).splitlines()[-1])
        assert answer["ok"]["body"]["title"] == title and title in _Api.created
        again = approver.post(f"/v1/tool-approvals/{tid}/approve", json={})
        assert again.status_code == 409
        assert tid in [t["id"] for t in ann.get("/v1/tool-approvals?status=approved").json()]
        assert tid not in [t["id"] for t in ann.get("/v1/tool-approvals").json()]
        assert "/v1/tool-approvals/{ticket_id}/approve" in ann.get("/openapi.json").json()["paths"]


def test_a_tool_call_is_listed_shown_and_denied_with_the_cli(
    service: ServiceProcess, home: Path, keys: dict[str, str]
) -> None:
    title = f"deny-{time.time_ns()}"
    with service.client(keys["ann"]) as ann:
        run_id = _submit(ann, title)
        tid = str(_waiting(ann, title)["id"])
        assert ann.post(f"/v1/tool-approvals/{tid}/deny", json={"reason": " "}).status_code == 400
        # Through the service's socket, with the key: the lines of the in-process commands.
        listed = _cli("approvals", "list", home=home, key=keys["ann"])
        assert listed.returncode == 0, listed.stderr
        [line] = [x for x in listed.stdout.splitlines() if x.startswith(tid)]
        assert " tool " in line and "pending" in line and "tickets.request" in line
        as_json = json.loads(_cli("approvals", "list", "--json", home=home, key=keys["ann"]).stdout)
        assert {"id": tid, "kind": "tool_call"}.items() <= next(
            d for d in as_json if d["id"] == tid
        ).items()
        shown = _cli("approvals", "show", tid, home=home, key=keys["ann"])
        assert shown.returncode == 0 and "(a tool call, not a run)" in shown.stdout
        assert "tool      tickets.request" in shown.stdout and title in shown.stdout
        assert "\nrequest   POST /tickets\n" in shown.stdout and "WARNING" not in shown.stdout
        other = _cli("approvals", "show", tid, home=home, key=keys["bob"])
        assert other.returncode == 78 and "no tool call" in other.stderr
        out = _cli("approve", tid, "--out", str(home / "o"), home=home, key=keys["ann"])
        assert out.returncode == 78 and "not a run" in out.stderr
        denied = _cli("deny", tid, "--reason", "not today", home=home, key=keys["ann"])
        assert denied.returncode == 0, denied.stderr
        assert denied.stdout.startswith(f"denied: tool call {tid} (tickets.request of run ")
        result = _finished(ann, run_id)
        assert result["outcome"] == "ok", result
        refusal = json.loads(str(result["stdout"]).splitlines()[-1])
        assert "error" in refusal and title not in _Api.created
        ticket = ann.get(f"/v1/tool-approvals/{tid}").json()
        assert ticket["status"] == "denied" and ticket["reason"] == "not today"
