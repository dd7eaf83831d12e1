"""The cgroup made ahead for the next cold run: taken as it is (under the name it was made with,
empty), with the run's own limits (rewritten where they differ from the last run's), and gone
after ``close``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from sandcell import Executor, RunRequest
from sandcell.backends.host import cgroups, workspace
from sandcell.backends.namespaces import NamespacesBackend, prepared
from sandcell.backends.namespaces.bwrap import BwrapPlan, build_argv
from sandcell.backends.namespaces.prepared import PreparedSandbox
from sandcell.backends.namespaces.spare_cgroup import SpareCgroup
from sandcell.backends.namespaces.spawner import Spawner
from sandcell.spec import Limits, Outcome

from .hostscan import children_of, wait_until

MiB = 1 << 20


def _host() -> cgroups.CgroupHost:
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root here; this test run is not root")
    host = cgroups.detect()
    if not isinstance(host, cgroups.CgroupHost):
        pytest.skip(f"no usable cgroups: {host.reason}")
    if not SpareCgroup.usable(host):
        pytest.skip("spare cgroups are kept on cgroup v1 hosts only (v2 cannot rename a group)")
    return host


def _spares(host: cgroups.CgroupHost) -> list[Path]:
    prefix = f"{workspace.owner_tag()}.w"
    return [
        d
        for base in host.bases.values()
        if base.is_dir()
        for d in base.iterdir()
        if d.name.startswith(prefix) and "-cold-" in d.name
    ]


def test_spare_is_taken_limited_and_removed() -> None:
    host = _host()
    before = set(_spares(host))
    spare = SpareCgroup(host)
    taken: list[cgroups.RunCgroup] = []
    try:
        first = f"{workspace.owner_tag()}.{uuid.uuid4().hex}"
        taken.append(spare.take(Limits(), first))  # nothing made ahead yet: created now
        assert all(d.name == first and d.is_dir() for d in taken[0].dirs.values())
        # Its directories appear before the group is handed over as the spare: wait for that.
        assert wait_until(lambda: spare.waiting() is not None, timeout=10), (
            "no spare was made after the first take"
        )
        waiting = set(_spares(host)) - before
        # One group, a directory in each controller's hierarchy.
        assert {d.name for d in waiting} == {spare.waiting()}
        assert len(waiting) == len(host.bases)

        second = f"{workspace.owner_tag()}.{uuid.uuid4().hex}"
        limits = Limits().with_(memory_bytes=200 * MiB, max_pids=17)
        group = spare.take(limits, second)
        taken.append(group)
        # The spare itself, not a group made at take time: its directories, all of them.
        assert set(group.dirs.values()) == waiting, "the take did not hand over the spare"
        assert all(d.is_dir() for d in group.dirs.values())
        memory = group.dirs["memory"] / "memory.limit_in_bytes"
        assert int(memory.read_text()) == 200 * MiB
        assert (group.dirs["pids"] / "pids.max").read_text().strip() == "17"
        assert (group.dirs["memory"] / "cgroup.procs").read_text() == ""
    finally:
        spare.close()
        for g in taken:
            g.remove()
    assert set(_spares(host)) == before, "close() left a spare behind"


def _cold_executor(tmp_path: Path) -> Executor:
    host = _host()
    ex = Executor(home=tmp_path / "home", profile="unchecked")
    backend = ex.backend
    assert isinstance(backend, NamespacesBackend)
    if backend.rootless:
        ex.close()
        pytest.skip("an ordinary user's runs start under the workspace helper: no spawner")
    assert host.version == 1
    return ex


def _spawner_waiting(ex: Executor) -> None:
    """Run once (the first run makes the first spare), then wait for the spare's spawner."""
    assert ex.run(RunRequest(code="pass")).outcome is Outcome.OK
    assert wait_until(SpareCgroup.settled_anywhere, timeout=10), "no spare was made"


_CGROUPS = "print(open('/proc/self/cgroup').read())"


def test_a_cold_run_is_born_inside_its_cgroup(tmp_path: Path) -> None:
    # The cgroup namespace is rooted where the sandbox init was made: at the run's own group
    # when bwrap started inside it (the spawner), at the supervisor's groups when the init was
    # moved in afterwards. So "/" in every run controller shows the run never had to be moved.
    with _cold_executor(tmp_path) as ex:
        _spawner_waiting(ex)
        r = ex.run(RunRequest(code=_CGROUPS))
        assert r.outcome is Outcome.OK, r.stderr
        lines = dict(line.split(":", 2)[1:] for line in r.stdout.splitlines() if line)
        for ctrl in ("memory", "pids", "cpuacct"):
            (key,) = [k for k in lines if ctrl in k.split(",")]
            assert lines[key] == "/", f"{ctrl}: {lines[key]} (the sandbox was moved in)"
        assert r.usage.cpu_ms is not None and r.usage.cpu_ms > 0, "the group counted nothing"
        # A bash run cannot use the python spawner: it is ended, and one made for the bash run
        # starts its bwrap in the run's own group all the same (spawner.spawner_in).
        b = ex.run(RunRequest(code="cat /proc/self/cgroup", language="bash"))
        assert b.outcome is Outcome.OK, b.stderr
        pids = [line for line in b.stdout.splitlines() if ":pids:" in line]
        assert [line.split(":", 2)[2] for line in pids] == ["/"], b.stdout


_FORKS = """
import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
pids = [line for line in open("/proc/self/cgroup").read().splitlines() if ":pids:" in line]
print(n, pids[0].split(":", 2)[2])
"""


def test_the_spawners_bwrap_does_not_take_a_process_of_the_run(tmp_path: Path) -> None:
    # bwrap itself sits in a spawner-born run's group: pids.max is one more than the run's
    # limit, so the sandbox still gets exactly max_pids (its init, the program, the children);
    # so does a run whose spare spawner had died, through the one made for it at its start.
    limits = Limits().with_(max_pids=9, wall_time_s=20)
    with _cold_executor(tmp_path) as ex:
        _spawner_waiting(ex)
        born = ex.run(RunRequest(code=_FORKS, limits=limits))
        assert wait_until(SpareCgroup.settled_anywhere, timeout=10), "no spare was made"
        _kill_waiting_spawner(ex)
        remade = ex.run(RunRequest(code=_FORKS, limits=limits))
    assert born.outcome is Outcome.OK and remade.outcome is Outcome.OK, (born, remade)
    born_n, born_group = born.stdout.split()
    remade_n, remade_group = remade.stdout.split()
    assert born_group == remade_group == "/", (born_group, remade_group)
    assert int(born_n) == 9 - 2, born.stdout
    assert remade_n == born_n, "a run whose spawner was made at its start gets another number"


def _kill_waiting_spawner(ex: Executor) -> None:
    spare = ex.backend._spare_cgroup  # type: ignore[attr-defined]
    with spare._lock:
        spawner = spare._spare[3]
    assert spawner is not None and spawner.alive()
    spawner.proc.kill()
    spawner.proc.wait()


def test_a_dead_spawner_is_replaced_by_one_made_for_the_run(tmp_path: Path) -> None:
    with _cold_executor(tmp_path) as ex:
        _spawner_waiting(ex)
        _kill_waiting_spawner(ex)
        r = ex.run(RunRequest(code=_CGROUPS, limits=Limits().with_(max_pids=9)))
        assert r.outcome is Outcome.OK, r.stderr
        pids = [line for line in r.stdout.splitlines() if ":pids:" in line]
        assert [line.split(":", 2)[2] for line in pids] == ["/"], "bwrap was not born in the group"


def _limit(pid: int, name: str) -> str:
    """The soft limit ``name`` ("Max open files") of process ``pid``, from /proc/PID/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            return line[len(name) :].split()[0]
    raise AssertionError(f"no {name!r} in /proc/{pid}/limits")


def test_a_spawner_limited_ahead_starts_its_sandbox_without_a_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spare's spawner is checked to be in the run's group and given the run's rlimits
    # before it becomes bwrap: bwrap itself carries them (held, only the sandbox init would),
    # and its options have no --block-fd, so the sandbox never waits for the host. Inside, the
    # program sees the run's limits all the same.
    options: list[list[str]] = []

    def recorded(plan: BwrapPlan) -> list[str]:
        argv = build_argv(plan)
        options.append(argv)
        return argv

    monkeypatch.setattr(prepared, "build_argv", recorded)
    limits = Limits().with_(max_open_files=77, wall_time_s=30)
    seen: dict[str, str] = {}
    with _cold_executor(tmp_path) as ex:
        _spawner_waiting(ex)

        def listen(stream: str, text: str) -> None:
            if "up" not in text or seen:
                return
            # The run's bwrap: not a warm template's of the suite's session-wide executors.
            (bwrap,) = [
                p
                for p in children_of(os.getpid())
                if p.comm == "bwrap" and not p.zombie and "/sandcell/main.py" in p.cmdline
            ]
            seen["bwrap_nofile"] = _limit(bwrap.pid, "Max open files")
            ex.backend.cancel_all("seen")

        r = ex.run(
            RunRequest(
                code="import resource, time\n"
                "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 'up', flush=True)\n"
                "time.sleep(60)",
                limits=limits,
            ),
            on_output=listen,
        )
    assert r.outcome is Outcome.KILLED, r.reason
    assert r.stdout.split()[:2] == ["77", "up"], r.stdout
    assert seen["bwrap_nofile"] == "77", "bwrap started without the run's rlimits"
    assert "--info-fd" in options[-1]
    assert "--block-fd" not in options[-1], "the sandbox was held for the host"


def test_a_spawner_outside_the_run_group_is_not_limited_ahead(tmp_path: Path) -> None:
    # Fail closed: a spawner that is not in the run's group (it died and was replaced, or was
    # moved out) gets nothing ahead; the sandbox is then held, moved in and limited as before.
    _host()
    with Executor(home=tmp_path / "home", profile="unchecked") as ex:
        backend = ex.backend
        assert isinstance(backend, NamespacesBackend)
        request = RunRequest(code="pass", limits=Limits().with_(max_open_files=77))
        sandbox = PreparedSandbox(
            backend, request, name=uuid.uuid4().hex, layers=backend.decide(request)
        )
        spawner = Spawner(backend.bwrap.path, backend.seccomp_program, ["/bin/true"])
        try:
            sandbox.create({})
            assert sandbox.cgroup is not None
            before = _limit(spawner.pid, "Max open files")
            assert not sandbox.limit_ahead(spawner.pid)
            assert _limit(spawner.pid, "Max open files") == before != "77"
        finally:
            spawner.discard()
            sandbox.remove()
