"""A cold run's bwrap is born in the run's cgroup, also when no spare group was waiting; so is
a session's.

bwrap started outside the group and its sandbox moved in afterwards left a window: a supervisor
SIGKILLed between bwrap's clone and the move took the outer bwrap with it (``--die-with-parent``)
and left the inner one, pid 1 of the sandbox, in no cgroup, waiting forever for a parent that was
gone (found after a soak fault test; reproduced by killing the supervisor as soon as its inner
bwrap appeared). Born in the group, every process of the sandbox, bwrap included, is where the
sweep of a dead supervisor's groups kills it. The window itself is a few instructions wide; what
is checked is what closes it: bwrap is in the group from the start.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandcell import Executor, Outcome, RunRequest
from sandcell.backends.host import cgroups, workspace

from .hostscan import children_of, waiting_in_a_pool


def _in_a_run_group(pid: int) -> bool:
    """Whether ``pid`` sits in a run cgroup of this process (named after its owner tag)."""
    try:
        groups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return f"/{workspace.owner_tag()}." in groups


def _run_bwraps() -> list[tuple[str, bool]]:
    """This process's bwraps of runs and sessions, each with whether it is in a run group: not
    the warm templates', jailed VMs' or pooled wasm sandboxes' that the suite's session-wide
    executors keep."""
    return [
        (p.comm, _in_a_run_group(p.pid))
        for p in children_of(os.getpid())
        if p.comm == "bwrap" and not p.zombie and not waiting_in_a_pool(p.cmdline)
    ]


def test_a_cold_run_without_a_spare_starts_bwrap_in_its_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("as an ordinary user the workspace helper starts bwrap; this is root's path")
    if not isinstance(cgroups.detect(), cgroups.CgroupHost):
        pytest.skip("this host has no usable cgroups: there is no group to be born in")
    seen: list[tuple[str, bool]] = []
    # A fresh executor: its first cold run finds no spare group made ahead.
    with Executor(home=tmp_path / "home", profile="unchecked") as ex:

        def listen(stream: str, text: str) -> None:
            if "up" in text and not seen:
                seen.extend(_run_bwraps())
                ex.backend.cancel_all("seen")

        result = ex.run(
            RunRequest(code="import time\nprint('up', flush=True)\ntime.sleep(60)"),
            on_output=listen,
        )
    assert result.outcome is Outcome.KILLED, result.reason
    assert seen == [("bwrap", True)]


def test_a_sessions_bwrap_is_born_in_its_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("as an ordinary user the workspace helper starts bwrap; this is root's path")
    if not isinstance(cgroups.detect(), cgroups.CgroupHost):
        pytest.skip("this host has no usable cgroups: there is no group to be born in")
    with (
        Executor(home=tmp_path / "home", profile="unchecked") as ex,
        ex.session() as s,
    ):
        assert s.run("x = 41").outcome is Outcome.OK
        bwraps = _run_bwraps()
        # The kernel sees its group's limits, bwrap's process aside: a cell still runs.
        assert s.run("print(x + 1)").stdout == "42\n"
    assert bwraps == [("bwrap", True)]
