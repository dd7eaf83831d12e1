"""``sandcell.client`` for a session's background processes, terminals and watches, against the
real service: the names and types of :class:`sandcell.sessions.Session`, and its errors
(ProcessNotFound, SpawnRefused, SpawnFailed, SessionEnded) raised as in-process. Real sandboxes
on the namespaces rung; every wait is for an event, with a deadline only for a broken run."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from tests.service.server import ServiceProcess, add_tenant

from sandcell.client import AsyncClient, Client, RemoteSession
from sandcell.sessions import (
    ProcessNotFound,
    ProcessOutput,
    SessionEnded,
    SpawnFailed,
    SpawnRefused,
    WatchEvent,
)

pytestmark = pytest.mark.timeout(300)

DEADLINE_S = 60.0
TICKS = "for i in 1 2 3; do echo $i; sleep 0.2; done"


def _read_until(s: RemoteSession, pid: int, needle: bytes, start: int = 0) -> tuple[bytes, int]:
    seen, offset = b"", start
    deadline = time.monotonic() + DEADLINE_S
    while needle not in seen:
        assert time.monotonic() < deadline, (needle, seen)
        got = s.read_process(pid, stdout_from=offset)
        seen, offset = seen + got.stdout, got.stdout_next
        assert needle in seen or not got.exited, (needle, seen)
        if not got.stdout:
            time.sleep(0.05)
    return seen, offset


def _followed(s: RemoteSession, pid: int, **offsets: int) -> tuple[bytes, ProcessOutput]:
    out, last = b"", None
    for got in s.follow(pid, **offsets):
        assert isinstance(got, ProcessOutput)
        out, last = out + got.stdout, got
    assert last is not None and last.exited
    return out, last


def test_client_processes_terminals_and_watches(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-spawner")
    with Client(service.url, key) as c, c.session() as s:
        p = s.spawn(TICKS, tag="ticks", env={"WHO": "me"})
        assert (p.command, p.tag, p.env, p.exited) == (TICKS, "ticks", {"WHO": "me"}, False)
        assert p.run_id is not None and c.audit(p.run_id).record["session_id"] == s.id
        assert s.run("print(6 * 7)").stdout == "42\n"
        out, last = _followed(s, p.pid)
        assert (out, last.exit_code, last.signal) == (b"1\n2\n3\n", 0, None)
        assert s.read_process(p.pid, stdout_from=2).stdout == b"2\n3\n"
        assert [(q.pid, q.exited) for q in s.processes()] == [(p.pid, True)]

        cat = s.spawn(["cat"], stdin=True)
        s.send_stdin(cat.pid, "hello\n")
        _, offset = _read_until(s, cat.pid, b"hello\n")
        s.send_stdin(cat.pid, b"\x00raw\n")
        s.close_stdin(cat.pid)
        out, last = _followed(s, cat.pid, stdout_from=offset)
        assert (out, last.exit_code) == (b"\x00raw\n", 0)
        with pytest.raises(SpawnFailed, match="no open stdin"):
            s.send_stdin(cat.pid, "late")

        term, doomed = s.spawn(["sleep", "600"]), s.spawn(["sleep", "600"])
        s.signal(term.pid, "TERM")
        s.kill(doomed.pid)
        assert _followed(s, term.pid)[1].signal == signal.SIGTERM
        assert _followed(s, doomed.pid)[1].signal == signal.SIGKILL
        hup = s.spawn(["sleep", "600"])
        s.signal(hup.pid, signal.SIGHUP)
        assert _followed(s, hup.pid)[1].signal == signal.SIGHUP

        t = s.spawn(["/bin/bash", "--norc", "-i"], pty=(24, 80))
        assert (t.pty, t.stdin) == ((24, 80), True)
        s.send_stdin(t.pid, "stty size\n")
        _, offset = _read_until(s, t.pid, b"24 80")
        s.resize(t.pid, 30, 100)
        s.send_stdin(t.pid, "stty size; exit 4\n")
        _read_until(s, t.pid, b"30 100", start=offset)
        assert _followed(s, t.pid)[1].exit_code == 4
        with pytest.raises(SpawnFailed, match="no terminal"):
            s.resize(term.pid, 5, 5)

        s.run("import os; os.makedirs('box')")
        w = s.watch("box")
        s.run("open('box/new.txt', 'w').write('x')")
        seen: list[WatchEvent] = []
        deadline = time.monotonic() + DEADLINE_S
        while ("create", "new.txt") not in {(e.type, e.name) for e in seen}:
            assert time.monotonic() < deadline, seen
            seen += s.watch_events(w)
            time.sleep(0.05)
        s.unwatch(w)

        with pytest.raises(ProcessNotFound):
            s.read_process(99999)
        with pytest.raises(ProcessNotFound):
            list(s.follow(99999))
        with pytest.raises(ProcessNotFound):
            s.watch_events(w)
        with pytest.raises(SpawnRefused, match="not started"):
            s.spawn("rm -rf /")
        with pytest.raises(SpawnFailed):
            s.spawn(["/no/such/program"])
        s.close()
        with pytest.raises(SessionEnded):
            s.processes()
        with pytest.raises(SessionEnded):
            list(s.follow(p.pid))


def test_async_client_processes(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-spawner-async")

    async def scenario() -> dict[str, Any]:
        async with AsyncClient(service.url, key) as c:
            s = await c.session()
            p = await s.spawn(TICKS)
            chunks = [o async for o in s.follow(p.pid)]
            listed = await s.processes()
            cat = await s.spawn(["cat"], stdin=True)
            await s.send_stdin(cat.pid, "async\n")
            await s.close_stdin(cat.pid)
            cat_out = b"".join([o.stdout async for o in s.follow(cat.pid)])
            sleeper = await s.spawn(["sleep", "600"])
            await s.signal(sleeper.pid, signal.SIGTERM)
            ended = [o async for o in s.follow(sleeper.pid)][-1]
            w = await s.watch(".")
            await s.run("open('made.txt', 'w').write('x')")
            events: list[WatchEvent] = []
            deadline = time.monotonic() + DEADLINE_S
            while "made.txt" not in {e.name for e in events}:
                assert time.monotonic() < deadline, events
                events += await s.watch_events(w)
                await anyio.sleep(0.05)
            await s.unwatch(w)
            try:
                await s.read_process(99999)
            except ProcessNotFound as exc:
                missing: Exception = exc
            await s.close()
            return locals()

    got = anyio.run(scenario)
    assert b"".join(o.stdout for o in got["chunks"]) == b"1\n2\n3\n"
    assert got["chunks"][-1].exited and got["chunks"][-1].exit_code == 0
    assert [q.pid for q in got["listed"]] == [got["p"].pid]
    assert got["cat_out"] == b"async\n"
    assert got["ended"].signal == signal.SIGTERM
    assert isinstance(got["missing"], ProcessNotFound)
