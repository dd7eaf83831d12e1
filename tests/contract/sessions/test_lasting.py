"""Sessions that last, on every rung: pause and resume, snapshots, fork, pausing when idle.

A paused session leaves nothing running on the host and comes back under its id with its files
(``files`` mode, every rung) or with its variables and processes too (``memory`` mode, the rungs
that restore memory under the same confinement: gVisor and microVM; the namespaces rung refuses
it and goes on). Each step is an entry of the audit chain, linked to what it came from; a state
changed on disk is refused; another owner sees nothing; forks are apart from each other and draw
fresh randomness."""

from __future__ import annotations

import os
import time

import pytest
from tests.contract.sessions.rungs import only_on, open_session
from tests.contract.sessions.traces import trace

from sandcell import Executor, Outcome
from sandcell.sessions import (
    PauseMode,
    PauseRefused,
    Session,
    SessionEnded,
    StateNotFound,
    StateTampered,
)

MEMORY_RUNGS = ("gvisor", "microvm")
NO_MEMORY = {
    "namespaces": "the namespaces rung keeps files only (no CRIU that restores its confinement "
    "on this host)",
    "wasm": "the wasm rung keeps files only (its kernel is the namespaces rung's sandbox, with "
    "no checkpoint of Node's memory)",
}

SETUP = (
    "import os, subprocess\n"
    "x = 41\n"
    "os.makedirs('d/e', exist_ok=True)\n"
    "open('d/e/kept.txt', 'w').write('kept')\n"
    "p = subprocess.Popen(['sleep', '600'])\n"
)
NO_PROCESSES = "the wasm rung has no processes: Python runs as WebAssembly"
NO_LINKS = "the wasm rung's cells cannot make symbolic links (see test_cells.py)"


def _setup(rung: str) -> str:
    """SETUP, and a link to a host file the files pause must not keep; the wasm rung's without
    the process and the link (it has no processes, and refuses links)."""
    if rung == "wasm":
        return SETUP.replace("p = subprocess.Popen(['sleep', '600'])\n", "")
    return SETUP + "os.symlink('/etc/passwd', 'pw')\n"


def _ok(s: Session, code: str) -> str:
    r = s.run(code)
    assert r.outcome is Outcome.OK, (r.reason, r.stderr)
    return r.stdout


def _events(ex: Executor, session_id: str) -> list[dict[str, object]]:
    found = []
    for entry in ex.audit.list(limit=200):
        rec = entry.record
        if rec.get("kind") == "session_event" and (
            rec.get("session_id") == session_id or rec.get("parent_session_id") == session_id
        ):
            found.append(rec)
    return list(reversed(found))


@only_on(*MEMORY_RUNGS, reason=NO_MEMORY)
def test_memory_pause_keeps_variables_processes_and_files(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    _ok(s, SETUP)
    host = trace(rung, s)
    state = s.pause(mode="memory")
    assert s.ended == "paused"
    assert state.kind == "paused" and state.saved.mode is PauseMode.MEMORY
    assert state.stored_bytes > 0
    host.assert_gone()  # nothing runs and nothing is held while it is paused
    with pytest.raises(SessionEnded):
        s.run("x")
    assert s.id in [p.id for p in ex.paused()]
    back = ex.resume(s.id)
    try:
        assert back.id == s.id
        out = _ok(back, "print(x + 1, p.poll(), open('d/e/kept.txt').read())")
        assert out.split() == ["42", "None", "kept"]
        assert s.id not in [p.id for p in ex.paused()]  # a resume consumes the paused state
        events = [e["event"] for e in _events(ex, s.id)]
        assert events[-2:] == ["pause", "resume"]
        pause, resume = _events(ex, s.id)[-2:]
        assert resume["saved_by_record"] is not None
        assert resume["state"] == pause["state"]  # same state, same hash
        with pytest.raises(StateNotFound):
            ex.resume(s.id)  # once
    finally:
        back.close()


def test_files_pause_keeps_files_only(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    _ok(s, _setup(rung))
    host = trace(rung, s)
    state = s.pause(mode="files")
    assert state.saved.mode is PauseMode.FILES
    host.assert_gone()
    back = ex.resume(s.id)
    try:
        out = _ok(
            back,
            "import os\nprint(open('d/e/kept.txt').read(), 'x' in globals(), "
            "os.path.islink('pw') or not os.path.exists('pw'))",
        )
        assert out.split() == ["kept", "False", "True"]
    finally:
        back.close()


@only_on(
    "namespaces", "wasm",
    reason="the namespaces and wasm rungs are the ones without a memory pause",
)  # fmt: skip
def test_a_memory_pause_the_rung_cannot_keep_is_refused_and_the_session_goes_on(
    rung: str, ex: Executor
) -> None:
    s = open_session(ex)
    try:
        _ok(s, "x = 1")
        assert s.pause_modes == frozenset({PauseMode.FILES})
        with pytest.raises(PauseRefused, match="files"):
            s.pause(mode="memory")
        assert s.ended is None
        assert _ok(s, "print(x)").strip() == "1"
        assert s.id not in [p.id for p in ex.paused()]
    finally:
        s.close()


def test_a_tampered_state_is_refused_and_kept(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    _ok(s, "open('f', 'w').write('y')")
    state = s.pause(mode="memory" if rung in MEMORY_RUNGS else "files")
    biggest = max(state.files, key=lambda p: state.files[p][0])
    path = state.directory / "data" / biggest
    with path.open("r+b") as f:
        f.seek(state.files[biggest][0] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(StateTampered, match="changed after it was saved"):
        ex.resume(s.id)
    assert s.id in [p.id for p in ex.paused()]  # refused, nothing lost
    ex.delete_paused(s.id)
    assert s.id not in [p.id for p in ex.paused()]


@only_on(
    "namespaces",
    "gvisor",
    reason="whose a state is, is the session layer's check, the same on every rung; the rungs' "
    "own states are attacked on every rung by the tampering test",
)
def test_another_owner_cannot_reach_a_state(rung: str, ex: Executor) -> None:
    s = open_session(ex, owner="tenant-a")
    _ok(s, "v = 7")
    mode = "memory" if rung in MEMORY_RUNGS else "files"
    s.snapshot("base", mode=mode)
    s.pause(mode=mode)
    try:
        for call in (
            lambda: ex.resume(s.id, owner="tenant-b"),
            lambda: ex.resume(s.id),
            lambda: ex.fork_paused(s.id, 1, owner="tenant-b"),
            lambda: ex.session(snapshot="base", owner="tenant-b"),
            lambda: ex.delete_snapshot("base", owner="tenant-b"),
        ):
            with pytest.raises(StateNotFound):
                call()
        assert s.id not in [p.id for p in ex.paused(owner="tenant-b")]
        assert "base" not in [x.name for x in ex.snapshots(owner="tenant-b")]
    finally:
        ex.delete_paused(s.id, owner="tenant-a")
        ex.delete_snapshot("base", owner="tenant-a")


@only_on(*MEMORY_RUNGS, reason=NO_MEMORY)
def test_forks_are_independent_and_draw_fresh_randomness(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    forks: list[Session] = []
    try:
        _ok(
            s,
            "import random, subprocess\nx = 1\nrandom.seed(5)\nopen('shared', 'w').write('parent')",
        )
        forks = s.fork(2)
        assert len({f.id for f in forks} | {s.id}) == 3
        assert all(f.parent == s.id for f in forks)
        draws = [
            _ok(f, "import os, uuid\nprint(random.random(), os.urandom(8).hex(), uuid.uuid4())")
            for f in forks
        ]
        a, b = (d.split() for d in draws)
        assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2]
        # Each copy changes only itself; the parent goes on as it was.
        _ok(forks[0], "x = 100\nopen('shared', 'w').write('fork0')")
        assert _ok(forks[1], "print(x, open('shared').read())").split() == ["1", "parent"]
        assert _ok(s, "print(x, open('shared').read())").split() == ["1", "parent"]
        # A copy cannot reach its sibling: no shared files, no sibling process in sight.
        pid = _ok(forks[0], "q = subprocess.Popen(['sleep', '600'])\nprint(q.pid)").strip()
        look = (
            f"import os\nc = '/proc/{pid}/cmdline'\n"
            "print(os.path.exists(c) and 'sleep' in open(c).read())"
        )
        # The sibling's new process is not in this copy.
        assert _ok(forks[1], look).strip() == "False"
        fork_event = [e for e in _events(ex, s.id) if e["event"] == "fork"][-1]
        assert sorted(fork_event["children"]) == sorted(f.id for f in forks)  # type: ignore[arg-type]
    finally:
        for f in forks:
            f.close()
        s.close()


def test_files_fork_and_snapshot_start(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    started: list[Session] = []
    try:
        _ok(s, "open('note', 'w').write('from parent')\ny = 3")
        state = s.snapshot("lasting-files", mode="files")
        assert state.kind == "snapshot" and state.name == "lasting-files"
        assert "lasting-files" in [x.name for x in ex.snapshots()]
        started = [ex.session(snapshot="lasting-files") for _ in range(2)]
        started += s.fork(1, mode="files")
        for other in started:
            assert other.id != s.id
            out = _ok(other, "print(open('note').read(), 'y' in globals())")
            assert out.split() == ["from", "parent", "False"]
        assert _ok(s, "print(y)").strip() == "3"  # the parent goes on
        events = [e["event"] for e in _events(ex, s.id)]
        assert "snapshot" in events and "fork" in events
        assert events.count("start_from_snapshot") == 2
    finally:
        for other in started:
            other.close()
        s.close()
        ex.delete_snapshot("lasting-files")
    assert "lasting-files" not in [x.name for x in ex.snapshots()]


IDLE_REASON = (
    "the idle pause is the same session code on every rung; checked on the two rungs whose "
    "sessions start in well under the idle time"
)


@only_on("namespaces", "gvisor", reason=IDLE_REASON)
def test_an_idle_session_pauses_instead_of_ending(rung: str, ex: Executor) -> None:
    s = open_session(ex, idle_timeout_s=1.0, on_idle="pause")
    _ok(s, "open('idle', 'w').write('still here')")
    while s.ended is None:  # the watchdog pauses it: wait for that, however long it takes
        time.sleep(0.1)
    assert s.ended == "paused"
    # The session is over (its sandbox stopped) a moment before its state is committed.
    state = next((p for p in ex.paused() if p.id == s.id), None)
    while state is None:
        time.sleep(0.05)
        state = next((p for p in ex.paused() if p.id == s.id), None)
    pause = [e for e in _events(ex, s.id) if e["event"] == "pause"][-1]
    assert str(pause["by"]).startswith("on_idle")
    back = ex.resume(s.id)
    try:
        assert _ok(back, "print(open('idle').read())").strip() == "still here"
        assert state.saved.mode in back.pause_modes
    finally:
        back.close()


def test_metrics_sample_the_session(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    try:
        _ok(s, "open('blob', 'wb').write(b'1' * 100_000)")
        samples = s.metrics()
        assert samples
        m = samples[-1]
        assert m.cpu_count >= 1
        assert 0 < m.mem_used_bytes <= m.mem_total_bytes
        assert m.disk_used_bytes >= 100_000
        assert m.disk_total_bytes >= m.disk_used_bytes
        assert m.cpu_used_pct >= 0.0
    finally:
        s.close()


# A copy listens on an abstract Unix socket (a name any process of the same network namespace
# can reach; the loopback's TCP is closed to sessions on some rungs) and leaves a file in /tmp.
LISTEN = """
import subprocess, sys
server = "; ".join([
    "import socket",
    "s = socket.socket(socket.AF_UNIX)",
    "s.bind(chr(0) + 'sandcell-sibling')",
    "s.listen()",
    "print('up', flush=True)",
    "s.accept()",
])
srv = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE)
print(srv.stdout.readline().decode().strip())
open("/tmp/secret", "w").write("mine")
"""
REACH = """
import os, socket
c = socket.socket(socket.AF_UNIX)
try:
    c.connect(chr(0) + "sandcell-sibling")
    print("reached")
except OSError as e:
    print("refused", e.errno)
print(os.path.exists("/tmp/secret"))
"""


@only_on(
    "namespaces", "gvisor", "microvm",
    reason=NO_PROCESSES + " and no sockets: a fork has nothing to listen or connect with; that "
    "its files are its own is checked by test_files_fork_and_snapshot_start",
)  # fmt: skip
def test_forks_cannot_reach_each_other(rung: str, ex: Executor) -> None:
    """A copy listens (LISTEN) and leaves a file in its /tmp; its sibling, copied from the same
    state at the same moment, and its parent reach neither: each is a sandbox of its own."""
    s = open_session(ex)
    forks: list[Session] = []
    try:
        _ok(s, "x = 1")
        forks = s.fork(2, mode="memory" if rung in MEMORY_RUNGS else "files")
        assert _ok(forks[0], LISTEN).strip() == "up"
        assert _ok(forks[0], REACH).split()[0] == "reached"  # the listener is there
        out = _ok(forks[1], REACH).split()
        assert out[0] == "refused" and out[-1] == "False", out
        out = _ok(s, REACH).split()
        assert out[0] == "refused" and out[-1] == "False", out
    finally:
        for f in forks:
            f.close()
        s.close()
