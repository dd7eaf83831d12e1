"""Sessions that last, over HTTP: pause and resume, snapshots, forks, metrics, each tenant's
own, counted in its stored bytes, recorded where it sees them, and surviving a restart.

A real ``sandcell serve`` with real sandboxes: the namespaces rung in ``files`` mode (what it
offers on this host), and gVisor in ``memory`` mode where this host's runsc restores one.
"""

from __future__ import annotations

import base64
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from tests.service.server import ServiceProcess, add_tenant


def _ok(answer: httpx2.Response, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json()


def _cell(c: httpx2.Client, sid: str, code: str) -> str:
    result = _ok(c.post(f"/v1/sessions/{sid}/cells", json={"code": code}))
    assert result["outcome"] == "ok", result
    return str(result["stdout"])


def _events(c: httpx2.Client, session_id: str) -> list[dict[str, Any]]:
    """The session-event records the tenant sees for ``session_id`` (or naming it as parent)."""
    found = []
    for summary in _ok(c.get("/v1/audit?limit=200")):
        if summary["language"] != "session":
            continue
        record = _ok(c.get(f"/v1/audit/{summary['run_id']}"))["record"]
        if session_id in (record["session_id"], record["parent_session_id"]):
            found.append(record)
    return found


def test_pause_resume_fork_and_snapshots_of_a_tenant(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "laster", profiles=("analysis",), max_concurrent=4)
    other = add_tenant(home, "stranger", profiles=("analysis",))
    with service.client(key) as c, service.client(other) as o:
        seed = base64.b64encode(b"41").decode()
        sid = _ok(c.post("/v1/sessions", json={"files": {"seed.txt": seed}}), 201)["id"]
        _cell(c, sid, "open('kept.txt', 'w').write(open('/inputs/seed.txt').read())")
        samples = _ok(c.get(f"/v1/sessions/{sid}/metrics"))
        assert samples and samples[-1]["mem_total_bytes"] > 0
        assert samples[-1]["disk_used_bytes"] >= 2

        # Memory mode is refused on the namespaces rung (a 422 saying what it offers); the
        # session goes on.
        refused = c.post(f"/v1/sessions/{sid}/pause", json={"mode": "memory"})
        assert refused.status_code == 422 and "files" in refused.json()["detail"], refused.text
        assert _cell(c, sid, "print('alive')") == "alive\n"

        paused = _ok(c.post(f"/v1/sessions/{sid}/pause", json={"mode": "files"}))
        assert paused["id"] == sid and paused["kind"] == "paused" and paused["mode"] == "files"
        assert paused["stored_bytes"] > 0 and len(paused["sha256"]) == 64
        assert c.get(f"/v1/sessions/{sid}").status_code == 404  # no longer live
        assert [p["id"] for p in _ok(c.get("/v1/paused"))] == [sid]
        assert _ok(c.get("/v1/tenant"))["stored_bytes"] >= paused["stored_bytes"]
        assert _ok(c.get("/v1/tenant"))["in_flight"] == 0  # its slot was given back

        # Another tenant sees nothing of it.
        assert _ok(o.get("/v1/paused")) == []
        assert o.post(f"/v1/sessions/{sid}/resume").status_code == 404
        assert o.delete(f"/v1/paused/{sid}").status_code == 404
        assert o.post(f"/v1/sessions/{sid}/fork", json={"n": 1, "mode": "files"}).status_code == 404

        # A paused session forks and stays paused; the copies have its files and inputs.
        forked = _ok(c.post(f"/v1/sessions/{sid}/fork", json={"n": 2, "mode": "files"}), 201)
        copies = [s["id"] for s in forked["sessions"]]
        assert len(set(copies)) == 2 and sid not in copies
        assert all(s["parent"] == sid for s in forked["sessions"])
        for copy in copies:
            assert _cell(c, copy, "print(open('kept.txt').read())") == "41\n"
            assert _cell(c, copy, "print(open('/inputs/seed.txt').read())") == "41\n"
            assert _ok(c.delete(f"/v1/sessions/{copy}"))["reason"] == "closed"
        assert [p["id"] for p in _ok(c.get("/v1/paused"))] == [sid]

        resumed = _ok(c.post(f"/v1/sessions/{sid}/resume"))
        assert resumed["id"] == sid and resumed["ended"] is None and resumed["cells"] == 2
        assert _cell(c, sid, "print(open('kept.txt').read())") == "41\n"
        assert _ok(c.get("/v1/paused")) == []
        assert c.post(f"/v1/sessions/{sid}/resume").status_code == 404  # consumed

        # A live session forks and goes on; a snapshot starts new sessions.
        live_fork = _ok(c.post(f"/v1/sessions/{sid}/fork", json={"mode": "files"}), 201)
        [copy] = [s["id"] for s in live_fork["sessions"]]
        assert _cell(c, copy, "print(open('kept.txt').read())") == "41\n"
        c.delete(f"/v1/sessions/{copy}")
        snap = _ok(
            c.post(f"/v1/sessions/{sid}/snapshots", json={"name": "base", "mode": "files"}), 201
        )
        assert snap["kind"] == "snapshot" and snap["name"] == "base"
        assert [s["name"] for s in _ok(c.get("/v1/snapshots"))] == ["base"]
        assert _ok(o.get("/v1/snapshots")) == []
        assert o.post("/v1/sessions", json={"snapshot": "base"}).status_code == 404
        mixed = c.post("/v1/sessions", json={"snapshot": "base", "idle_timeout_s": 5})
        assert mixed.status_code == 400 and "idle_timeout_s" in mixed.json()["detail"]
        started = _ok(c.post("/v1/sessions", json={"snapshot": "base"}), 201)
        assert started["parent"] == sid and started["id"] != sid
        assert _cell(c, started["id"], "print(open('kept.txt').read())") == "41\n"
        c.delete(f"/v1/sessions/{started['id']}")
        assert _ok(c.delete("/v1/snapshots/base"))["name"] == "base"
        assert c.delete("/v1/snapshots/base").status_code == 404

        # Paused again, then deleted: nothing left counts.
        _ok(c.post(f"/v1/sessions/{sid}/pause", json={"mode": "files"}))
        assert _ok(c.delete(f"/v1/paused/{sid}"))["id"] == sid
        assert _ok(c.get("/v1/paused")) == []
        assert c.post(f"/v1/sessions/{sid}/resume").status_code == 404

        # Every step is a record of this tenant's, and of no other's.
        events = [r["event"] for r in _events(c, sid)]
        for event in ("pause", "fork", "resume", "snapshot", "start_from_snapshot"):
            assert event in events, events
        assert all(r["kind"] == "session_event" for r in _events(c, sid))
        assert _events(o, sid) == []


def test_a_pause_over_the_stored_bytes_quota_is_refused(
    service: ServiceProcess, home: Path
) -> None:
    key = add_tenant(home, "tight", profiles=("analysis",), max_stored_bytes=64 * 1024)
    with service.client(key) as c:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        _cell(c, sid, "open('big.bin', 'wb').write(b'x' * 256 * 1024)")
        over = c.post(f"/v1/sessions/{sid}/pause", json={"mode": "files"})
        assert over.status_code == 429, over.text
        assert "max_stored_bytes" in over.json()["detail"]
        assert "/v1/paused" in over.json()["detail"]
        snap = c.post(f"/v1/sessions/{sid}/snapshots", json={"name": "s", "mode": "files"})
        assert snap.status_code == 429
        fork = c.post(f"/v1/sessions/{sid}/fork", json={"mode": "files"})
        assert fork.status_code == 429
        # Refused before saving: the session goes on, nothing was kept.
        assert _cell(c, sid, "import os; print(os.path.getsize('big.bin'))") == "262144\n"
        assert _ok(c.get("/v1/paused")) == [] and _ok(c.get("/v1/snapshots")) == []
        c.delete(f"/v1/sessions/{sid}")


def test_a_fork_takes_a_slot_per_copy(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "forker", profiles=("analysis",), max_concurrent=2)
    with service.client(key) as c:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        too_many = c.post(f"/v1/sessions/{sid}/fork", json={"n": 2, "mode": "files"})
        assert too_many.status_code == 429, too_many.text
        assert _ok(c.get("/v1/tenant"))["in_flight"] == 1  # none of the two was kept
        c.delete(f"/v1/sessions/{sid}")


def _restart_resume(tmp_path: Path, args: tuple[str, ...], mode: str) -> None:
    """Open a session, keep a file and a variable, pause it in ``mode``, stop the service,
    start a new one on the same home, resume: what ``mode`` keeps is back."""
    home = tmp_path / "home"
    home.mkdir()
    key = add_tenant(home, "durable", profiles=("analysis",))
    first = ServiceProcess(home, args=("--start", "cold", *args)).start()
    try:
        with first.client(key) as c:
            opened = c.post("/v1/sessions", json={})
            if opened.status_code == 503:
                pytest.skip(f"this host cannot open the session: {opened.json()['detail']}")
            sid = _ok(opened, 201)["id"]
            _cell(c, sid, "x = 6 * 7\nopen('kept.txt', 'w').write('file kept')")
            paused = c.post(f"/v1/sessions/{sid}/pause", json={"mode": mode})
            if paused.status_code == 422:
                pytest.skip(f"this rung does not pause in {mode} mode yet: {paused.text}")
            assert _ok(paused)["mode"] == mode
        assert first.stop(signal.SIGTERM) == -signal.SIGTERM
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.stop(signal.SIGKILL)
    second = ServiceProcess(home, args=("--start", "cold", *args)).start()
    try:
        with second.client(key) as c:
            assert [p["id"] for p in _ok(c.get("/v1/paused"))] == [sid]
            assert _ok(c.post(f"/v1/sessions/{sid}/resume"))["id"] == sid
            assert _cell(c, sid, "print(open('kept.txt').read())") == "file kept\n"
            if mode == "memory":
                assert _cell(c, sid, "print(x)") == "42\n"
            else:
                gone = _ok(c.post(f"/v1/sessions/{sid}/cells", json={"code": "print(x)"}))
                assert gone["outcome"] == "error" and "NameError" in gone["stderr"]
            assert sorted(r["event"] for r in _events(c, sid)) == ["pause", "resume"]
            c.delete(f"/v1/sessions/{sid}")
    finally:
        assert second.stop() == -signal.SIGTERM


def test_files_resume_after_a_restart_on_namespaces(tmp_path: Path) -> None:
    _restart_resume(tmp_path, (), "files")


def test_memory_resume_after_a_restart_on_gvisor(tmp_path: Path) -> None:
    import shutil

    if shutil.which("runsc") is None:
        pytest.skip("gVisor's runsc is not installed on this host")
    _restart_resume(tmp_path, ("--backend", "gvisor"), "memory")


def test_an_idle_session_pauses_itself_for_its_tenant(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "dozer", profiles=("analysis",), max_concurrent=1)
    with service.client(key) as c:
        body = {"idle_timeout_s": 1, "on_idle": "pause"}
        opened = _ok(c.post("/v1/sessions", json=body), 201)
        sid = opened["id"]
        assert opened["on_idle"] == "pause"
        _cell(c, sid, "open('kept.txt', 'w').write('slept')")
        deadline = time.monotonic() + 60
        while not _ok(c.get("/v1/paused")):
            assert time.monotonic() < deadline, "the idle session never paused"
            time.sleep(0.2)
        [paused] = _ok(c.get("/v1/paused"))
        assert paused["id"] == sid and paused["mode"] == "files"
        assert _ok(c.get("/v1/tenant"))["in_flight"] == 0  # its slot was given back
        [pause] = _events(c, sid)
        assert pause["event"] == "pause" and pause["by"].startswith("on_idle")
        assert _ok(c.post(f"/v1/sessions/{sid}/resume"))["id"] == sid
        assert _cell(c, sid, "print(open('kept.txt').read())") == "slept\n"
        c.delete(f"/v1/sessions/{sid}")


def test_a_paused_state_changed_on_disk_is_refused(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "tampered", profiles=("analysis",))
    with service.client(key) as c:
        sid = _ok(c.post("/v1/sessions", json={}), 201)["id"]
        _cell(c, sid, "open('kept.txt', 'w').write('original')")
        _ok(c.post(f"/v1/sessions/{sid}/pause", json={"mode": "files"}))
        data = home / "states" / sid / "data"
        files = sorted(p for p in data.rglob("*") if p.is_file())
        assert files, f"no files saved under {data}"
        with files[0].open("ab") as f:
            f.write(b"changed")
        refused = c.post(f"/v1/sessions/{sid}/resume")
        assert refused.status_code == 409, refused.text
        assert "changed" in refused.json()["detail"]
        assert _ok(c.get("/v1/tenant"))["in_flight"] == 0
        assert _ok(c.delete(f"/v1/paused/{sid}"))["id"] == sid
