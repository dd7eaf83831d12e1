"""``POST /v1/runs/{id}/replay`` and ``Client.replay`` against a real service process."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.service.server import ServiceProcess, add_tenant

from sandcell.client import Client, ServiceError
from sandcell.spec import Outcome


def test_replay_over_http_matches_links_and_stays_in_its_tenant(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "replay-owner")
    other = add_tenant(home, "replay-other")
    with service.client(key) as c:
        ran = c.post("/v1/runs", json={"code": "print('again')"}).json()
        assert ran["result"]["outcome"] == "ok"

        r = c.post(f"/v1/runs/{ran['id']}/replay", json={})

        assert r.status_code == 200, r.text
        body = r.json()
        assert body["replay"]["matched"] is True
        assert body["replay"]["original_run_id"] == ran["id"]
        assert body["result"]["stdout"] == "again\n"
        assert body["id"] != ran["id"]
        record = c.get(f"/v1/audit/{body['id']}").json()["record"]
        assert record["replay_of"] == ran["id"]
    with service.client(other) as c:
        stranger = c.post(f"/v1/runs/{ran['id']}/replay", json={})
        assert stranger.status_code == 404, stranger.text


def test_replay_of_a_run_whose_uploaded_input_is_gone_is_refused(
    service: ServiceProcess, home: Path
) -> None:
    # The service deletes a run's uploaded files after it: a replay cannot see the same input.
    key = add_tenant(home, "replay-inputs", profiles=("analysis",))
    files = {"data.txt": base64.b64encode(b"1 2 3").decode()}
    with service.client(key) as c:
        ran = c.post(
            "/v1/runs",
            json={"code": "print(open('/inputs/data.txt').read())", "files": files},
        ).json()
        assert ran["result"]["outcome"] == "ok", ran
        r = c.post(f"/v1/runs/{ran['id']}/replay", json={})
        assert r.status_code == 400, r.text
        assert "input 'data.txt'" in r.json()["detail"] and "is gone" in r.json()["detail"]


def test_client_replay(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "replay-client")
    with Client(service.url, key) as client:
        original = client.run("import random; print(random.random())")
        assert original.outcome is Outcome.OK
        result, report = client.replay(original.run_id)
        assert result.run_id == report["replay_run_id"]
        assert report["matched"] is False
        assert report["comparison"]["differing"] == ["stdout"]
        with pytest.raises(ServiceError) as refused:
            client.replay("0" * 32)
        assert refused.value.status == 404


def test_cli_replay_goes_to_the_service(
    service: ServiceProcess, home: Path, tmp_path: Path
) -> None:
    key = add_tenant(home, "replay-cli")
    with service.client(key) as c:
        ran = c.post("/v1/runs", json={"code": "print('remote')"}).json()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    # An empty home here: the run is known only to the service.
    env.update(SANDCELL_URL=service.url, SANDCELL_API_KEY=key, SANDCELL_HOME=str(tmp_path))

    done = run_cli(["audit", "replay", ran["id"]], env=env)

    assert done.returncode == 0, done.stderr
    assert f"replay of {ran['id']} on namespaces" in done.stdout
    assert "result: identical" in done.stdout
    assert not (tmp_path / "audit.sqlite3").exists()  # nothing ran here
    unknown = run_cli(["audit", "replay", "f" * 32], env=env)
    assert unknown.returncode == 78 and "no run" in unknown.stderr
