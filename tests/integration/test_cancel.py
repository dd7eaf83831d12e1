"""``Executor.cancel_all`` from another thread ends a busy run as killed, leaving nothing behind.

Both cold paths are tried: with the run's cgroup (strict), and without cgroups (rlimits), where
the workspace helper runs the sandbox and only the sandbox init is there to kill.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from sandcell import Executor, IsolationMode, Limits, RunRequest
from sandcell.backends.host import workspace
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.backends.namespaces.spare_cgroup import SpareCgroup
from sandcell.spec import Outcome, RunResult

from .hostscan import (
    cgroups_of,
    describe,
    live_procs_matching,
    mounts_under_anywhere,
    runs_dir_leftovers,
    unreaped_sandboxes,
    wait_until,
)


@pytest.mark.parametrize(
    "mode", [IsolationMode.STRICT, IsolationMode.RLIMITS], ids=["cgroup", "helper"]
)
def test_cancel_all_ends_a_busy_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: IsolationMode
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root; this test run is not root")
    runs = tmp_path / "runs"
    monkeypatch.setenv("SANDCELL_RUNS", str(runs))
    marker = f"sandcell-cancel-{uuid.uuid4().hex}"
    # The busy loop carries the marker on its command line, so the host can see it run and end.
    code = (
        "import os, sys\n"
        f"os.execv(sys.executable, [sys.executable, '-c', 'while True: pass', {marker!r}])\n"
    )
    request = RunRequest(code=code, mode=mode, limits=Limits(wall_time_s=120, cpu_time_s=120))
    results: list[RunResult] = []

    with Executor(home=tmp_path / "home", profile="unchecked") as ex:
        assert isinstance(ex.backend, NamespacesBackend)
        assert ex.cancel_all("nothing to cancel") == 0
        worker = threading.Thread(target=lambda: results.append(ex.run(request)))
        worker.start()
        try:
            started = wait_until(lambda: bool(live_procs_matching(marker)), timeout=60)
            assert started, "the busy loop never started"
            assert ex.backend.runs.in_flight() != ()
            assert ex.cancel_all("the test is over") == 1
        finally:
            # Whatever failed above, do not leave the loop running for its wall time.
            while worker.is_alive():
                ex.cancel_all("the test failed")
                worker.join(0.5)
        assert ex.backend.runs.in_flight() == ()
        records = ex.audit.list(limit=10)

    (res,) = results
    assert res.outcome is Outcome.KILLED, res.reason
    assert res.reason == "cancelled: the test is over"
    assert [r.record["outcome"] for r in records] == ["killed"]

    # Nothing is left: processes, bwrap children, mounts, cgroups, run directories.
    gone = wait_until(lambda: not live_procs_matching(marker, str(runs)), timeout=5)
    assert gone, "processes outlived the run:\n" + describe(live_procs_matching(marker, str(runs)))
    unreaped = unreaped_sandboxes(os.getpid())
    assert not unreaped, "unreaped children of the supervisor:\n" + describe(unreaped)
    assert not mounts_under_anywhere(runs)
    # Spare groups waiting in the suite's other live executors are not this run's.
    waiting = SpareCgroup.waiting_anywhere()
    assert not [g for g in cgroups_of(workspace.owner_tag()) if g.name not in waiting]
    assert not runs_dir_leftovers(runs), runs_dir_leftovers(runs)
