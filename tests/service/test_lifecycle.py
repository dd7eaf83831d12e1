"""Cancellation, a client that goes away, a graceful stop that drains, a restart that loses
nothing."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx2
from tests.service.server import ServiceProcess, add_approver, add_tenant

SLEEP = "import time\nprint('started', flush=True)\ntime.sleep(60)\nprint('not reached')"


def _wait_finished(c: httpx2.Client, run_id: str, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        body = c.get(f"/v1/runs/{run_id}").json()
        if body["status"] == "finished":
            return dict(body["result"])
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def test_cancel_stops_that_run_only(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "canceller")
    with service.client(key) as c:
        doomed = c.post("/v1/runs", json={"code": SLEEP, "wait": False}).json()["id"]
        spared = c.post(
            "/v1/runs", json={"code": "import time; time.sleep(2); print('spared')", "wait": False}
        ).json()["id"]
        while c.get(f"/v1/runs/{doomed}").json()["status"] != "running":
            time.sleep(0.05)
        cancelled = c.post(f"/v1/runs/{doomed}/cancel")
        assert cancelled.status_code == 202 and cancelled.json()["cancel_requested"] is True
        result = _wait_finished(c, doomed)
        assert result["outcome"] == "killed"
        assert str(result["reason"]).startswith("cancelled")
        assert c.get(f"/v1/audit/{doomed}").json()["record"]["outcome"] == "killed"
        other = _wait_finished(c, spared)
        assert other["outcome"] == "ok" and other["stdout"] == "spared\n"
        assert c.post(f"/v1/runs/{doomed}/cancel").status_code == 409


def test_a_client_that_disconnects_cancels_its_run(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "leaver")
    body = json.dumps({"code": SLEEP}).encode()
    request = (
        f"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", service.port)) as conn:
        conn.sendall(request)
        time.sleep(1.5)
    with service.client(key) as c:
        deadline = time.monotonic() + 60
        while True:
            records = c.get("/v1/audit").json()
            if records:
                break
            assert time.monotonic() < deadline, "the abandoned run never ended"
            time.sleep(0.2)
        [summary] = records
        assert summary["outcome"] == "killed"
        record = c.get(f"/v1/audit/{summary['run_id']}").json()["record"]
        assert record["reason"].startswith("cancelled")
        assert record["stdout"] == "started\n"


def test_sigterm_drains_runs_in_flight_and_a_restart_loses_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    key = add_tenant(home, "durable", profiles=("strict", "analysis"))
    first = ServiceProcess(home, args=("--start", "cold")).start()
    slow = "import time; time.sleep(2); print('drained')"
    try:
        with first.client(key) as c:
            made = c.post(
                "/v1/runs",
                json={
                    "code": "open('k.csv','w').write('kept')",
                    "exports": ["*.csv"],
                    "profile": "analysis",
                },
            ).json()
            sha = made["result"]["artifacts"][0]["sha256"]
            waiting = c.post(
                "/v1/runs",
                json={
                    "code": "import subprocess\nprint(open('/inputs/note.txt').read())",
                    "files": {"note.txt": "a2VwdA=="},
                },
            ).json()
            approval = waiting["result"]["policy"]["approval"]["id"]
            background = c.post("/v1/runs", json={"code": slow, "wait": False}).json()["id"]
            answers: list[httpx2.Response] = []
            sync = threading.Thread(
                target=lambda: answers.append(c.post("/v1/runs", json={"code": slow}))
            )
            sync.start()
            while c.get("/healthz").json()["runs_in_flight"] < 2:
                time.sleep(0.05)
            assert first.socket.exists()
            assert first.stop(signal.SIGTERM) == -signal.SIGTERM
            assert not first.socket.exists()
            sync.join(30)
            [answer] = answers
            assert answer.status_code == 200 and answer.json()["result"]["stdout"] == "drained\n"
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.stop(signal.SIGKILL)
    second = ServiceProcess(home, args=("--start", "cold")).start()
    try:
        with second.client(key) as c:
            drained = c.get(f"/v1/runs/{background}").json()
            assert drained["record_only"] is True
            assert drained["result"]["outcome"] == "ok"
            # Read back from the record, the result names its runtime as a live one does.
            assert drained["result"]["runtime"] == made["result"]["runtime"]
            assert drained["result"]["runtime"]["name"] == "analysis"
            assert drained["result"]["stdout"] == "drained\n"
            with c.stream("GET", f"/v1/runs/{background}/events") as events:
                lines = [line for line in events.iter_lines() if line]
            assert lines[0] == "event: result"
            assert json.loads(lines[1].removeprefix("data: "))["result"]["outcome"] == "ok"
            assert c.get(f"/v1/approvals/{approval}").json()["status"] == "pending"
            assert c.get(f"/v1/artifacts/{sha}").content == b"kept"
            assert c.get(f"/v1/audit/{made['id']}").status_code == 200
            assert c.get("/v1/audit/verify").json()["ok"] is True
            with second.client(add_approver(home, "durable")) as a:
                ran = a.post(f"/v1/approvals/{approval}/approve", json={"reason": "after restart"})
            assert ran.json()["result"]["outcome"] == "ok", ran.text
            assert ran.json()["result"]["stdout"] == "kept\n"
            assert list((home / "service" / "inputs").iterdir()) == []
    finally:
        assert second.stop() == -signal.SIGTERM
