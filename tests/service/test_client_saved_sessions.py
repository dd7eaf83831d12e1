"""``sandcell.client`` for sessions that last, against the real service: pause, resume,
snapshots, forks and metrics with the executor's names, and its errors (PauseRefused,
StateNotFound) raised as in-process. Real sandboxes on the namespaces rung (``files`` mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from tests.service.server import ServiceProcess, add_tenant

from sandcell.backends.cell.state import PauseRefused
from sandcell.client import AsyncClient, Client, QuotaExceeded
from sandcell.sessions import SessionEnded
from sandcell.sessions.states import StateNotFound

pytestmark = pytest.mark.timeout(300)


def test_client_pauses_resumes_forks_and_snapshots(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-lasting", profiles=("analysis",), max_concurrent=4)
    with Client(service.url, key) as c:
        s = c.session()
        s.run("open('note.txt', 'w').write('kept')")
        [sample, *_] = s.metrics()
        assert sample.mem_total_bytes > 0 and sample.disk_used_bytes >= 4
        with pytest.raises(PauseRefused, match="files"):
            s.pause(mode="memory")  # not on the namespaces rung; the session goes on
        assert s.run("print('on')").stdout == "on\n"
        saved = s.snapshot("start", mode="files")
        assert saved.kind == "snapshot" and saved.name == "start"
        assert [x.name for x in c.snapshots()] == ["start"]
        [copy] = s.fork(mode="files")
        assert copy.id != s.id and copy.info().parent == s.id
        assert copy.run("print(open('note.txt').read())").stdout == "kept\n"
        copy.close()
        paused = s.pause(mode="files")
        assert paused.id == s.id and s.ended == "paused"
        with pytest.raises(SessionEnded):
            s.run("print(1)")
        assert [p.id for p in c.paused()] == [s.id]
        [twin] = c.fork_paused(s.id, mode="files")
        assert twin.run("print(open('note.txt').read())").stdout == "kept\n"
        twin.close()
        back = c.resume(s.id)
        assert back.id == s.id
        assert back.run("print(open('note.txt').read())").stdout == "kept\n"
        with pytest.raises(StateNotFound):
            c.resume(s.id)  # consumed
        started = c.session(snapshot="start")
        assert started.info().parent == s.id
        assert started.run("print(open('note.txt').read())").stdout == "kept\n"
        started.close()
        back.close()
        assert c.delete_snapshot("start").name == "start"
        with pytest.raises(StateNotFound):
            c.delete_snapshot("start")
        with pytest.raises(StateNotFound):
            c.session(snapshot="start")
        with pytest.raises(StateNotFound):
            c.delete_paused(s.id)


def test_client_over_the_stored_quota(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-tight", profiles=("analysis",), max_stored_bytes=32 * 1024)
    with Client(service.url, key) as c, c.session() as s:
        s.run("open('big.bin', 'wb').write(b'x' * 128 * 1024)")
        with pytest.raises(QuotaExceeded, match="max_stored_bytes"):
            s.pause(mode="files")
        assert s.run("print('still here')").stdout == "still here\n"


def test_async_client_pause_and_resume(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-lasting-async", profiles=("analysis",))

    async def scenario() -> dict[str, Any]:
        async with AsyncClient(service.url, key) as c:
            s = await c.session()
            await s.run("open('a.txt', 'w').write('async kept')")
            metrics = await s.metrics()
            paused = await s.pause(mode="files")
            listed = await c.paused()
            back = await c.resume(s.id)
            cell = await back.run("print(open('a.txt').read())")
            forks = await back.fork(2, mode="files")
            outs = [(await f.run("print(open('a.txt').read())")).stdout for f in forks]
            for f in forks:
                await f.close()
            await back.close()
            snaps = await c.snapshots()
            return locals()

    got = anyio.run(scenario)
    assert got["metrics"] and got["paused"].mode == "files"
    assert [p.id for p in got["listed"]] == [got["s"].id]
    assert got["cell"].stdout == "async kept\n"
    assert got["outs"] == ["async kept\n", "async kept\n"]
    assert got["snaps"] == []
