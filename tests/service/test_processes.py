"""A session's background processes, terminals and watches over HTTP: spawn, list, read by
offset and follow as Server-Sent Events, input, signals, kill, resize, watches; each spawn a run
of the tenant's record (refused and failed ones too); another tenant's session 404.

A real ``sandcell serve`` with real sandboxes on the namespaces rung. Every wait is for an event
(the output, the exit, the change), with a deadline only for a run that went wrong.
"""

from __future__ import annotations

import base64
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from tests.service.server import ServiceProcess, add_tenant

pytestmark = pytest.mark.timeout(300)

DEADLINE_S = 60.0


def _ok(answer: httpx2.Response, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json() if answer.content else None


def _read_until(c: httpx2.Client, sid: str, pid: int, needle: bytes) -> tuple[bytes, int]:
    """What process ``pid`` wrote to stdout until ``needle`` shows, and the offset after it."""
    seen, offset = b"", 0
    deadline = time.monotonic() + DEADLINE_S
    while needle not in seen:
        assert time.monotonic() < deadline, (needle, seen)
        got = _ok(c.get(f"/v1/sessions/{sid}/processes/{pid}/output?stdout_from={offset}"))
        seen += base64.b64decode(got["stdout_b64"])
        offset = got["stdout_next"]
        assert needle in seen or not got["exited"], (needle, seen)
        if not got["stdout_b64"]:
            time.sleep(0.05)
    return seen, offset


def _sse(c: httpx2.Client, path: str) -> list[tuple[str, dict[str, Any]]]:
    """The events of a stream, until it ends."""
    events: list[tuple[str, dict[str, Any]]] = []
    pending: dict[str, str] = {}
    with c.stream("GET", path) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if pending:
                    events.append((pending["event"], json.loads(pending["data"])))
                pending = {}
                continue
            name, _, value = line.partition(": ")
            pending[name] = value
    return events


def _audit(c: httpx2.Client, sid: str) -> list[dict[str, Any]]:
    found = []
    for summary in _ok(c.get("/v1/audit?limit=200")):
        if summary["session_id"] == sid and summary["language"] == "bash":
            found.append(_ok(c.get(f"/v1/audit/{summary['run_id']}"))["record"])
    return found


def test_processes_of_a_session_over_http(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "spawner", profiles=("strict",))
    other = add_tenant(home, "onlooker", profiles=("strict",))
    with service.client(key) as c, service.client(other) as o:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        base = f"/v1/sessions/{sid}"
        ticks = "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.2; done"
        p = _ok(c.post(f"{base}/processes", json={"cmd": ticks, "tag": "ticks"}), 201)
        assert (p["command"], p["tag"], p["exited"], p["pty"]) == (ticks, "ticks", False, None)
        assert p["argv"][-1] == ticks and len(p["run_id"]) == 32
        # Cells run while it runs.
        cell = _ok(c.post(f"{base}/cells", json={"code": "print(6 * 7)"}))
        assert cell["stdout"] == "42\n"

        events = _sse(c, f"{base}/processes/{p['pid']}/output/stream")
        kinds = [k for k, _ in events]
        assert kinds[-1] == "exit" and set(kinds[:-1]) <= {"output"}, kinds
        out = b"".join(base64.b64decode(e["stdout_b64"]) for _, e in events)
        err = b"".join(base64.b64decode(e["stderr_b64"]) for _, e in events)
        assert (out, err) == (b"1\n2\n3\n", b"e1\ne2\ne3\n")
        assert (events[-1][1]["exit_code"], events[-1][1]["signal"]) == (0, None)
        # Reading does not consume: from any kept offset, again; and a stream from the end
        # is only its exit.
        again = _ok(c.get(f"{base}/processes/{p['pid']}/output?stdout_from=2&stderr_from=3"))
        assert base64.b64decode(again["stdout_b64"]) == b"2\n3\n"
        assert base64.b64decode(again["stderr_b64"]) == b"e2\ne3\n"
        tail = _sse(c, f"{base}/processes/{p['pid']}/output/stream?stdout_from=6&stderr_from=9")
        assert [(k, e["stdout_b64"], e["exit_code"]) for k, e in tail] == [("exit", "", 0)]
        listed = _ok(c.get(f"{base}/processes"))
        assert [(x["pid"], x["exited"], x["exit_code"], x["run_id"]) for x in listed] == [
            (p["pid"], True, 0, p["run_id"])
        ]

        # Input, then its end.
        cat = _ok(c.post(f"{base}/processes", json={"cmd": ["cat"], "stdin": True}), 201)
        _ok(c.post(f"{base}/processes/{cat['pid']}/stdin", json={"text": "hello\n"}), 204)
        _read_until(c, sid, cat["pid"], b"hello\n")
        raw = base64.b64encode(b"\x00bytes\n").decode()
        _ok(c.post(f"{base}/processes/{cat['pid']}/stdin", json={"data_b64": raw}), 204)
        _ok(c.post(f"{base}/processes/{cat['pid']}/stdin/close"), 204)
        [*_, last] = _sse(c, f"{base}/processes/{cat['pid']}/output/stream?stdout_from=6")
        assert last[0] == "exit" and last[1]["exit_code"] == 0
        late = c.post(f"{base}/processes/{cat['pid']}/stdin", json={"text": "late"})
        assert late.status_code == 422 and "no open stdin" in late.json()["detail"], late.text
        both = c.post(f"{base}/processes/{cat['pid']}/stdin", json={"text": "a", "data_b64": ""})
        assert both.status_code == 422 and both.json()["errors"], both.text

        # Signals by name or number; kill.
        term = _ok(c.post(f"{base}/processes", json={"cmd": ["sleep", "600"]}), 201)
        hup = _ok(c.post(f"{base}/processes", json={"cmd": ["sleep", "600"]}), 201)
        doomed = _ok(c.post(f"{base}/processes", json={"cmd": "sleep 600; echo never"}), 201)
        _ok(c.post(f"{base}/processes/{term['pid']}/signal", json={"signal": "TERM"}), 204)
        _ok(c.post(f"{base}/processes/{hup['pid']}/signal", json={"signal": 1}), 204)
        _ok(c.delete(f"{base}/processes/{doomed['pid']}"), 204)
        for pid, sig in ((term["pid"], 15), (hup["pid"], 1), (doomed["pid"], 9)):
            [*_, (kind, end)] = _sse(c, f"{base}/processes/{pid}/output/stream")
            assert (kind, end["exit_code"], end["signal"], end["stdout_b64"]) == (
                "exit",
                None,
                sig,
                "",
            )
        bad = c.post(f"{base}/processes/{term['pid']}/signal", json={"signal": "NOPE"})
        assert bad.status_code == 422, bad.text

        # A terminal: its tty, and a resize.
        sh = {"cmd": ["/bin/bash", "--norc", "-i"], "pty": {"rows": 24, "cols": 80}}
        t = _ok(c.post(f"{base}/processes", json=sh), 201)
        assert (t["pty"], t["stdin"]) == ({"rows": 24, "cols": 80}, True)
        _ok(c.post(f"{base}/processes/{t['pid']}/stdin", json={"text": "tty; stty size\n"}), 204)
        seen, _ = _read_until(c, sid, t["pid"], b"24 80")
        assert b"/dev/pts/" in seen
        _ok(c.post(f"{base}/processes/{t['pid']}/resize", json={"rows": 30, "cols": 100}), 204)
        listed = {x["pid"]: x for x in _ok(c.get(f"{base}/processes"))}
        assert listed[t["pid"]]["pty"] == {"rows": 30, "cols": 100}
        _ok(c.post(f"{base}/processes/{t['pid']}/stdin", json={"text": "stty size; exit 3\n"}), 204)
        _read_until(c, sid, t["pid"], b"30 100")
        [*_, (_, end)] = _sse(c, f"{base}/processes/{t['pid']}/output/stream")
        assert end["exit_code"] == 3
        no_tty = c.post(f"{base}/processes/{term['pid']}/resize", json={"rows": 5, "cols": 5})
        assert no_tty.status_code == 422 and "no terminal" in no_tty.json()["detail"]

        # What the session does not have is 404; so is everything of it to another tenant.
        for answer in (
            c.get(f"{base}/processes/99999/output"),
            c.get(f"{base}/processes/99999/output/stream"),
            c.delete(f"{base}/processes/99999"),
            c.get(f"{base}/watches/12345/events"),
        ):
            assert answer.status_code == 404, answer.text
            assert "99999" in answer.text or "12345" in answer.text, answer.text
        for answer in (
            o.get(f"{base}/processes"),
            o.post(f"{base}/processes", json={"cmd": "echo hi"}),
            o.get(f"{base}/processes/{p['pid']}/output"),
            o.get(f"{base}/processes/{p['pid']}/output/stream"),
            o.post(f"{base}/processes/{cat['pid']}/stdin", json={"text": "x"}),
            o.delete(f"{base}/processes/{term['pid']}"),
            o.post(f"{base}/watches", json={"path": "."}),
        ):
            assert answer.status_code == 404, answer.text

        # Every spawn is a run of this tenant's, with the session's id; none is the other's.
        records = _audit(c, sid)
        starts = [r for r in records if r["reason"].startswith("started in the background")]
        spawned = [ticks, "cat", "sleep 600", "sleep 600", "sleep 600; echo never"]
        assert sorted(r["code"] for r in starts) == sorted([*spawned, "/bin/bash --norc -i"])
        assert {r["outcome"] for r in starts} == {"ok"}
        # The ends seen are runs of the tenant's too, each naming its start.
        ends = [r for r in records if r not in starts]
        started = {r["run_id"] for r in starts}
        assert ends and all(r["reason"].rsplit(" ", 1)[-1].rstrip(")") in started for r in ends)
        assert {r["code"]: r["outcome"] for r in ends}[ticks] == "ok"
        assert o.get(f"/v1/audit/{p['run_id']}").status_code == 404
        _ok(c.delete(base))


def test_watches_over_http(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "watcher", profiles=("strict",))
    with service.client(key) as c:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        base = f"/v1/sessions/{sid}"
        _ok(c.post(f"{base}/cells", json={"code": "import os; os.makedirs('data/sub')"}))
        w = _ok(c.post(f"{base}/watches", json={"path": "data", "recursive": True}), 201)
        assert (w["path"], w["recursive"]) == ("data", True)
        _ok(c.post(f"{base}/cells", json={"code": "open('data/sub/a.txt', 'w').write('x')"}))
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + DEADLINE_S
        while ("create", "sub/a.txt") not in {(e["type"], e["name"]) for e in seen}:
            assert time.monotonic() < deadline, seen
            seen += _ok(c.get(f"{base}/watches/{w['id']}/events"))
            time.sleep(0.05)
        assert all(isinstance(e["at"], float) and e["is_dir"] is False for e in seen)
        _ok(c.delete(f"{base}/watches/{w['id']}"), 204)
        assert c.get(f"{base}/watches/{w['id']}/events").status_code == 404
        missing = c.post(f"{base}/watches", json={"path": "nowhere"})
        assert missing.status_code == 404, missing.text
        _ok(c.delete(base))


def test_refused_and_failed_spawns_are_the_tenants_runs(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "strict-spawner", profiles=("strict",), max_concurrent=2)
    with service.client(key) as c:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        base = f"/v1/sessions/{sid}"
        refused = c.post(f"{base}/processes", json={"cmd": "rm -rf /"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"].startswith("not started")
        missing = c.post(f"{base}/processes", json={"cmd": ["/no/such/program"]})
        assert missing.status_code == 422, missing.text
        assert _ok(c.get(f"{base}/processes")) == []
        outcomes = sorted((r["code"], r["outcome"]) for r in _audit(c, sid))
        assert outcomes == [("/no/such/program", "error"), ("rm -rf /", "denied")]
        # A session that ended: its processes are gone with it.
        _ok(c.delete(base))
        assert c.get(f"{base}/processes").status_code == 404


def test_a_files_resume_has_no_processes(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "files-resumer")
    with service.client(key) as c:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        base = f"/v1/sessions/{sid}"
        p = _ok(c.post(f"{base}/processes", json={"cmd": ["sleep", "600"]}), 201)
        _ok(c.post(f"{base}/pause", json={"mode": "files"}))
        assert c.get(f"{base}/processes").status_code == 404  # paused: no live session
        _ok(c.post(f"{base}/resume"))
        # A files-mode resume starts a fresh kernel, with none of the old processes.
        assert _ok(c.get(f"{base}/processes")) == []
        assert c.get(f"{base}/processes/{p['pid']}/output").status_code == 404
        _ok(c.delete(base))


def test_a_memory_pause_keeps_the_processes_on_gvisor(tmp_path: Path) -> None:
    import shutil

    if shutil.which("runsc") is None:
        pytest.skip("gVisor's runsc is not installed on this host")
    home = tmp_path / "home"
    home.mkdir()
    key = add_tenant(home, "gvisor-spawner")
    served = ServiceProcess(home, args=("--start", "cold", "--backend", "gvisor")).start()
    try:
        with served.client(key) as c:
            opened = c.post("/v1/sessions", json={})
            if opened.status_code == 503:
                pytest.skip(f"this host cannot open the session: {opened.json()['detail']}")
            sid = _ok(opened, 201)["id"]
            base = f"/v1/sessions/{sid}"
            cat = _ok(c.post(f"{base}/processes", json={"cmd": ["cat"], "stdin": True}), 201)
            _ok(c.post(f"{base}/processes/{cat['pid']}/stdin", json={"text": "before\n"}), 204)
            _read_until(c, sid, cat["pid"], b"before\n")
            paused = c.post(f"{base}/pause", json={"mode": "memory"})
            if paused.status_code == 422:
                pytest.skip(f"gVisor does not pause in memory mode here yet: {paused.text}")
            assert _ok(paused)["mode"] == "memory"
            _ok(c.post(f"{base}/resume"))
            # The same process, its buffered output and its open input came back.
            [again] = _ok(c.get(f"{base}/processes"))
            assert (again["pid"], again["exited"]) == (cat["pid"], False)
            _ok(c.post(f"{base}/processes/{cat['pid']}/stdin", json={"text": "after\n"}), 204)
            seen, _ = _read_until(c, sid, cat["pid"], b"after\n")
            assert seen == b"before\nafter\n"
            _ok(c.post(f"{base}/processes/{cat['pid']}/stdin/close"), 204)
            [*_, (kind, end)] = _sse(c, f"{base}/processes/{cat['pid']}/output/stream")
            assert (kind, end["exit_code"]) == ("exit", 0)
            _ok(c.delete(base))
    finally:
        assert served.stop() == -signal.SIGTERM


def test_a_followed_process_waits_out_a_running_cell(service: ServiceProcess, home: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    key = add_tenant(home, "patient-follower")
    with service.client(key) as c, service.client(key) as cells:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        base = f"/v1/sessions/{sid}"
        p = _ok(c.post(f"{base}/processes", json={"cmd": "for i in 1 2 3; do echo $i; done"}), 201)
        sleeper = "import time\ntime.sleep(2)\nprint('slept')"
        with ThreadPoolExecutor(1) as pool:
            cell = pool.submit(cells.post, f"{base}/cells", json={"code": sleeper})
            events = _sse(c, f"{base}/processes/{p['pid']}/output/stream")
            assert _ok(cell.result())["stdout"] == "slept\n"
        out = b"".join(base64.b64decode(e["stdout_b64"]) for _, e in events)
        assert (out, events[-1][0], events[-1][1]["exit_code"]) == (b"1\n2\n3\n", "exit", 0)
        _ok(c.delete(base))
