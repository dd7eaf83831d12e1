"""What the service keeps for a tenant counts against its stored-bytes quota: a run's stdin
(kept with its record for replay), a run held for approval (its request, stdin included) and
that run's uploaded inputs. A submission that would go over is refused, saying what is stored
and how to free it; deciding a held run and deleting a kept stdin give the bytes back.

A real ``sandcell serve`` and real runs (the profile ``supervised`` holds every run)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from tests.service.server import ServiceProcess, add_tenant

from sandcell.policy.approvals import ApprovalStore

STDIN = "s" * 300_000
UPLOAD = b"u" * 400_000


@pytest.fixture(scope="module")
def key(service: ServiceProcess, home: Path) -> str:
    return add_tenant(home, "keeper", profiles=("strict", "supervised"), max_stored_bytes=1_300_000)


def _stored(c: object) -> int:
    answer = c.get("/v1/tenant")  # type: ignore[attr-defined]
    assert answer.status_code == 200, answer.text
    return int(answer.json()["stored_bytes"])


def test_kept_stdin_and_held_runs_count_and_are_given_back(
    service: ServiceProcess, key: str
) -> None:
    with service.client(key) as c:
        assert _stored(c) == 0
        ran = c.post(
            "/v1/runs",
            json={"code": "import sys; print(len(sys.stdin.read()))", "stdin": STDIN},
        )
        assert ran.status_code == 200, ran.text
        assert ran.json()["result"]["outcome"] == "ok"
        after_run = _stored(c)
        assert after_run >= len(STDIN)  # the kept stdin is the tenant's
        held = c.post(
            "/v1/runs",
            json={
                "code": "print(open('data.bin').read()[:1])",
                "profile": "supervised",
                "stdin": STDIN,
                "files": {"data.bin": base64.b64encode(UPLOAD).decode()},
            },
        )
        assert held.status_code == 200, held.text
        result = held.json()["result"]
        assert result["outcome"] == "awaiting_approval", result
        approval = result["policy"]["approval"]["id"]
        after_held = _stored(c)
        # Its stored request (stdin in it) and its upload, while it waits.
        assert after_held - after_run >= len(STDIN) + len(UPLOAD)

        # Over the quota: refused before it runs, saying what is kept and how to free it.
        refused = c.post("/v1/runs", json={"code": "print(1)", "stdin": STDIN})
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert f"keeps {after_held} bytes" in detail and "would add" in detail
        assert "DELETE /v1/artifacts/{sha256}" in detail and "/v1/approvals" in detail

        # Deciding the held run gives its bytes back; so does deleting the kept stdin.
        denied = c.post(f"/v1/approvals/{approval}/deny", json={"reason": "not now"})
        assert denied.status_code == 200, denied.text
        assert _stored(c) == after_run
        sha = hashlib.sha256(STDIN.encode()).hexdigest()
        assert c.delete(f"/v1/artifacts/{sha}").status_code == 204
        assert _stored(c) < after_run
        again = c.post("/v1/runs", json={"code": "print(1)", "stdin": STDIN})
        assert again.status_code == 200, again.text


def test_a_held_run_decided_on_the_host_stops_counting(service: ServiceProcess, home: Path) -> None:
    other = add_tenant(home, "keeper-host", profiles=("supervised",), max_stored_bytes=1_000_000)
    with service.client(other) as c:
        held = c.post(
            "/v1/runs",
            json={"code": "print(1)", "files": {"data.bin": base64.b64encode(UPLOAD).decode()}},
        )
        result = held.json()["result"]
        assert result["outcome"] == "awaiting_approval", result
        assert _stored(c) >= len(UPLOAD)
        # A person denies it on the host (what `sandcell deny` does), not through the service.
        with ApprovalStore(home / "approvals.sqlite3") as store:
            store.deny(result["policy"]["approval"]["id"], by="ann@host", reason="no")
        # Over the quota as counted, until the service sees the run was decided.
        fits = c.post("/v1/runs", json={"code": "print(2)", "stdin": "s" * 700_000})
        assert fits.status_code == 200, fits.text
        assert fits.json()["result"]["outcome"] == "awaiting_approval"
