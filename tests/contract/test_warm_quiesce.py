"""Warm runs end in a frozen sandbox: once the program's process says it ended, pid 1 reports it,
the host freezes the run's cgroup (v1 freezer or v2 ``cgroup.freeze``), reads the result and the
exports while nothing of the run can move, and destroys the sandbox after the result returned.

Each test checks a promise of that path with real sandboxes: a frozen group writes nothing and
is destroyed; a process a run left behind cannot change what is exported; the program's own exit
code, its atexit handlers and a death by signal are reported as a cold run would report them; a
later run sees nothing of an earlier one; closing the executor leaves no process or cgroup.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.escapes.conftest import processes_with

from sandcell import Executor, Limits, RunRequest, RunResult, WarmConfig
from sandcell.backends.host import cgroups, workspace
from sandcell.backends.namespaces import NamespacesBackend


def _freezer_host() -> cgroups.CgroupHost:
    if os.geteuid() != 0:
        pytest.skip("needs root: run cgroups are created under the root hierarchy")
    host = cgroups.detect()
    if not isinstance(host, cgroups.CgroupHost):
        pytest.skip(f"no cgroups here: {host.reason}")
    if host.version == 1 and host.freezer is None:
        pytest.skip("cgroup v1 without a writable freezer controller")
    return host


class _FreezeSpy:
    """Counts the freezes that succeeded (the real freeze runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.frozen = 0
        real = cgroups.RunCgroup.freeze

        def freeze(group: cgroups.RunCgroup, timeout_s: float = 1.0) -> bool:
            ok = real(group, timeout_s)
            self.frozen += ok
            return ok

        monkeypatch.setattr(cgroups.RunCgroup, "freeze", freeze)


@pytest.fixture
def pool_executor(tmp_path: Path) -> Iterator[Executor]:
    _freezer_host()
    warm = WarmConfig(mode="pool", preload=(), pool_size=2)
    with Executor(home=tmp_path / "home", profile="unchecked", warm=warm) as ex:
        yield ex


def _run(ex: Executor, code: str, **kw: Any) -> RunResult:
    r = ex.run(RunRequest(code=textwrap.dedent(code).strip() + "\n", **kw))
    assert r.start is not None and r.start.mode == "pool", r
    return r


def _starter_groups(ex: Executor) -> list[Path]:
    backend = ex.backend
    assert isinstance(backend, NamespacesBackend)
    stats = backend.warm_stats()
    assert stats is not None
    host = cgroups.detect()
    assert isinstance(host, cgroups.CgroupHost)
    return [d for _c, d in cgroups.stale_groups(host) if d.name.startswith(stats.cgroup_prefix)]


def test_a_frozen_group_writes_nothing_and_is_destroyed(tmp_path: Path) -> None:
    host = _freezer_host()
    group = cgroups.RunCgroup(
        host, f"{workspace.owner_tag()}.quiesce-{secrets.token_hex(6)}", freezer=True
    )
    group.create(())
    ticks = tmp_path / "ticks"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
            "while True:\n"
            "    os.write(fd, b'tick\\n')\n",
            str(ticks),
        ]
    )
    try:
        group.attach(writer.pid)
        deadline = time.monotonic() + 10
        while (not ticks.exists() or ticks.stat().st_size == 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ticks.stat().st_size > 0, "the writer never wrote: the check would prove nothing"
        assert group.freeze(timeout_s=5), "the group did not freeze"
        size = ticks.stat().st_size
        time.sleep(0.3)  # a running writer appends thousands of lines in this time
        assert ticks.stat().st_size == size, "a frozen process kept writing"
        assert writer.poll() is None, "the frozen writer is gone before it was killed"
        group.kill_all()
        assert writer.wait(timeout=10) == -9, "the frozen writer was not killed"
    finally:
        if writer.poll() is None:
            writer.kill()
            group.thaw()
            writer.wait()
    assert group.remove(), "the killed group could not be removed"
    assert not any(d.exists() for d in group.dirs.values()), group.dirs


def test_a_process_left_behind_cannot_change_the_exports(
    pool_executor: Executor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A background writer still appending when the program ends: the export is read while it
    is frozen (whole lines, the stored copy matches its hash), and it is gone after close."""
    spy = _FreezeSpy(monkeypatch)
    marker = f"sandcell-quiesce-{secrets.token_hex(6)}"
    code = f"""
        import os, time
        os.makedirs("out")
        if os.fork() == 0:
            os.execv("/bin/sh", ["{marker}", "-c", "while :; do echo tick >> out/late.txt; done"])
        for _ in range(1000):
            if os.path.exists("out/late.txt") and os.path.getsize("out/late.txt") > 0:
                break
            time.sleep(0.01)
        print("{marker} writer seen", os.path.getsize("out/late.txt") > 0)
        """
    r = _run(pool_executor, code, exports=("out/*",), limits=Limits().with_(wall_time_s=20))
    assert r.outcome.value == "ok", r
    assert f"{marker} writer seen True" in r.stdout, r
    assert spy.frozen == 1, "the result was not read from a frozen sandbox"
    (late,) = [a for a in r.artifacts if a.path == "out/late.txt"]
    (stored,) = pool_executor.store.copy_out([late], tmp_path / "copied")
    data = stored.read_bytes()
    assert len(data) == late.size and hashlib.sha256(data).hexdigest() == late.sha256
    assert data and data == b"tick\n" * (len(data) // 5), "a torn write reached the export"
    groups = _starter_groups(pool_executor)
    pool_executor.close()
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_with(marker), "the left-behind writer outlived the executor"
    assert groups, "the pool had no cgroups: the check below would prove nothing"
    assert not [g for g in groups if g.exists()], "cgroups left after close"


def test_exit_codes_atexit_and_signals_as_a_cold_run_reports_them(
    pool_executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _FreezeSpy(monkeypatch)
    r = _run(
        pool_executor,
        """
        import atexit, os
        os.makedirs("out")
        atexit.register(lambda: open("out/atexit.txt", "w").write("bye"))
        raise SystemExit(3)
        """,
        exports=("out/*",),
    )
    assert r.exit_code == 3 and r.signal is None, r
    assert [a.path for a in r.artifacts] == ["out/atexit.txt"], r
    assert spy.frozen == 1
    # A death by signal is never reported early: pid 1 reports it after the exit.
    r = _run(pool_executor, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.signal == 9 and r.exit_code is None, r
    assert spy.frozen == 1
    # A process the program forked that runs on to the end of the program exits as it would in
    # a cold run (only the program's own process stops for the freeze), so its parent's wait
    # returns.
    r = _run(
        pool_executor,
        """
        import os
        pid = os.fork()
        if pid:
            print("child ended", os.waitpid(pid, 0)[1])
        """,
        limits=Limits().with_(wall_time_s=20),
    )
    assert r.outcome.value == "ok" and "child ended 0" in r.stdout, r
    assert spy.frozen == 2
    # os._exit skips the program's epilogue: no early report, the exit is waited for.
    r = _run(pool_executor, "import os; print('x', flush=True); os._exit(7)")
    assert r.exit_code == 7 and r.stdout == "x\n", r
    assert spy.frozen == 2


def test_a_later_run_sees_nothing_of_a_frozen_one(pool_executor: Executor) -> None:
    marker = f"sandcell-quiesce-{secrets.token_hex(6)}"
    first = _run(
        pool_executor,
        f"""
        import os, subprocess
        open("{marker}", "w").write("x")
        open("/tmp/{marker}", "w").write("x")
        subprocess.Popen(["{marker}", "600"], executable="/bin/sleep")
        print("ok")
        """,
    )
    assert first.outcome.value == "ok", first
    second = _run(
        pool_executor,
        """
        import os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        print(sorted(os.listdir(".")), sorted(os.listdir("/tmp")), pids)
        """,
    )
    assert second.outcome.value == "ok", second
    assert marker not in second.stdout, second
    # pid 1 (the run's supervisor) and the program's own process only.
    assert second.stdout.strip().endswith("[1, 2]"), second
