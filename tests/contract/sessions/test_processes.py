"""Background processes, terminals and watches in a session, on every rung.

A spawned command runs in the session's sandbox while cells run; its output is buffered and read
later by offset, its input takes what is sent, signals end it, and it ends with the session. The
command is admitted like a Bash cell and is one run in the record. A watch sees what changes in a
directory. Outcomes are asserted, never how long anything took: every wait is for an event (the
output, the exit, the change), with a deadline only for a run that went wrong. The microVM, slow
under emulation, runs the few tests that cover the whole path (spawn and stream, the end with the
session, a watch)."""

from __future__ import annotations

import signal
import time

import pytest
from tests.contract.sessions.rungs import only_on, open_session
from tests.contract.sessions.traces import trace

from sandcell import Executor, Limits, Outcome
from sandcell.sessions import (
    PauseMode,
    PauseRefused,
    ProcessNotFound,
    ProcessOutput,
    Session,
    SpawnFailed,
    SpawnRefused,
    WatchEvent,
)
from sandcell.sessions.processes import RING_BYTES

DEADLINE_S = 60.0
"""How long a wait for an output or an event may take before the test fails (never reached when
the feature works: it ends the test that would otherwise hang)."""

FEW_ON_MICROVM = (
    "the microVM runs the few tests that cover the whole path (slow under emulation); this part "
    "is the same manager in the same kernel"
)
NO_PROCESSES = "the wasm rung has no processes: Python runs as WebAssembly"
NO_WATCH = NO_PROCESSES + " (a watch is the session's process manager's, a process of its own)"
NO_MEMORY_PAUSE = {
    "namespaces": "the namespaces rung keeps files only",
    "wasm": NO_PROCESSES,
    "microvm": FEW_ON_MICROVM,
}


def _on_namespaces(why: str) -> dict[str, str]:
    """A namespaces-only test's reason for each other rung: ``why``, or that wasm has no
    processes at all."""
    return {"gvisor": why, "microvm": why, "wasm": NO_PROCESSES}


TICKS = "for i in 1 2 3; do echo $i; sleep 0.2; done"


def _read_until(s: Session, pid: int, needle: bytes, *, start: int = 0) -> tuple[bytes, int]:
    """What process ``pid`` wrote from ``start`` on until ``needle`` shows (stdout), and the
    offset after it."""
    seen, offset = b"", start
    deadline = time.monotonic() + DEADLINE_S
    while needle not in seen:
        got = s.read_process(pid, stdout_from=offset)
        seen, offset = seen + got.stdout, got.stdout_next
        assert needle in seen or not got.exited, (needle, seen)
        assert time.monotonic() < deadline, (needle, seen)
        if not got.stdout:
            time.sleep(0.05)
    return seen, offset


def _followed(s: Session, pid: int) -> tuple[bytes, bytes, ProcessOutput]:
    out, err, last = b"", b"", None
    for got in s.follow(pid):
        out, err, last = out + got.stdout, err + got.stderr, got
    assert last is not None and last.exited
    return out, err, last


def _events_until(s: Session, watch_id: int, wanted: set[tuple[str, str]]) -> list[WatchEvent]:
    seen: list[WatchEvent] = []
    deadline = time.monotonic() + DEADLINE_S
    while not wanted <= {(e.type, e.name) for e in seen}:
        assert time.monotonic() < deadline, (wanted, seen)
        seen += s.watch_events(watch_id)
        time.sleep(0.05)
    return seen


def _records(ex: Executor, session_id: str, code: str) -> list[dict[str, object]]:
    """The runs of ``code`` in the session, oldest first: its spawn, then its end once seen."""
    found = [
        e.record
        for e in ex.audit.list(limit=100)
        if e.record.get("session_id") == session_id and e.record.get("code") == code
    ]
    assert found, f"no record of {code!r} in session {session_id}"
    return found[::-1]


def _spawn_record(ex: Executor, session_id: str, code: str) -> dict[str, object]:
    return _records(ex, session_id, code)[0]


@only_on("namespaces", "gvisor", "microvm", reason=NO_PROCESSES)
def test_a_background_command_streams_while_cells_run(rung: str, ex: Executor) -> None:
    with open_session(ex) as s:
        p = s.spawn(TICKS, tag="ticks")
        assert (p.command, p.tag, p.exited) == (TICKS, "ticks", False)
        cell = s.run("x = 6 * 7\nprint(x)")  # the session is not held by the process
        assert (cell.outcome, cell.stdout) == (Outcome.OK, "42\n")
        out, err, last = _followed(s, p.pid)
        assert (out, err, last.exit_code, last.signal) == (b"1\n2\n3\n", b"", 0, None)
        # Reading does not consume: from any kept offset, again.
        again = s.read_process(p.pid, stdout_from=2)
        assert (again.stdout, again.stdout_offset, again.stdout_skipped) == (b"2\n3\n", 2, 0)
        assert [(q.pid, q.exited, q.exit_code) for q in s.processes()] == [(p.pid, True, 0)]
        start, end = _records(ex, s.id, TICKS)
        assert (start["language"], start["outcome"]) == ("bash", "ok")
        assert start["reason"] == f"started in the background as pid {p.pid}"
        # Its end is a run of its own: exit status and output, linked to its start.
        assert (end["outcome"], end["exit_code"], end["stdout"]) == ("ok", 0, "1\n2\n3\n")
        assert end["reason"] == (
            f"the background process pid {p.pid} exited with 0 (started by run {start['run_id']})"
        )
        assert s.run("print(x)").stdout == "42\n"  # the manager's scope is not the session's


@only_on(
    "namespaces",
    reason=_on_namespaces("the buffer and the reads are the manager's, the same on every rung"),
)
def test_a_reader_that_fell_behind_is_told_what_it_missed(rung: str, ex: Executor) -> None:
    total = 3_000_000
    # A small stdout cap: each read's reply must still fit in it, so reads are smaller.
    with open_session(ex, limits=Limits(stdout_bytes=64 * 1024)) as s:
        p = s.spawn(f"head -c {total} /dev/zero | tr '\\0' a")
        deadline = time.monotonic() + DEADLINE_S
        while not s.processes()[0].exited:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first = s.read_process(p.pid)
        assert (first.stdout_skipped, first.stdout_offset) == (total - RING_BYTES,) * 2
        assert first.more and 0 < len(first.stdout) < 64 * 1024
        out, _, last = _followed(s, p.pid)
        assert (len(out), set(out), last.exit_code) == (RING_BYTES, {ord("a")}, 0)


@only_on("namespaces", "gvisor", reason={"microvm": FEW_ON_MICROVM, "wasm": NO_PROCESSES})
def test_stdin_reaches_the_process_and_closing_it_ends_cat(rung: str, ex: Executor) -> None:
    with open_session(ex) as s:
        p = s.spawn(["cat"], stdin=True)
        s.send_stdin(p.pid, "hello\n")
        _, offset = _read_until(s, p.pid, b"hello\n")
        s.send_stdin(p.pid, b"again\n")
        s.close_stdin(p.pid)
        out, _, last = _followed(s, p.pid)
        assert out[offset:] == b"again\n" and (last.exit_code, last.signal) == (0, None)
        with pytest.raises(SpawnFailed, match="no open stdin"):
            s.send_stdin(p.pid, "late\n")
        quiet = s.spawn(["sleep", "600"])
        with pytest.raises(SpawnFailed, match="no open stdin"):
            s.send_stdin(quiet.pid, "x")  # asked for no input
        s.kill(quiet.pid)


@only_on("namespaces", "gvisor", reason={"microvm": FEW_ON_MICROVM, "wasm": NO_PROCESSES})
def test_signal_and_kill_end_a_process(rung: str, ex: Executor) -> None:
    with open_session(ex) as s:
        term = s.spawn(["sleep", "600"])
        killed = s.spawn("sleep 600; echo never")
        s.signal(term.pid, signal.SIGTERM)
        s.kill(killed.pid)
        for pid, sig in ((term.pid, signal.SIGTERM), (killed.pid, signal.SIGKILL)):
            out, _, last = _followed(s, pid)
            assert (out, last.exit_code, last.signal) == (b"", None, sig)
        s.kill(term.pid)  # an exited process is left alone
        with pytest.raises(ProcessNotFound):
            s.read_process(99999)
        with pytest.raises(ProcessNotFound):
            s.kill(99999)
        assert s.run("print('on')").stdout == "on\n"


@only_on("namespaces", "gvisor", "microvm", reason=NO_PROCESSES)
def test_a_terminal_is_the_processs_tty_and_follows_a_resize(rung: str, ex: Executor) -> None:
    with open_session(ex) as s:
        p = s.spawn(["/bin/bash", "--norc", "-i"], pty=(24, 80))
        assert (p.pty, p.stdin) == ((24, 80), True)
        s.send_stdin(p.pid, "tty; stty size\n")
        seen, offset = _read_until(s, p.pid, b"24 80")
        assert b"/dev/pts/" in seen
        s.resize(p.pid, 30, 100)
        assert s.processes()[0].pty == (30, 100)
        s.send_stdin(p.pid, "stty size; exit 3\n")
        _read_until(s, p.pid, b"30 100", start=offset)
        _, _, last = _followed(s, p.pid)
        assert last.exit_code == 3
        plain = s.spawn(["sleep", "600"])
        with pytest.raises(SpawnFailed, match="no terminal"):
            s.resize(plain.pid, 10, 10)


@only_on("namespaces", reason=_on_namespaces("what the policy decides is the same on every rung"))
def test_a_denied_command_starts_nothing(rung: str, ex: Executor) -> None:
    with open_session(ex, profile="strict") as s:
        with pytest.raises(SpawnRefused, match="not started"):
            s.spawn("rm -rf /")
        assert s.processes() == []
        record = _spawn_record(ex, s.id, "rm -rf /")
        assert record["outcome"] == "denied"
        allowed = s.spawn(["sleep", "1"])  # strict admits a plain command
        assert _followed(s, allowed.pid)[2].exit_code == 0


@only_on("namespaces", "gvisor", reason={"microvm": FEW_ON_MICROVM, "wasm": NO_PROCESSES})
def test_the_sessions_process_limit_holds_inside(rung: str, ex: Executor) -> None:
    max_pids = 8
    with open_session(ex, limits=Limits(max_pids=max_pids)) as s:
        started = []
        with pytest.raises(SpawnFailed, match="process limit"):
            for _ in range(max_pids + 1):
                started.append(s.spawn(["sleep", "600"]))
        # The kernel, its pump thread and the sandbox's own take some of the limit.
        assert 0 < len(started) < max_pids
        assert s.ended is None
        for p in started:
            s.kill(p.pid)
        for p in started:
            _followed(s, p.pid)
        again = s.spawn(["true"])
        assert _followed(s, again.pid)[2].exit_code == 0


@only_on("namespaces", "gvisor", "microvm", reason=NO_PROCESSES)
def test_processes_end_with_the_session(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    host = trace(rung, s)
    s.spawn(["sleep", "600"])
    s.spawn("sleep 600 & sleep 600", stdin=True)
    s.close()
    host.assert_gone()


@only_on("namespaces", "gvisor", "microvm", reason=NO_WATCH)
def test_a_watch_sees_changes_in_a_directory(rung: str, ex: Executor) -> None:
    with open_session(ex) as s:
        s.run("import os\nos.makedirs('w/sub')")
        flat = s.watch("w")
        deep = s.watch("w", recursive=True)
        s.run(
            "open('w/a.txt', 'w').write('x')\n"
            "os.rename('w/a.txt', 'w/b.txt')\n"
            "open('w/sub/c.txt', 'w').write('y')\n"
            "os.remove('w/b.txt')\n"
        )
        top = {("create", "a.txt"), ("write", "a.txt"), ("rename", "a.txt"),
               ("create", "b.txt"), ("remove", "b.txt")}  # fmt: skip
        below = {("create", "sub/c.txt"), ("write", "sub/c.txt")}
        seen_deep = _events_until(s, deep, top | below)
        seen_flat = _events_until(s, flat, top)
        assert not any(e.name.startswith("sub/") for e in seen_flat), seen_flat
        assert not any(".sandcell" in e.name for e in seen_deep), seen_deep
        s.unwatch(flat)
        with pytest.raises(ProcessNotFound):
            s.watch_events(flat)
        s.run("open('w/d.txt', 'w').write('z')")
        _events_until(s, deep, {("create", "d.txt")})


@only_on("gvisor", reason=NO_MEMORY_PAUSE)
def test_a_memory_pause_keeps_a_process_and_its_output(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    if PauseMode.MEMORY not in s.pause_modes:
        s.close()
        pytest.skip(f"{rung}: this build's sandbox offers no memory pause yet")
    p = s.spawn("echo before; read line; echo got $line", stdin=True)
    _, offset = _read_until(s, p.pid, b"before\n")
    s.pause(mode="memory")
    back = ex.resume(s.id)
    try:
        kept = back.read_process(p.pid)
        assert (kept.stdout, kept.exited) == (b"before\n", False)
        back.send_stdin(p.pid, "it\n")
        out, _, last = _followed(back, p.pid)
        assert out[offset:] == b"got it\n" and last.exit_code == 0
    finally:
        back.close()


@only_on(
    "namespaces",
    reason=_on_namespaces("a files-mode resume is the same fresh kernel on every rung"),
)
def test_a_files_resume_starts_with_no_processes(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    p = s.spawn(["sleep", "600"])
    try:
        s.pause(mode="files")
    except PauseRefused as exc:
        s.close()
        pytest.skip(f"{rung}: no files-mode pause in this build ({exc})")
    back = ex.resume(s.id)
    try:
        assert back.processes() == []
        with pytest.raises(ProcessNotFound):
            back.read_process(p.pid)
    finally:
        back.close()
