"""Live output over the service: a run's and a session cell's stdout and stderr as Server-Sent
Events while they run, through plain HTTP and through the client SDK.

Liveness is proven by reaction, never by timing: the program prints a line and then sleeps past
its wall time; the client cancels it when it sees that line. Only an event sent while the run
is still running can do that (output sent at the end would find nothing left to cancel, and
the run would end ``timeout``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx2
import pytest
from tests.service.server import ServiceProcess, add_tenant, sse_events

from sandcell.client import AsyncClient, Client
from sandcell.live_output import Stream

FIRST_THEN_WAIT = (
    "import sys, time\n"
    "print('first line')\n"
    "print('warning', file=sys.stderr)\n"
    "time.sleep(50)\n"
    "print('never printed')\n"
)
TOKEN = "ghp_" + "Yx7Wv5Ut3Sr1Qp9On7Ml5Kj3Ih1Gf9Ed7Cb5Az"


@pytest.fixture(scope="module")
def key(service: ServiceProcess, home: Path) -> str:
    return add_tenant(home, "live")


def _submit(c: httpx2.Client, code: str) -> str:
    r = c.post("/v1/runs", json={"code": code, "wait": False})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_run_output_is_streamed_before_the_result(service: ServiceProcess, key: str) -> None:
    with service.client(key) as c, service.client(key) as control:
        run_id = _submit(c, FIRST_THEN_WAIT)
        seen: list[tuple[str, dict[str, object]]] = []
        cancelled = None
        with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            for kind, data in sse_events(stream):
                seen.append((kind, data))
                if kind == "stdout" and "first line" in str(data["text"]) and cancelled is None:
                    cancelled = control.post(f"/v1/runs/{run_id}/cancel").status_code
    kinds = [k for k, _ in seen]
    assert cancelled == 202, seen  # the run was still running when its first line came
    assert kinds[:2] == ["status", "status"] and kinds[-1] == "result", kinds
    assert kinds.index("stdout") < kinds.index("result")
    result = seen[-1][1]["result"]
    assert isinstance(result, dict)
    assert result["outcome"] == "killed" and str(result["reason"]).startswith("cancelled")
    out = "".join(str(d["text"]) for k, d in seen if k == "stdout")
    assert out == result["stdout"] == "first line\n"
    assert all(d["id"] == run_id for k, d in seen if k in ("stdout", "stderr"))


def test_a_late_subscriber_gets_the_output_so_far_then_live(
    service: ServiceProcess, key: str
) -> None:
    code = "import time\nprint('one')\nprint('two')\ntime.sleep(50)\n"
    with service.client(key) as c, service.client(key) as late, service.client(key) as control:
        run_id = _submit(c, code)
        late_seen: list[tuple[str, dict[str, object]]] = []
        with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            for kind, data in sse_events(stream):
                if kind == "stdout" and "two" in str(data["text"]):
                    break
        # The run is still running (it sleeps): this subscriber starts from its beginning.
        with late.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            for kind, data in sse_events(stream):
                late_seen.append((kind, data))
                if kind == "stdout" and "two" in str(data["text"]):
                    assert control.post(f"/v1/runs/{run_id}/cancel").status_code == 202
    out = "".join(str(d["text"]) for k, d in late_seen if k == "stdout")
    assert out == "one\ntwo\n"
    assert late_seen[-1][0] == "result"
    assert late_seen[-1][1]["result"]["outcome"] == "killed"  # type: ignore[index]


def test_streamed_output_is_redacted_and_scoped_to_the_tenant(
    service: ServiceProcess, home: Path, key: str
) -> None:
    other = add_tenant(home, "live-other")
    with service.client(key) as c, service.client(other) as intruder:
        run_id = _submit(c, f"print('key={TOKEN}')")
        assert intruder.get(f"/v1/runs/{run_id}/events").status_code == 404
        with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            seen = list(sse_events(stream))
    out = "".join(str(d["text"]) for k, d in seen if k == "stdout")
    assert out == "key=[REDACTED:github_token]\n"
    assert TOKEN not in json.dumps(seen)


def test_session_cell_streams_its_output(service: ServiceProcess, key: str) -> None:
    cell = (
        "import time\nprint('first line')\ntry:\n    time.sleep(50)\n"
        "except KeyboardInterrupt:\n    print('interrupted')\n"
    )
    with service.client(key) as c, service.client(key) as control:
        r = c.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            seen: list[tuple[str, dict[str, object]]] = []
            stopped = None
            with c.stream("POST", f"/v1/sessions/{sid}/cells/stream", json={"code": cell}) as s:
                assert s.status_code == 200
                assert s.headers["content-type"].startswith("text/event-stream")
                for kind, data in sse_events(s):
                    seen.append((kind, data))
                    if kind == "stdout" and "first line" in str(data["text"]) and not stopped:
                        stopped = control.post(f"/v1/sessions/{sid}/cancel").status_code
            assert stopped == 202, seen  # the cell was running when its first line came
            assert [k for k, _ in seen][-1] == "result"
            out = "".join(str(d["text"]) for k, d in seen if k == "stdout")
            # After the interrupt: as soon as the kernel takes it (see the contract test).
            assert out == seen[-1][1]["stdout"] and out.startswith("first line\n")
            # A refusal before the cell starts is a plain problem, not a stream.
            gone = c.post("/v1/sessions/nope/cells/stream", json={"code": "print(1)"})
            assert gone.status_code == 404
            assert gone.headers["content-type"].startswith("application/problem+json")
        finally:
            c.delete(f"/v1/sessions/{sid}")


def test_client_sdk_streams_runs_and_cells(service: ServiceProcess, key: str) -> None:
    got: list[tuple[Stream, str]] = []
    with Client(service.url, key) as client:
        result = client.run(
            "import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c')\n",
            on_output=lambda stream, text: got.append((stream, text)),
        )
        assert "".join(t for s, t in got if s == "stdout") == result.stdout == "a\nc\n"
        assert "".join(t for s, t in got if s == "stderr") == result.stderr == "b\n"

        # wait() on a submitted run, stopped by what the listener sees.
        run_id = client.submit(FIRST_THEN_WAIT)
        stopped: list[bool] = []

        def stop_on_first(stream: Stream, text: str) -> None:
            if "first line" in text and not stopped:
                stopped.append(client.cancel(run_id))

        waited = client.wait(run_id, on_output=stop_on_first)
        assert stopped == [True] and waited.outcome.value == "killed"

        with client.session() as session:
            cell_out: list[str] = []
            interrupted: list[bool] = []

            def interrupt_on_first(stream: Stream, text: str) -> None:
                cell_out.append(text)
                if "first line" in text and not interrupted:
                    # From another thread, as a caller of RemoteSession.cancel would.
                    worker = threading.Thread(target=lambda: interrupted.append(session.cancel()))
                    worker.start()
                    worker.join()

            cell = session.run(
                "import time\nprint('first line')\ntry:\n    time.sleep(50)\n"
                "except KeyboardInterrupt:\n    print('interrupted')\n",
                on_output=interrupt_on_first,
            )
            assert interrupted == [True]
            assert "".join(cell_out) == cell.stdout
            assert cell.stdout.startswith("first line\n")


def test_async_client_streams_runs_and_cells(service: ServiceProcess, key: str) -> None:
    async def main() -> None:
        got: list[tuple[Stream, str]] = []
        async with AsyncClient(service.url, key) as client:
            result = await client.run(
                "print('x')\nprint('y')\n", on_output=lambda s, t: got.append((s, t))
            )
            assert "".join(t for _, t in got) == result.stdout == "x\ny\n"
            async with await client.session() as session:
                cell_got: list[str] = []
                cell = await session.run(
                    "print('in a cell')", on_output=lambda s, t: cell_got.append(t)
                )
                assert "".join(cell_got) == cell.stdout == "in a cell\n"

    asyncio.run(main())
