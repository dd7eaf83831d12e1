"""A session's limits on every rung: memory, CPU time, the idle timeout and the maximum
lifetime are the whole session's, not a cell's, and reaching one ends the session and leaves
nothing on the host. Outcomes and leftovers are asserted, never how long anything took."""

from __future__ import annotations

import time
from typing import Any

import pytest
from tests.contract.sessions.rungs import only_on, open_session
from tests.contract.sessions.traces import trace
from tests.integration import hostscan

from sandcell import Executor, Limits, Outcome
from sandcell.sessions import Session, SessionEnded
from sandcell.spec import MiB

MEMORY = {
    "namespaces": (160, 100, 100),
    # gVisor's sandbox (its Sentry and gofer) is charged to the same cgroup: more room, and a
    # second allocation that cannot fit beside the first.
    "gvisor": (256, 120, 160),
    "microvm": (160, 100, 100),
    # The wasm rung's limit is the Wasm heap's maximum (the limit less what Node and Pyodide's
    # compiled code take, plan.INTERPRETER_RESERVE): 400 MiB leaves a heap of 240 MiB.
    "wasm": (400, 100, 160),
}
"""Per rung: the session's memory limit, then what the first cell keeps and the second adds, MiB."""

LIFETIME_WITH_A_CELL_S = {"namespaces": 3, "wasm": 4, "gvisor": 4, "microvm": 8}
"""A lifetime long enough for the session to open and its cell to start (a pooled microVM opens
in about a second under emulation, a wasm kernel in about a second, a gVisor sandbox in a
fraction of one)."""


def _wait_ended(s: Session, timeout: float = 90) -> str:
    assert hostscan.wait_until(lambda: s.ended is not None, timeout=timeout), "session alive"
    assert s.ended is not None
    return s.ended


def test_memory_limit_is_the_sessions(rung: str, ex: Executor) -> None:
    limit, kept_mib, more_mib = MEMORY[rung]
    s = open_session(ex, limits=Limits(memory_bytes=limit * MiB))
    host = trace(rung, s)
    kept = s.run(f"a = b'1' * ({kept_mib} * 1024 * 1024)\nprint(len(a))")
    assert kept.outcome is Outcome.OK, kept.reason
    # Alone this fits the limit; on top of the first cell's memory it does not.
    more = s.run(f"b = b'2' * ({more_mib} * 1024 * 1024)")
    assert more.outcome is Outcome.MEMORY_LIMIT, (more.reason, more.stderr)
    assert "session" in more.reason
    if rung == "wasm":
        # The heap's maximum refused the allocation inside the interpreter: a MemoryError in the
        # cell, and the session goes on with what it kept.
        assert s.ended is None, s.ended
        after = s.run("print(len(a))")
        assert (after.outcome, after.stdout) == (Outcome.OK, f"{kept_mib * MiB}\n"), after.reason
        s.close()
    elif rung == "namespaces" and s.ended is None:
        # Under cgroups the kernel is killed and the session ends (below); in the rlimits mode
        # the kernel only saw its allocation refused (RLIMIT_AS), and the session is kept.
        s.close()
    else:
        assert "ended" in more.reason and s.ended is not None
    host.assert_gone()


def test_cpu_time_limit_is_the_sessions(rung: str, ex: Executor) -> None:
    s = open_session(ex, limits=Limits(cpu_time_s=2, wall_time_s=60))
    host = trace(rung, s)
    first = s.run("import time\nt = time.process_time()\nwhile time.process_time() - t < .5: pass")
    assert first.outcome is Outcome.OK, first.reason
    # Its own wall-time limit is far away; the session's CPU time ends it (gVisor ignores
    # RLIMIT_CPU: the host enforces it there).
    burn = s.run("while True:\n    pass", timeout_s=60)
    assert burn.outcome is Outcome.TIMEOUT, burn.reason
    assert "CPU-time limit of 2 s for the session" in burn.reason
    assert s.ended is not None
    host.assert_gone()


ONE_RUNG_FOR_THE_SESSIONS_CLOCK = (
    "the session's own clock (its watchdog, the same code on every rung) is what this checks, "
    "at seconds of waiting per rung; each rung's end of a session is checked by the tests beside "
    "it, and the microVM's strict session (test_lifecycle.py) boots cold for real, longer than "
    "its idle timeout"
)


@only_on(
    "namespaces", "gvisor",
    reason="test_lifecycle.py's denied-cells test checks the idle end on the microVM, after a "
    "real cold boot longer than its idle timeout",
)  # fmt: skip
def test_idle_timeout_ends_the_session(rung: str, ex: Executor) -> None:
    s = open_session(ex, idle_timeout_s=1)
    host = trace(rung, s)
    s.run("w = 1")
    assert "idle" in _wait_ended(s)
    with pytest.raises(SessionEnded, match="idle"):
        s.run("print(w)")
    host.assert_gone()


@only_on("namespaces", reason=ONE_RUNG_FOR_THE_SESSIONS_CLOCK)
def test_idle_time_starts_when_the_sandbox_is_up(
    rung: str, ex: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A start longer than the idle timeout (a microVM booting cold under emulation takes
    # seconds), made so here by delaying the real sandbox's start: the session must still take
    # its first cell, not end idle the moment it opens.
    from sandcell.backends.cell import CellSandbox, open_cell_sandbox

    def slow_sandbox(*args: Any, **kwargs: Any) -> CellSandbox:
        sandbox = open_cell_sandbox(*args, **kwargs)
        start = sandbox.start

        def slow_start() -> None:
            time.sleep(2.5)
            start()

        monkeypatch.setattr(sandbox, "start", slow_start)
        return sandbox

    # Where the session looks it up, so the delay is the same whatever the rung.
    monkeypatch.setattr("sandcell.sessions.session.open_cell_sandbox", slow_sandbox)
    s = open_session(ex, idle_timeout_s=2)
    host = trace(rung, s)
    time.sleep(0.5)  # the caller does something else first; the session is up, not yet idle
    first = s.run("print('up')")
    assert (first.outcome, first.stdout) == (Outcome.OK, "up\n"), first.reason
    assert "idle" in _wait_ended(s)
    host.assert_gone()


def test_max_lifetime_ends_a_running_cell(rung: str, ex: Executor) -> None:
    s = open_session(ex, max_lifetime_s=LIFETIME_WITH_A_CELL_S[rung])
    host = trace(rung, s)
    cell = s.run("import time\ntime.sleep(120)", timeout_s=120)
    assert cell.outcome is Outcome.TIMEOUT
    assert "maximum lifetime" in cell.reason
    assert s.ended is not None
    host.assert_gone()


@only_on("namespaces", reason=ONE_RUNG_FOR_THE_SESSIONS_CLOCK)
def test_max_lifetime_ends_an_idle_session(rung: str, ex: Executor) -> None:
    s = open_session(ex, max_lifetime_s=2, idle_timeout_s=600)
    host = trace(rung, s)
    assert "maximum lifetime" in _wait_ended(s)
    host.assert_gone()
