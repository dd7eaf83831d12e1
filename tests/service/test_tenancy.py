"""Tenants: another tenant's runs, records, artifacts, sessions and approvals are 404 to a
tenant that tries them; quotas answer 429 with Retry-After."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx2
import pytest
from tests.service.server import ServiceProcess, add_approver, add_tenant


def _404(response: httpx2.Response) -> None:
    assert response.status_code == 404, (response.request.url, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")


@pytest.fixture(scope="module")
def owner(service: ServiceProcess, home: Path) -> dict[str, str]:
    """What tenant "alice" made: a run with an artifact, a run waiting for approval, a session."""
    key = add_tenant(home, "alice", profiles=("strict", "analysis"))
    with service.client(key) as c:
        ran = c.post(
            "/v1/runs",
            json={
                "code": "open('r.csv','w').write('secret,1\\n')",
                "exports": ["*.csv"],
                "profile": "analysis",
            },
        ).json()
        waiting = c.post(
            "/v1/runs", json={"code": "import subprocess\nsubprocess.run(['true'])"}
        ).json()
        approval = waiting["result"]["policy"]["approval"]["id"]
        session = c.post("/v1/sessions", json={"profile": "analysis"}).json()
    return {
        "key": key,
        "run": ran["id"],
        "sha": ran["result"]["artifacts"][0]["sha256"],
        "waiting_run": waiting["result"]["run_id"],
        "approval": approval,
        "session": session["id"],
    }


def test_another_tenant_sees_none_of_it(
    service: ServiceProcess, home: Path, owner: dict[str, str]
) -> None:
    mallory = add_tenant(home, "mallory", profiles=("strict", "analysis"))
    run, sha, approval, session = owner["run"], owner["sha"], owner["approval"], owner["session"]
    with service.client(mallory) as c:
        # runs and their records
        _404(c.get(f"/v1/runs/{run}"))
        _404(c.get(f"/v1/runs/{run}/events"))
        _404(c.post(f"/v1/runs/{run}/cancel"))
        _404(c.get(f"/v1/audit/{run}"))
        _404(c.get(f"/v1/audit/{owner['waiting_run']}"))
        assert c.get("/v1/audit").json() == []
        verify = c.get("/v1/audit/verify").json()
        assert verify["records"] == 0 and verify["problems"] == []
        # artifacts
        _404(c.get(f"/v1/artifacts/{sha}"))
        _404(c.delete(f"/v1/artifacts/{sha}"))
        # approvals, by id and by a prefix of it
        _404(c.get(f"/v1/approvals/{approval}"))
        _404(c.get(f"/v1/approvals/{approval[:4]}"))
        _404(c.post(f"/v1/approvals/{approval}/approve", json={}))
        _404(c.post(f"/v1/approvals/{approval}/deny", json={"reason": "mine now"}))
        assert c.get("/v1/approvals", params={"status": "all"}).json() == []
        # sessions
        _404(c.get(f"/v1/sessions/{session}"))
        _404(c.post(f"/v1/sessions/{session}/cells", json={"code": "print(1)"}))
        _404(c.get(f"/v1/sessions/{session}/files"))
        _404(c.get(f"/v1/sessions/{session}/files/x.txt"))
        _404(c.put(f"/v1/sessions/{session}/files/x.txt", content=b"x"))
        _404(c.post(f"/v1/sessions/{session}/close", json={}))
        _404(c.delete(f"/v1/sessions/{session}"))
        assert c.get("/v1/sessions").json() == []
    # ... while the owner still has all of it
    with service.client(owner["key"]) as c:
        assert c.get(f"/v1/runs/{run}").status_code == 200
        assert c.get(f"/v1/artifacts/{sha}").content == b"secret,1\n"
        assert c.get(f"/v1/approvals/{approval}").json()["status"] == "pending"
        assert c.get(f"/v1/sessions/{session}").json()["ended"] is None
        listed = {s["run_id"] for s in c.get("/v1/audit").json()}
        assert {run, owner["waiting_run"]} <= listed


def test_the_owner_approves_and_denies(
    service: ServiceProcess, home: Path, owner: dict[str, str]
) -> None:
    approver = add_approver(home, "alice", "reviewer")
    with service.client(owner["key"]) as c, service.client(approver) as a:
        pending = c.get("/v1/approvals").json()
        assert [a["id"] for a in pending] == [owner["approval"]]
        assert "subprocess" in pending[0]["code"]
        approved = a.post(f"/v1/approvals/{owner['approval']}/approve", json={"reason": "ok"})
        assert approved.status_code == 200, approved.text
        result = approved.json()["result"]
        assert result["outcome"] == "ok", result
        assert result["policy"]["approval"]["approved_by"] == "approver:alice/reviewer"
        again = a.post(f"/v1/approvals/{owner['approval']}/approve", json={})
        assert again.status_code == 409
        waiting = c.post(
            "/v1/runs", json={"code": "import subprocess", "files": {"a.txt": "eA=="}}
        ).json()
        second = waiting["result"]["policy"]["approval"]["id"]
        kept = home / "service" / "inputs"
        assert len(list(kept.iterdir())) == 1  # kept for the run while it waits
        assert c.post(f"/v1/approvals/{second}/deny", json={"reason": ""}).status_code == 400
        denied = c.post(f"/v1/approvals/{second}/deny", json={"reason": "not today"})
        assert denied.status_code == 200, denied.text
        assert denied.json()["outcome"] == "denied"
        assert list(kept.iterdir()) == []
        statuses = {a["id"]: a["status"] for a in c.get("/v1/approvals?status=all").json()}
        assert statuses == {owner["approval"]: "ran", second: "denied"}
        c.delete(f"/v1/sessions/{owner['session']}")


def test_a_removed_or_rotated_key_stops_working(service: ServiceProcess, home: Path) -> None:
    from sandcell.service.tenants import TenantStore

    key = add_tenant(home, "rotating")
    with service.client(key) as c:
        assert c.get("/v1/tenant").status_code == 200
    with TenantStore.in_home(home) as store:
        new = store.rotate_key("rotating")
    with service.client(key) as c:
        assert c.get("/v1/tenant").status_code == 401
    with service.client(new) as c:
        assert c.get("/v1/tenant").status_code == 200
    with TenantStore.in_home(home) as store:
        store.remove("rotating")
    with service.client(new) as c:
        assert c.get("/v1/tenant").status_code == 401


def _429(response: httpx2.Response) -> int:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return int(response.headers["retry-after"])


def test_runs_per_minute(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "rate", runs_per_minute=2)
    with service.client(key) as c:
        for _ in range(2):
            assert c.post("/v1/runs", json={"code": "pass"}).status_code == 200
        retry = _429(c.post("/v1/runs", json={"code": "pass"}))
        assert 1 <= retry <= 60
        assert "runs_per_minute" in c.post("/v1/runs", json={"code": "pass"}).json()["detail"]


def test_sandboxes_at_once(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "narrow", max_concurrent=1)
    with service.client(key) as c:
        slow = c.post(
            "/v1/runs", json={"code": "import time; time.sleep(30)", "wait": False}
        ).json()
        assert _429(c.post("/v1/runs", json={"code": "pass"})) == 1
        assert _429(c.post("/v1/sessions", json={})) == 1
        assert c.post(f"/v1/runs/{slow['id']}/cancel").status_code == 202
        deadline = time.monotonic() + 60
        while c.get(f"/v1/runs/{slow['id']}").json()["status"] != "finished":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert c.post("/v1/runs", json={"code": "pass"}).status_code == 200


def test_cpu_seconds_per_day(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "burner", cpu_seconds_per_day=1)
    burn = "import time\nwhile time.process_time() < 1.2: pass"
    with service.client(key) as c:
        assert c.post("/v1/runs", json={"code": burn}).json()["result"]["outcome"] == "ok"
        assert c.get("/v1/tenant").json()["cpu_seconds_today"] >= 1.0
        retry = _429(c.post("/v1/runs", json={"code": "pass"}))
        assert 1 <= retry <= 86400


def test_stored_bytes(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "hoarder", profiles=("analysis",), max_stored_bytes=1000)
    code = "open('big.csv','wb').write(b'x' * 1500)"
    with service.client(key) as c:
        result = c.post("/v1/runs", json={"code": code, "exports": ["*.csv"]}).json()["result"]
        sha = result["artifacts"][0]["sha256"]
        assert c.get("/v1/tenant").json()["stored_bytes"] == 1500
        _429(c.post("/v1/runs", json={"code": "pass"}))
        assert c.delete(f"/v1/artifacts/{sha}").status_code == 204
        assert c.post("/v1/runs", json={"code": "pass"}).status_code == 200
        metrics = c.get("/metrics").text
        assert 'sandcell_requests_rejected_total{status="429"}' in metrics
        assert json.loads(c.get("/v1/tenant").text)["stored_bytes"] == 0
