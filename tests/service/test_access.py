"""Identities and access of a real ``sandcell serve`` (issue 21, items 12, 14, 17, 18, 19, 20):
tenants keyed by an id that is never reused, sandboxes ended when the key they came with is
rotated, approver keys separate from the key that submits, the profile re-checked at approval,
keys checked before a body is read, anonymous logins that cannot log anyone out, and
``/metrics`` for the operator only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from tests.service.server import REPO, ServiceProcess, add_approver, add_tenant
from tests.service.test_ui import Browser, _csrf

from sandcell.service.ui.browser_sessions import MAX_SESSIONS, BrowserSessions

HELD = "print('held')"
"""A program the ``supervised`` profile holds for approval (it holds every run)."""


def _tenants(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``sandcell tenants ...`` as the operator runs it, on the service's home."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    done = subprocess.run(
        [sys.executable, "-m", "sandcell", "tenants", *args],
        cwd=REPO,
        env={**clean, "SANDCELL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def _held(c: httpx2.Client, profile: str = "supervised") -> str:
    answer = c.post("/v1/runs", json={"code": HELD, "profile": profile})
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["outcome"] == "awaiting_approval", result
    return str(result["policy"]["approval"]["id"])


# -- item 14: a tenant id that is never reused; rotation ends what the old key opened ----------


def test_a_tenant_added_again_under_its_old_name_reaches_nothing_of_the_first(
    service: ServiceProcess, home: Path
) -> None:
    first = add_tenant(home, "reborn", profiles=("strict", "supervised"), max_concurrent=1)
    with service.client(first) as c:
        approval = _held(c)
        opened = c.post("/v1/sessions", json={})
        assert opened.status_code == 201, opened.text
        session = opened.json()["id"]
    _tenants(home, "remove", "reborn")
    second = add_tenant(home, "reborn", profiles=("strict", "supervised"), max_concurrent=1)
    with service.client(second) as c:
        assert c.get(f"/v1/sessions/{session}").status_code == 404
        cell = c.post(f"/v1/sessions/{session}/cells", json={"code": "print(1)"})
        assert cell.status_code == 404, cell.text
        assert c.get("/v1/sessions").json() == []
        assert c.get("/v1/approvals?status=all").json() == []
        assert c.get(f"/v1/approvals/{approval}").status_code == 404
        # The first tenant's sandbox slot is not the second's: its own session opens.
        assert c.get("/v1/tenant").json()["in_flight"] == 0
        mine = c.post("/v1/sessions", json={})
        assert mine.status_code == 201, mine.text
        assert c.delete(f"/v1/sessions/{mine.json()['id']}").status_code == 200


def test_rotating_a_key_ends_the_sandboxes_opened_with_it(
    service: ServiceProcess, home: Path
) -> None:
    old = add_tenant(home, "rotor2")
    api = httpx2.Client(base_url=f"{service.url}/e2b", headers={"X-API-KEY": old}, timeout=120)
    with api, service.client(old) as c:
        box = api.post("/sandboxes", json={"templateID": "base", "timeout": 600})
        assert box.status_code == 201, box.text
        sandbox, token = box.json()["sandboxID"], box.json()["envdAccessToken"]
        envd = {"E2b-Sandbox-Id": sandbox, "X-Access-Token": token}
        before = api.get("/contexts", headers=envd)
        assert before.status_code == 200, before.text
        session = c.post("/v1/sessions", json={}).json()["id"]
        new = _tenants(home, "rotate-key", "rotor2").stdout.strip()
        # The access token came with the old key: the sandbox it opens ended with it.
        after = api.get("/contexts", headers=envd)
        assert after.status_code == 502, after.text
    with service.client(new) as c:
        assert c.get("/v1/sessions").json() == []  # not listed to the new key, and ended
        assert c.get(f"/v1/sessions/{session}").status_code == 404
        assert c.get("/v1/tenant").json()["in_flight"] == 0


# -- item 12: approver keys; the submitter does not approve its own runs -----------------------


def test_the_submitting_key_cannot_approve_and_an_approver_key_can(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "selfie", profiles=("supervised",))
    approver = _tenants(home, "add-approver", "selfie", "lead").stdout.strip()
    assert approver.startswith("sca_")
    listed = _tenants(home, "list").stdout
    assert "approvers=lead" in next(line for line in listed.splitlines() if "selfie" in line)
    with service.client(key) as c, service.client(approver) as a:
        approval = _held(c)
        refused = c.post(f"/v1/approvals/{approval}/approve", json={"reason": "me"})
        assert refused.status_code == 403, refused.text
        detail = refused.json()["detail"]
        assert "approver key" in detail and "add-approver selfie" in detail
        assert c.get(f"/v1/approvals/{approval}").json()["status"] == "pending"
        # The approver key decides and does nothing else.
        assert [x["id"] for x in a.get("/v1/approvals").json()] == [approval]
        assert a.post("/v1/runs", json={"code": "print(1)"}).status_code == 403
        assert a.post("/v1/sessions", json={}).status_code == 403
        assert a.get("/v1/tenant").status_code == 403
        approved = a.post(f"/v1/approvals/{approval}/approve", json={"reason": "read it"})
        assert approved.status_code == 200, approved.text
        assert approved.json()["result"]["outcome"] == "ok"
        shown = c.get(f"/v1/approvals/{approval}").json()
        assert shown["status"] == "ran" and shown["decided_by"] == "approver:selfie/lead"
        # The submitter may still withdraw its own held run.
        second = _held(c)
        assert c.post(f"/v1/approvals/{second}/deny", json={"reason": "no"}).status_code == 200
    _tenants(home, "remove-approver", "selfie", "lead")
    with service.client(approver) as a:
        assert a.get("/v1/approvals").status_code == 401


def test_a_profile_may_let_the_submitter_approve(service: ServiceProcess, home: Path) -> None:
    (home / "profiles").mkdir(exist_ok=True)
    (home / "profiles" / "self-approved.toml").write_text(
        'approval = "always"\nsubmitter_may_approve = true\n'
    )
    key = add_tenant(home, "solo", profiles=("self-approved",))
    with service.client(key) as c:
        approval = _held(c, "self-approved")
        approved = c.post(f"/v1/approvals/{approval}/approve", json={})
        assert approved.status_code == 200, approved.text
        assert c.get(f"/v1/approvals/{approval}").json()["decided_by"] == "tenant:solo"


def test_ui_refuses_the_submitter_and_takes_an_approver_login(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "ui-selfie", profiles=("supervised",))
    approver = add_approver(home, "ui-selfie", "desk")
    with service.client(key) as c:
        approval = _held(c)
    submitter = Browser(service)
    try:
        token = submitter.login(key)
        answer = submitter.post(f"/ui/approvals/{approval}/approve", {"csrf": token})
        assert answer.status_code == 403, answer.text
        assert "approver key" in answer.text
    finally:
        submitter.close()
    person = Browser(service)
    try:
        token = person.login(approver)
        assert approval in person.get("/ui/").text
        answer = person.post(f"/ui/approvals/{approval}/approve", {"csrf": token})
        assert answer.status_code == 303, answer.text
    finally:
        person.close()
    with service.client(key) as c:
        assert c.get(f"/v1/approvals/{approval}").json()["decided_by"] == (
            "approver:ui-selfie/desk (browser)"
        )


# -- item 19: the profile is re-checked at approval ---------------------------------------------


def test_approving_rechecks_the_tenants_profiles(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "shrunk", profiles=("strict", "supervised"))
    approver = add_approver(home, "shrunk")
    with service.client(key) as c:
        approval = _held(c)
    _tenants(home, "set-profiles", "shrunk", "--profile", "strict")
    with service.client(approver) as a:
        refused = a.post(f"/v1/approvals/{approval}/approve", json={})
        assert refused.status_code == 403, refused.text
        assert "no longer one of tenant 'shrunk'" in refused.json()["detail"]
        assert a.get(f"/v1/approvals/{approval}").json()["status"] == "pending"
        assert a.post(f"/v1/approvals/{approval}/deny", json={"reason": "gone"}).status_code == 200


# -- item 17: the key before the body ----------------------------------------------------------


def _head_only(service: ServiceProcess, head: str) -> bytes:
    """Send a request's head and none of its body; what the service answers."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=60) as conn:
        conn.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


@pytest.mark.parametrize("key", [None, "sc_not-a-key"])
@pytest.mark.parametrize("framing", ["Content-Length: 1000000", "Transfer-Encoding: chunked"])
def test_a_request_without_a_good_key_is_refused_before_its_body(
    service: ServiceProcess, key: str | None, framing: str
) -> None:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    for path in ("/v1/runs", "/mcp"):
        answer = _head_only(
            service,
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{auth}{framing}\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]


@pytest.mark.parametrize(
    "credential",
    [
        "",
        "X-API-KEY: sc_not-a-key\r\n",
        "E2b-Sandbox-Id: nosuchsandbox\r\nX-Access-Token: wrong\r\n",
    ],
)
@pytest.mark.parametrize("path", ["/e2b/sandboxes", "/e2b/files?path=/home/user/x", "/files"])
def test_an_e2b_request_without_a_good_credential_is_refused_before_its_body(
    service: ServiceProcess, credential: str, path: str
) -> None:
    answer = _head_only(
        service,
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{credential}Content-Length: 1000000\r\n\r\n",
    )
    assert answer.split(b" ", 2)[1] in (b"401", b"502"), answer[:200]


# -- item 20: /metrics --------------------------------------------------------------------------


def test_metrics_need_the_operator_key_where_one_is_set(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    home = tmp_path_factory.mktemp("metrics-home")
    key_file = home / "metrics.key"
    key_file.write_text("operator-metrics-key-0123456789\n")
    tenant = add_tenant(home, "scraper")
    proc = ServiceProcess(
        home, args=("--start", "cold", "--metrics-key-file", str(key_file))
    ).start()
    try:
        with httpx2.Client(base_url=proc.url, timeout=60) as c:
            assert c.get("/metrics").status_code == 401
            bad = c.get("/metrics", headers={"Authorization": f"Bearer {tenant}"})
            assert bad.status_code == 401
            good = c.get(
                "/metrics", headers={"Authorization": "Bearer operator-metrics-key-0123456789"}
            )
            assert good.status_code == 200 and "sandcell_runs_total" in good.text
    finally:
        proc.stop()


def test_metrics_answer_loopback_only_by_default(service: ServiceProcess) -> None:
    from starlette.requests import Request

    from sandcell.service.metrics import check_metrics_access
    from sandcell.service.problems import ServiceProblem

    with httpx2.Client(base_url=service.url, timeout=60) as c:
        assert c.get("/metrics").status_code == 200  # from 127.0.0.1
    # Only loopback is reachable here: the check itself, on a request from another address.
    remote = Request({"type": "http", "headers": [], "client": ("192.0.2.7", 5555)})
    with pytest.raises(ServiceProblem) as refused:
        check_metrics_access(remote, None)
    assert refused.value.status == 403 and "192.0.2.7" in refused.value.detail


# -- item 18: anonymous logins (last: the flood holds this module's loopback address back) ------


def test_anonymous_sessions_never_push_out_a_logged_in_one() -> None:
    sessions = BrowserSessions()
    logged_in = sessions.new("tenant-id", key_sha256="0" * 64)
    for _ in range(MAX_SESSIONS + 10):
        sessions.new(None)
    assert sessions.get(logged_in.id) is not None


def test_a_flood_of_logins_is_limited_and_logs_nobody_out(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "steady", profiles=("supervised",))
    person = Browser(service)
    try:
        person.login(key)
        statuses: list[int] = []
        with httpx2.Client(base_url=service.url, timeout=60) as anon:
            form = anon.get("/ui/login")
            token = _csrf(form.text)
            for _ in range(200):
                answer = anon.post(
                    "/ui/login",
                    data={"csrf": token, "key": "sc_guess"},
                    headers={"Origin": service.url},
                )
                statuses.append(answer.status_code)
                if answer.status_code == 429:
                    break
                token = _csrf(answer.text)
            assert statuses[-1] == 429, "200 wrong keys were all looked up"
            assert set(statuses[:-1]) == {401}
            assert int(answer.headers["retry-after"]) >= 1
            assert "too many login attempts" in answer.text
            anon.cookies.clear()
            fresh = anon.get("/ui/login")  # a new anonymous session: refused, none is made
            assert fresh.status_code == 429 and "set-cookie" not in fresh.headers
        # The established session is untouched, and its pages answer.
        assert person.get("/ui/").status_code == 200
    finally:
        person.close()
