"""Listing approvals is paged and of a bounded cost: ``limit`` has a cap, ``X-Next-Cursor``
goes on, and a page looks at a bounded number of stored rows however many there are (the
store holds every tenant's tool calls).

The tickets are real rows of the service's approval store and table, filed before the service
starts (as runs and tool calls waiting would have left them); the service is a real
``sandcell serve``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from tests.service.server import REPO, ServiceProcess, add_tenant
from tests.service.test_ui import Browser

from sandcell.policy.approvals import ApprovalStore
from sandcell.service.tenants import TenantStore
from sandcell.spec import RunRequest

RUNS = 120
BYSTANDER_CALLS = 2100  # more than one page may look at


@pytest.fixture(scope="module")
def filed(home: Path) -> Iterator[tuple[ServiceProcess, dict[str, str], list[str], list[str]]]:
    keys = {"ann": add_tenant(home, "pager-ann"), "bob": add_tenant(home, "pager-bob")}
    profile = {"name": "strict", "sha256": "0" * 64}
    with ApprovalStore(home / "approvals.sqlite3") as store, TenantStore.in_home(home) as table:
        ann, bob = table.get("pager-ann").id, table.get("pager-bob").id
        runs = []
        for n in range(RUNS):
            ticket = store.submit(
                RunRequest(code=f"print({n})"), profile=profile, findings=[], why="test"
            )
            table.own(ann, "approval", [ticket.id])
            runs.append(ticket.id)
        theirs = store.submit(RunRequest(code="1"), profile=profile, findings=[], why="test")
        table.own(bob, "approval", [theirs.id])
        # Ann's tool calls are the oldest; bob's are newer, and more than a page looks at.
        table.own(ann, "run", ["a" * 32])
        table.own(bob, "run", ["b" * 32])
        calls = [
            store.submit_tool(
                profile="p", tool="t.op", args={"n": n}, expires_in_s=3600, run_id="a" * 32
            ).id
            for n in range(3)
        ]
        for n in range(BYSTANDER_CALLS):
            store.submit_tool(
                profile="p", tool="t.op", args={"n": n}, expires_in_s=3600, run_id="b" * 32
            )
    proc = ServiceProcess(home).start()
    yield proc, keys, runs, calls
    proc.stop()


def _all_pages(c: httpx2.Client, path: str, limit: int) -> tuple[list[str], int]:
    """Every item's id, following the cursor; and how many pages it took."""
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": limit, "status": "all"}
        if cursor is not None:
            params["cursor"] = cursor
        answer = c.get(path, params=params)
        assert answer.status_code == 200, answer.text
        pages += 1
        seen += [item["id"] for item in answer.json()]
        cursor = answer.headers.get("X-Next-Cursor")
        if cursor is None:
            return seen, pages
        assert f"cursor={cursor}" in answer.headers["Link"]


def test_run_approvals_are_paged_with_a_cursor(
    filed: tuple[ServiceProcess, dict[str, str], list[str], list[str]],
) -> None:
    service, keys, runs, _ = filed
    with service.client(keys["ann"]) as ann, service.client(keys["bob"]) as bob:
        seen, pages = _all_pages(ann, "/v1/approvals", 50)
        assert seen == runs[::-1] and pages >= 3  # newest first, each once
        assert ann.get("/v1/approvals", params={"limit": 501}).status_code == 422
        theirs = bob.get("/v1/approvals").json()[0]["id"]
        # Another tenant's id is no cursor (and says nothing of whether it exists).
        refused = ann.get("/v1/approvals", params={"cursor": theirs})
        assert refused.status_code == 400 and "cursor" in refused.json()["detail"]


def test_tool_calls_behind_many_of_another_tenants_are_reached_by_the_cursor(
    filed: tuple[ServiceProcess, dict[str, str], list[str], list[str]],
) -> None:
    service, keys, _, calls = filed
    with service.client(keys["ann"]) as ann:
        first = ann.get("/v1/tool-approvals", params={"status": "all"})
        assert first.status_code == 200
        # The first page looked at its bound of newer tool calls (bob's) and says where to go on.
        assert first.json() == [] and "X-Next-Cursor" in first.headers
        # A position, not the id of the other tenant's ticket it stopped at.
        assert not first.headers["X-Next-Cursor"].startswith("t")
        seen, _ = _all_pages(ann, "/v1/tool-approvals", 50)
        assert seen == calls[::-1]
        assert ann.get("/v1/tool-approvals", params={"cursor": calls[0]}).status_code == 400


def test_the_cli_follows_the_cursor_through_the_service(
    filed: tuple[ServiceProcess, dict[str, str], list[str], list[str]], home: Path
) -> None:
    _, keys, runs, calls = filed
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    listed = subprocess.run(
        [sys.executable, "-m", "sandcell", "approvals", "list", "--all", "--json"],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home), "SANDCELL_API_KEY": keys["ann"]},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    ids = {item["id"] for item in json.loads(listed.stdout)}
    assert ids == set(runs) | set(calls)


def test_the_ui_queue_is_paged_too(
    filed: tuple[ServiceProcess, dict[str, str], list[str], list[str]],
) -> None:
    service, keys, runs, calls = filed
    browser = Browser(service)
    try:
        browser.login(keys["ann"])
        first = browser.get("/ui/?status=all")
        assert first.status_code == 200
        # Fewer than a page of runs: all of them, and no link to older ones.
        assert set(re.findall(r'id="approval-([0-9a-f]+)"', first.text)) == set(runs)
        assert 'id="older"' not in first.text
        # Ann's waiting tool calls are behind bob's: reached through the link.
        assert not re.findall(r'id="tool-(t[0-9a-f]+)"', first.text)
        tools = re.search(r'id="older-tools" href="[^"]*tools_cursor=(p\d+)"', first.text)
        assert tools is not None, first.text
        page = browser.get(f"/ui/?tools_cursor={tools.group(1)}").text
        assert set(re.findall(r'id="tool-(t[0-9a-f]+)"', page)) == set(calls)
    finally:
        browser.http.close()
