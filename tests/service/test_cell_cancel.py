"""Cancelling a session's running cell over HTTP, from the SDK (sync and async) and by a client
that goes away: the cell is interrupted, its result says so, the session keeps its state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from pathlib import Path

from tests.service.server import ServiceProcess, add_tenant

from sandcell.client import AsyncClient, Client

SLOW = "import time\nfor _ in range(600):\n    time.sleep(0.1)\n"


def _cancel_until_running(cancel: object, deadline_s: float = 60) -> None:
    """Ask until the cell has started (before that, there is nothing to cancel: False)."""
    assert callable(cancel)
    deadline = time.monotonic() + deadline_s
    while not cancel():
        assert time.monotonic() < deadline, "the cell never started"
        time.sleep(0.05)


def test_cancel_interrupts_the_cell_and_keeps_the_session(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "cell-canceller", profiles=("analysis",))
    other = add_tenant(home, "cell-bystander", profiles=("analysis",))
    with service.client(key) as c, service.client(other) as o:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        assert (
            c.post(f"/v1/sessions/{sid}/cells", json={"code": "x = 41"}).json()["outcome"] == "ok"
        )
        assert c.post(f"/v1/sessions/{sid}/cancel").status_code == 409  # nothing running
        answer: dict[str, object] = {}

        def run() -> None:
            got = c.post(f"/v1/sessions/{sid}/cells", json={"code": SLOW})
            answer.update(got.json())

        worker = threading.Thread(target=run)
        worker.start()

        def cancel_as_owner() -> bool:
            # Another tenant never reaches the session, running cell or not.
            assert o.post(f"/v1/sessions/{sid}/cancel").status_code == 404
            status = c.post(f"/v1/sessions/{sid}/cancel")
            assert status.status_code in (202, 409), status.text
            return status.status_code == 202

        _cancel_until_running(cancel_as_owner)
        worker.join(60)
        assert not worker.is_alive()
        assert answer["outcome"] == "killed", answer
        assert str(answer["reason"]).startswith("cancelled: "), answer
        assert "state are kept" in str(answer["reason"])
        record = c.get(f"/v1/audit/{answer['run_id']}").json()["record"]
        assert record["outcome"] == "killed" and record["session_id"] == sid
        after = c.post(f"/v1/sessions/{sid}/cells", json={"code": "print(x + 1)"}).json()
        assert after["outcome"] == "ok" and after["stdout"] == "42\n", after
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200


def test_sdk_cancels_a_cell_sync_and_async(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "cell-sdk", profiles=("analysis",))
    with Client(service.url, key) as client, client.session() as s:
        s.run("y = 6")
        results = []
        worker = threading.Thread(target=lambda: results.append(s.run(SLOW)))
        worker.start()
        _cancel_until_running(s.cancel)
        worker.join(60)
        [result] = results
        assert result.outcome.value == "killed" and result.reason.startswith("cancelled: ")
        assert s.run("print(y * 7)").stdout == "42\n"
        assert s.cancel() is False  # nothing running now

    async def with_asyncio() -> None:
        async with AsyncClient(service.url, key) as client, await client.session() as s:
            await s.run("z = 5")
            cell = asyncio.ensure_future(s.run(SLOW))
            deadline = time.monotonic() + 60
            while not await s.cancel():
                assert time.monotonic() < deadline, "the cell never started"
                await asyncio.sleep(0.05)
            result = await cell
            assert result.outcome.value == "killed", result.reason
            assert (await s.run("print(z)")).stdout == "5\n"
            # Cancelling the task that awaits a cell closes its request: the cell stops too.
            abandoned = asyncio.ensure_future(s.run(SLOW))
            await asyncio.sleep(1.5)
            abandoned.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await abandoned
            assert (await s.run("print(z + 1)")).stdout == "6\n"

    asyncio.run(with_asyncio())
    with service.client(key) as c:
        reasons = [
            c.get(f"/v1/audit/{r['run_id']}").json()["record"]["reason"]
            for r in c.get("/v1/audit?limit=50").json()
            if r["outcome"] == "killed"
        ]
    assert any(r.startswith("cancelled: the client went away") for r in reasons), reasons


def test_a_client_that_disconnects_cancels_its_cell(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "cell-leaver", profiles=("analysis",))
    with service.client(key) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        body = json.dumps({"code": "w = 3\n" + SLOW}).encode()
        request = (
            f"POST /v1/sessions/{sid}/cells HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", service.port)) as conn:
            conn.sendall(request)
            time.sleep(1.5)
        deadline = time.monotonic() + 60
        while True:
            cells = [r for r in c.get("/v1/audit").json() if r["session_id"] == sid]
            if cells:
                break
            assert time.monotonic() < deadline, "the abandoned cell never ended"
            time.sleep(0.2)
        [summary] = cells
        assert summary["outcome"] == "killed"
        record = c.get(f"/v1/audit/{summary['run_id']}").json()["record"]
        assert "went away" in record["reason"]
        # The cell was interrupted, not the session: what it set before is still there.
        after = c.post(f"/v1/sessions/{sid}/cells", json={"code": "print(w)"}).json()
        assert after["stdout"] == "3\n", after
