"""Hundreds of runs of every kind leave nothing behind on the host.

Each kind of run is one way a program can end or misbehave: success, an exception, the wall-time
limit, the memory limit, a fork bomb at the process cap, an output flood, background processes
(a child, and a double-forked daemon in its own session) left running at exit, and exports.
Afterwards the host is searched for what a sandbox could leave behind:

* processes: everything a run starts carries a unique marker in its command line; none may be
  alive, and no bwrap (or workspace helper) naming the runs directory may be alive either;
* reaping: the supervisor (this process, as root) has no unreaped child;
* descriptors: the supervisor holds no more descriptors than before the runs;
* cgroups: no run cgroup of this supervisor's owner tag under ``sandcell/`` in any controller;
* mounts: no workspace tmpfs below the runs directory, in any process's mount namespace;
* files: the runs directory holds nothing but ``etc`` and empty owner directories.

As root the runs go through one in-process :class:`Executor` on a thread pool, which also
exercises concurrent runs; as an ordinary user each run is its own ``sandcell run`` process.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from conftest import UnprivEnv, run_as_user, settle_pools
from sandcell import Executor, IsolationMode, Limits, RunRequest
from sandcell.backends.host import workspace
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.backends.namespaces.spare_cgroup import SpareCgroup
from sandcell.spec import MiB, Outcome

from .hostscan import (
    cgroups_of,
    describe,
    live_procs_matching,
    mounts_under_anywhere,
    open_fds,
    runs_dir_leftovers,
    unreaped_sandboxes,
    wait_until,
)

pytestmark = pytest.mark.slow

ROOT_RUNS_PER_KIND = 25
USER_RUNS_PER_KIND = 4


@dataclass(frozen=True)
class Kind:
    """One way a run ends. ``code`` is formatted with ``marker``."""

    name: str
    code: str
    expect: frozenset[str]
    limits: Mapping[str, float] = field(default_factory=dict)
    exports: tuple[str, ...] = ()


# A fork bomb whose every process carries the marker: each child re-executes the bomb script.
_BOMB = """
import os, sys, time
src = '''
import os, sys, time
while True:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.005)
        continue
    if pid == 0:
        try:
            os.execv(sys.executable, [sys.executable, sys.argv[0], sys.argv[1]])
        finally:
            os._exit(1)
'''
with open("bomb.py", "w") as f:
    f.write(src)
os.execv(sys.executable, [sys.executable, os.path.abspath("bomb.py"), "{marker}"])
"""

_BACKGROUND = """
import os, subprocess, sys
# A plain child, in a session of its own, still running when the program exits.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", "{marker}"],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# A classic daemon: double fork, setsid, reparented away from the program.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)",
                                  "{marker}-daemon"])
    os._exit(0)
os.wait()
print("left them running")
"""

_MEMORY = """
b = bytearray(200 * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1
print("allocated", len(b))
"""

_EXPORTS = """
import os
os.makedirs("out", exist_ok=True)
with open("out/result.txt", "w") as f:
    f.write("answer {marker}\\n")
with open("out/data.bin", "wb") as f:
    f.write(os.urandom(50000))
print("wrote")
"""

KINDS: tuple[Kind, ...] = (
    Kind(name="ok", code="print('ok', sum(range(1000)))", expect=frozenset({"ok"})),
    Kind(name="error", code="raise ValueError('boom')", expect=frozenset({"error"})),
    Kind(
        name="timeout",
        code="import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)', '{marker}'])\n"
        "time.sleep(30)\n",
        expect=frozenset({"timeout"}),
        limits={"wall_time_s": 0.5},
    ),
    Kind(
        name="memory",
        code=_MEMORY,
        expect=frozenset({"memory_limit"}),
        limits={"memory_mb": 64},
    ),
    Kind(
        name="fork_bomb",
        code=_BOMB,
        expect=frozenset({"timeout"}),
        limits={"max_pids": 16, "wall_time_s": 1.0},
    ),
    Kind(
        name="flood",
        code="import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
        expect=frozenset({"output_limit"}),
        limits={"stdout_bytes": 100_000},
    ),
    Kind(name="background", code=_BACKGROUND, expect=frozenset({"ok"})),
    Kind(name="exports", code=_EXPORTS, expect=frozenset({"ok"}), exports=("out/*",)),
)


def _limits(raw: Mapping[str, float]) -> Limits:
    conv: dict[str, float] = {}
    for key, value in raw.items():
        if key == "memory_mb":
            conv["memory_bytes"] = int(value * MiB)
        else:
            conv[key] = value
    return Limits().with_(**conv)


_CLI_FLAGS = {
    "wall_time_s": "--timeout",
    "memory_mb": "--memory",
    "max_pids": "--pids",
    "stdout_bytes": "--max-stdout",
}


def _cli_args(kind: Kind, code: str, mode: IsolationMode) -> list[str]:
    args = ["run", "--json", "--profile", "unchecked", "-c", code]
    if mode is IsolationMode.RLIMITS:
        args.insert(1, "--isolation=rlimits")
    for key, value in kind.limits.items():
        args += [_CLI_FLAGS[key], str(value)]
    for glob in kind.exports:
        args += ["--export", glob]
    return args


def _schedule(per_kind: int) -> list[Kind]:
    """Kinds interleaved, so concurrent runs mix."""
    return [k for _ in range(per_kind) for k in KINDS]


def _assert_clean(runs: Path, marker: str, owner: str | None) -> None:
    """Nothing of any run is left: processes, mounts, cgroups, files."""
    gone = wait_until(lambda: not live_procs_matching(marker, str(runs)), timeout=5)
    assert gone, "processes outlived their runs:\n" + describe(
        live_procs_matching(marker, str(runs))
    )
    mounts = mounts_under_anywhere(runs)
    assert not mounts, f"workspace mounts left below {runs}: {mounts}"
    if owner is not None:
        # Spare groups waiting in the suite's other live executors are not left by these runs.
        waiting = SpareCgroup.waiting_anywhere()
        groups = [g for g in cgroups_of(owner) if g.name not in waiting]
        assert not groups, f"cgroups left by supervisor {owner}: {groups}"
    assert not runs_dir_leftovers(runs), f"left in {runs}: {runs_dir_leftovers(runs)}"


def _run_fds() -> list[str]:
    """This process's descriptors but those held for spawners waiting in spare cgroups (see
    ``spawner.py``): once every open executor's spare is made, so that none is half made."""
    assert wait_until(SpareCgroup.settled_anywhere, timeout=10), "a spare cgroup was not made"
    held = SpareCgroup.held_fds_anywhere()
    return [fd for fd in open_fds() if int(fd.partition(" ")[0]) not in held]


def test_root_runs_leave_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root; this test run is not root")
    runs = tmp_path / "runs"
    monkeypatch.setenv("SANDCELL_RUNS", str(runs))
    marker = f"sandcell-leak-{uuid.uuid4().hex}"
    owner = workspace.owner_tag()
    schedule = _schedule(ROOT_RUNS_PER_KIND)

    with Executor(home=tmp_path / "home", profile="unchecked") as ex:

        def one(kind: Kind) -> tuple[str, str]:
            res = ex.run(
                RunRequest(
                    code=kind.code.format(marker=marker),
                    limits=_limits(kind.limits),
                    exports=kind.exports,
                )
            )
            if kind.name == "exports" and res.outcome is Outcome.OK:
                assert sorted(a.path for a in res.artifacts) == ["out/data.bin", "out/result.txt"]
            return kind.name, res.outcome.value

        one(KINDS[0])  # warm up, so lazily opened descriptors (the audit log) exist before
        settle_pools(request.getfixturevalue("ladder_executors"))
        assert isinstance(ex.backend, NamespacesBackend)
        ex.backend.wait_idle()
        fds_before = _run_fds()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(one, schedule))
        elapsed = time.monotonic() - t0
        # Each run's sandbox is torn down after its result, on a background thread.
        assert isinstance(ex.backend, NamespacesBackend)
        ex.backend.wait_idle()
        fds_after = _run_fds()
        audit_count = ex.audit.count()

    tally = Counter(results)
    unexpected = {
        (name, outcome): n
        for (name, outcome), n in tally.items()
        if outcome not in next(k for k in KINDS if k.name == name).expect
    }
    with capsys.disabled():
        print(
            f"\n[leaks/root] {len(schedule)} runs in {elapsed:.1f} s "
            f"({len(schedule) / elapsed:.1f} runs/s); outcomes: {dict(sorted(tally.items()))}"
        )
    assert not unexpected, f"unexpected outcomes: {unexpected}"
    assert audit_count == len(schedule) + 1

    _assert_clean(runs, marker, owner)
    # The supervisor reaped every bwrap it started and kept no descriptor of any run.
    unreaped = unreaped_sandboxes(os.getpid())
    assert not unreaped, "unreaped children of the supervisor:\n" + describe(unreaped)
    assert fds_after == fds_before, (
        f"descriptors leaked: {sorted(set(fds_after) - set(fds_before))}"
    )
    assert not (runs / owner).exists() or not any((runs / owner).iterdir())


@pytest.mark.unprivileged
def test_user_runs_leave_nothing(unpriv: UnprivEnv, capsys: pytest.CaptureFixture[str]) -> None:
    runs = unpriv.runs.parent / f"leak-runs-{uuid.uuid4().hex[:8]}"
    runs.mkdir(mode=0o700)
    shutil.chown(runs, unpriv.user, unpriv.user)
    env = replace(unpriv, runs=runs)
    marker = f"sandcell-leak-{uuid.uuid4().hex}"
    schedule = _schedule(USER_RUNS_PER_KIND)

    tally: Counter[tuple[str, str]] = Counter()
    t0 = time.monotonic()
    for kind in schedule:
        proc = run_as_user(env, _cli_args(kind, kind.code.format(marker=marker), env.mode))
        try:
            outcome = str(json.loads(proc.stdout)["outcome"])
        except (json.JSONDecodeError, KeyError):
            outcome = f"no JSON (exit {proc.returncode}): {proc.stderr.decode(errors='replace')}"
        tally[(kind.name, outcome)] += 1
    elapsed = time.monotonic() - t0
    with capsys.disabled():
        print(
            f"\n[leaks/user {env.mode.value}] {len(schedule)} runs in {elapsed:.1f} s; "
            f"outcomes: {dict(sorted(tally.items()))}"
        )
    unexpected = {
        (name, outcome): n
        for (name, outcome), n in tally.items()
        if outcome not in next(k for k in KINDS if k.name == name).expect
    }
    assert not unexpected, f"unexpected outcomes: {unexpected}"

    _assert_clean(runs, marker, owner=None)
    # Each CLI process leaves its (empty) owner directory; the next start sweeps it, so at most
    # the last one is there.
    owners = [p for p in runs.iterdir() if p.name != "etc"]
    assert len(owners) <= 1, f"owner directories of dead supervisors were not swept: {owners}"
