"""A waiting pooled sandbox is two processes, and the end of its template ends every sandbox.

The template forks a child that makes the run's namespaces and forks the run's pid 1; that child
exits at once, so a sandbox waits as pid 1 and the program's process it armed (each a copy of
the template's image: a third would cost its private pages and page tables in every waiting
sandbox). No process of a run then waits to pass a parent-death signal on: the template is pid 1
of the pid namespace every run's own is nested in, so its end must kill them all, waiting or
running, which these tests check with real sandboxes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandcell import Executor, Limits, RunRequest, RunResult, WarmConfig
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.backends.warm import WarmStats
from sandcell.spec import Outcome

POOL = 2


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Executor]:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor fixture runs as root; this test run is not root")
    warm = WarmConfig(mode="pool", preload=(), pool_size=POOL)
    with Executor(home=tmp_path / "home", profile="unchecked", warm=warm) as ex:
        yield ex


def _stats(ex: Executor) -> WarmStats:
    backend = ex.backend
    assert isinstance(backend, NamespacesBackend)
    stats = backend.warm_stats()
    assert stats is not None and stats.template_pid is not None
    return stats


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def _nspid(pid: int) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return line.split()[1:]
    return []


def _alive(pid: int) -> bool:
    """Running or stopped, not a zombie: a process of the run that could still act."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened within {timeout_s} s: {what}")
        time.sleep(0.02)


def _full(ex: Executor) -> bool:
    pool = _stats(ex).pool
    return pool is not None and pool.ready >= POOL


def _sandboxes_of(template: int) -> dict[int, list[int]]:
    """Each process the template forked, with its own children."""
    return {pid: _children(pid) for pid in _children(template)}


def test_a_waiting_sandbox_is_its_pid_1_and_the_program(pool: Executor) -> None:
    _wait_for("the pool is full", lambda: _full(pool))
    template = _stats(pool).template_pid
    assert template is not None

    def only_pid_1s_each_with_its_program() -> bool:
        sandboxes = _sandboxes_of(template)
        return len(sandboxes) == POOL and all(
            _nspid(pid)[-1] == "1" and len(kids) == 1 for pid, kids in sandboxes.items()
        )

    # A refill that was under way may still show its forked child for a moment.
    _wait_for("every child of the template is a waiting pid 1", only_pid_1s_each_with_its_program)
    pool_stats = _stats(pool).pool
    assert pool_stats is not None and pool_stats.idle_pss_bytes > 0


def test_the_end_of_the_template_ends_waiting_and_running_sandboxes(pool: Executor) -> None:
    _wait_for("the pool is full", lambda: _full(pool))
    stats = _stats(pool)
    template = stats.template_pid
    assert template is not None and stats.pool is not None
    taken = stats.pool.taken
    results: list[RunResult] = []
    # Its wall limit (the profile's ceiling) is well past the waits below: only the template's
    # end can end it in time.
    request = RunRequest(code="import time\ntime.sleep(600)\n", limits=Limits(wall_time_s=120))
    runner = threading.Thread(target=lambda: results.append(pool.run(request)), daemon=True)
    runner.start()

    def running_and_refilled() -> bool:
        st = _stats(pool).pool
        return st is not None and st.taken > taken and st.ready >= POOL

    _wait_for("a run took a sandbox and the pool refilled", lambda: running_and_refilled())
    # Every sandbox of the template: the running one and those waiting.
    processes = [p for pid, kids in _sandboxes_of(template).items() for p in (pid, *kids)]
    assert len(processes) >= 2 * (POOL + 1), processes
    os.kill(template, signal.SIGKILL)
    _wait_for(
        "every process of every sandbox is gone",
        lambda: not any(_alive(p) for p in processes),
    )
    runner.join(timeout=60)
    assert not runner.is_alive(), "the run outlived its template"
    assert results and results[0].outcome is not Outcome.OK, results
