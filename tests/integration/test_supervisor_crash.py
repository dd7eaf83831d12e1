"""A supervisor killed with SIGKILL mid-run leaves nothing that the next start does not sweep.

The supervisor runs a program that starts a marked background child and sleeps for a minute; once
the marked child is alive, the supervisor gets SIGKILL (no handler, no ``finally``). What must hold:

* right away, without anyone's help, every sandboxed process dies: bwrap runs with
  ``--die-with-parent``, and as an ordinary user the workspace helper between the supervisor and
  bwrap dies with the supervisor too (its parent-death signal), taking its mount namespace, and so
  the workspace tmpfs, with it;
* what is left is inert: as root, the run directory, the workspace tmpfs and the neutral view's
  read-only overlays mounted on the host under it, and the run's (empty) cgroups; as an
  ordinary user, the run directory only;
* the next start of sandcell (an :class:`Executor`, or any ``sandcell run``) removes all of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import UnprivEnv, run_as_user
from sandcell import Executor, IsolationMode

from .hostscan import (
    Proc,
    alive,
    cgroups_of,
    children_of,
    describe,
    live_procs_matching,
    mounts_under,
    mounts_under_anywhere,
    owner_tag_of,
    pid_namespace_members,
    wait_until,
)

pytestmark = pytest.mark.slow

# The sandboxed program. The marker is assembled at run time, so it is in no command line but
# the background child's (not the supervisor's, which holds the program text as `-c` as a user).
_PROGRAM = """
import subprocess, sys, time
marker = {head!r} + {tail!r}
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", marker])
print("started", flush=True)
time.sleep(60)
"""

# The root supervisor: an Executor in a process of its own (SANDCELL_RUNS/HOME from the env).
_SUPERVISOR = textwrap.dedent(
    """
    import os
    from sandcell import Executor, Limits, RunRequest
    with Executor(profile="unchecked") as ex:
        ex.run(RunRequest(code=os.environ["CRASH_PROGRAM"],
                          limits=Limits().with_(wall_time_s=120)))
    """
)


def _program(marker: str) -> str:
    return _PROGRAM.format(head=marker[:9], tail=marker[9:])


def _kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_for_sandbox(marker: str, sup: subprocess.Popen[bytes]) -> Proc:
    found: list[Proc] = []

    def ready() -> bool:
        found[:] = live_procs_matching(marker)
        return bool(found) or sup.poll() is not None

    assert wait_until(ready, timeout=60), "the sandbox did not start within 60 s"
    if not found:
        _, err = sup.communicate(timeout=10)
        raise AssertionError(f"the supervisor exited ({sup.returncode}) early: {err.decode()}")
    return found[0]


def _report(capsys: pytest.CaptureFixture[str], title: str, lines: Sequence[str]) -> None:
    with capsys.disabled():
        print(f"\n[crash/{title}]\n  " + "\n  ".join(lines))


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    """Pids this test started (directly or in its sandbox): killed if a failed test left them."""
    pids: list[int] = []
    yield pids
    _kill_pids(pids)


def test_root_supervisor_sigkill(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cleanup: list[int],
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root supervisor case needs root")
    runs, home = tmp_path / "runs", tmp_path / "home"
    marker = f"sandcell-crash-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "SANDCELL_RUNS": str(runs),
        "SANDCELL_HOME": str(home),
        "CRASH_PROGRAM": _program(marker),
    }
    sup = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    cleanup.append(sup.pid)
    child = _wait_for_sandbox(marker, sup)
    owner = owner_tag_of(sup.pid)
    sandbox = pid_namespace_members(child.pid)
    bwraps = [p for p in children_of(sup.pid) if p.comm == "bwrap"]
    doomed = sorted({p.pid for p in [*sandbox, *bwraps]})
    cleanup.extend(doomed)
    assert bwraps, "no bwrap under the supervisor"
    assert len(sandbox) >= 3, "expected the sandbox init, the program and the marked child"
    assert cgroups_of(owner), "the run has no cgroup while it runs"

    sup.send_signal(signal.SIGKILL)
    sup.communicate(timeout=10)

    # 1. Every sandboxed process dies by itself (bwrap --die-with-parent, the pid namespace).
    died = wait_until(lambda: not any(alive(pid) for pid in doomed), timeout=5)
    survivors = [p for p in live_procs_matching(marker, str(runs)) if p.pid != sup.pid]
    assert died and not survivors, "the sandbox outlived its supervisor:\n" + describe(survivors)

    # 2. What the dead supervisor left: its run directory, the tmpfs on the host, empty cgroups.
    run_dirs = sorted(p.name for p in (runs / owner).iterdir())
    mounts = mounts_under(runs)
    groups = cgroups_of(owner)
    _report(
        capsys,
        "root, after SIGKILL",
        [
            f"sandbox processes before the kill: {len(sandbox)} + {len(bwraps)} bwrap; "
            f"alive after: {len([pid for pid in doomed if alive(pid)])}",
            f"run directories of {owner}: {run_dirs}",
            f"mounts below the runs root: {mounts}",
            f"cgroups: {[str(g) for g in groups]}",
        ],
    )
    assert len(run_dirs) == 1
    # The workspace tmpfs and the read-only overlays of the neutral view, all in the run dir.
    run_dir = runs / owner / run_dirs[0]
    assert str(run_dir / "work") in mounts
    assert all(Path(m).is_relative_to(run_dir) for m in mounts), mounts
    assert groups, "expected the run's cgroups to remain until the sweep"
    for g in groups:
        assert (g / "cgroup.procs").read_text().split() == [], f"processes left in {g}"

    # 3. The next start sweeps all of it.
    monkeypatch.setenv("SANDCELL_RUNS", str(runs))
    with Executor(home=home):
        pass
    assert not (runs / owner).exists(), "the dead supervisor's run directory is still there"
    assert not mounts_under(runs), mounts_under(runs)
    assert not cgroups_of(owner), cgroups_of(owner)
    assert not live_procs_matching(marker)
    assert sorted(p.name for p in runs.iterdir()) == ["etc"]


@pytest.mark.unprivileged
def test_user_supervisor_sigkill(
    unpriv: UnprivEnv, capsys: pytest.CaptureFixture[str], cleanup: list[int]
) -> None:
    runs = unpriv.runs.parent / f"crash-runs-{uuid.uuid4().hex[:8]}"
    runs.mkdir(mode=0o700)
    shutil.chown(runs, unpriv.user, unpriv.user)
    env = replace(unpriv, runs=runs)
    marker = f"sandcell-crash-{uuid.uuid4().hex}"
    mode_args = ["--isolation=rlimits"] if env.mode is IsolationMode.RLIMITS else []
    cmd = [
        "runuser", "-u", env.user, "--", "env", "-i",
        "PATH=/usr/bin:/bin", f"HOME={env.home}", f"PYTHONPATH={env.pythonpath}",
        f"SANDCELL_HOME={env.home}", f"SANDCELL_RUNS={env.runs}",
        env.python, "-m", "sandcell",
        "run", *mode_args, "--json", "--profile", "unchecked", "--timeout", "120",
        "-c", _program(marker),
    ]  # fmt: skip
    runuser = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cleanup.append(runuser.pid)
    child = _wait_for_sandbox(marker, runuser)
    (sup,) = [p for p in children_of(runuser.pid) if not p.zombie]
    cleanup.append(sup.pid)
    owner = owner_tag_of(sup.pid)
    sandbox = pid_namespace_members(child.pid)
    helpers = [p for p in children_of(sup.pid) if "_mount_helper" in p.cmdline]
    # bwrap's arguments come through a memfd, so its command line names no path: find it as
    # the helper's child.
    bwraps = [p for h in helpers for p in children_of(h.pid) if p.comm == "bwrap"]
    doomed = sorted({p.pid for p in [*sandbox, *helpers, *bwraps]})
    cleanup.extend(doomed)
    assert len(helpers) == 1, "expected one workspace helper under the supervisor"
    assert bwraps, "no bwrap for the run"
    assert len(sandbox) >= 3, "expected the sandbox init, the program and the marked child"
    assert mounts_under_anywhere(runs), "the workspace tmpfs is not mounted while the run runs"

    os.kill(sup.pid, signal.SIGKILL)
    runuser.communicate(timeout=10)

    # 1. The helper dies with the supervisor; bwrap dies with the helper; the sandbox with bwrap;
    #    the tmpfs with the helper's mount namespace.
    died = wait_until(lambda: not any(alive(pid) for pid in doomed), timeout=5)
    survivors = live_procs_matching(marker, str(runs))
    _report(
        capsys,
        f"user ({env.mode.value}), after SIGKILL",
        [
            f"before the kill: helper {[p.pid for p in helpers]}, bwrap {[p.pid for p in bwraps]}"
            f", {len(sandbox)} sandbox processes",
            f"alive after: {[pid for pid in doomed if alive(pid)]}",
            f"mounts below the runs root (any namespace): {mounts_under_anywhere(runs)}",
            f"run directories of {owner}: {sorted(p.name for p in (runs / owner).iterdir())}",
        ],
    )
    assert died and not survivors, "the run outlived its supervisor:\n" + describe(survivors)
    assert not mounts_under_anywhere(runs), mounts_under_anywhere(runs)
    # 2. Left behind: the run directory (a plain directory; the tmpfs went with the helper).
    assert len(list((runs / owner).iterdir())) == 1

    # 3. The next start, any `sandcell run` of this user, sweeps it.
    after = run_as_user(env, ["run", *mode_args, "--json", "-c", "print('next')"])
    assert after.returncode == 0, after.stderr.decode()
    assert not (runs / owner).exists(), "the dead supervisor's run directory was not swept"
    assert not live_procs_matching(marker, str(runs))
    assert not mounts_under_anywhere(runs)
    left = [p for p in runs.iterdir() if p.name != "etc"]
    assert all(not any(p.iterdir()) for p in left), left
