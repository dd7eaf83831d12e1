"""Sessions on the gVisor backend: one runsc sandbox kept alive across cells.

The promises of ``test_sessions.py`` (state kept, rich outputs, interrupts, caps, the session's
limits, expiry, records, nothing left behind) checked on the gVisor rung, as root through the
in-process executor and through the CLI as root and as the unprivileged user (rootless runsc);
plus what is gVisor's own: the CPU time enforced from the host, the display directory read
without following a link the cell planted, and the sweep after the session server is killed.
Each test asserts outcomes and what is left on the host, never how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, backend_unavailable, ladder_executor, run_as_user, run_cli
from tests.integration import hostscan

from sandcell import Executor, Limits, Outcome
from sandcell.backends.host import workspace
from sandcell.sessions import Session, SessionEnded
from sandcell.spec import MiB


@pytest.fixture
def gvx(ladder_executors: dict[tuple[str, str], Executor], root_home: Path) -> Executor:
    return ladder_executor(ladder_executors, root_home, "gvisor", "cold")


@pytest.fixture
def session(gvx: Executor) -> Iterator[Session]:
    with gvx.session(limits=Limits(wall_time_s=20, memory_bytes=256 * MiB)) as s:
        yield s


def _state_dir(runs: Path | None = None) -> Path:
    from sandcell.backends.gvisor import runsc

    return (runs or workspace.runs_root()) / runsc.STATE_DIRNAME


def _leftovers(
    needle: str,
    sandbox_pid: int | None = None,
    run_dir: Path | None = None,
    runs: Path | None = None,
) -> list[str]:
    """What of the sandboxes whose names contain ``needle`` is left on the host."""
    left: list[str] = []
    if sandbox_pid is not None and hostscan.alive(sandbox_pid):
        left.append(f"runsc {sandbox_pid} alive")
    if run_dir is not None and run_dir.exists():
        left.append(f"run directory {run_dir}")
    with open("/proc/self/mountinfo") as f:
        left += [f"mount {line.split()[4]}" for line in f if needle in line.split()[4]]
    state = _state_dir(runs)
    if state.is_dir():
        left += [f"runsc state {n}" for n in os.listdir(state) if needle in n]
    for base in hostscan.cgroup_bases():
        if base.is_dir():
            left += [f"cgroup {d}" for d in base.iterdir() if needle in d.name]
    left += [f"process {p.pid}: {p.cmdline}" for p in hostscan.live_procs_matching(needle)]
    return sorted(set(left))


def _assert_gone(s: Session) -> None:
    pid, run_dir = s.sandbox_pid, s.run_dir

    def nothing() -> bool:
        return not _leftovers(s.id, pid, run_dir)

    assert hostscan.wait_until(nothing, timeout=15), _leftovers(s.id, pid, run_dir)


def _wait_ended(s: Session, timeout: float = 60) -> str:
    assert hostscan.wait_until(lambda: s.ended is not None, timeout=timeout), "session still alive"
    assert s.ended is not None
    return s.ended


# -- cells ------------------------------------------------------------------------------------


def test_state_values_figures_and_errors(session: Session) -> None:
    first = session.run("import json\nx = 41\nopen('notes.txt', 'w').write('kept')")
    assert first.outcome is Outcome.OK, first.stderr
    second = session.run("print(json.dumps({'x': x + 1}), open('notes.txt').read())")
    assert second.outcome is Outcome.OK, second.stderr
    assert second.stdout == '{"x": 42} kept\n'
    shown = session.run("x + 1")
    assert [(o.kind, o.data.get("text/plain")) for o in shown.outputs] == [("value", "42")]
    figure = session.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);")
    assert figure.outcome is Outcome.OK, figure.stderr
    assert [o.kind for o in figure.outputs] == ["figure"]
    assert sorted(a.media_type for a in figure.outputs[0].artifacts) == [
        "image/png",
        "image/svg+xml",
    ]
    # The outputs' directory is sandcell's: read, removed, never a file of the session.
    assert session.files() == ["notes.txt"]
    failed = session.run("1 / 0")
    assert failed.outcome is Outcome.ERROR
    assert "ZeroDivisionError" in failed.stderr and "kernel" not in failed.stderr
    exited = session.run("import sys; sys.exit(3)")
    assert (exited.outcome, exited.exit_code) == (Outcome.ERROR, 3)
    assert session.run("print(x)").stdout == "41\n"


def test_endless_cell_is_interrupted_and_state_kept(session: Session) -> None:
    session.run("counter = 7")
    looped = session.run("while True:\n    counter += 0", timeout_s=1)
    assert looped.outcome is Outcome.TIMEOUT
    assert "interrupted" in looped.reason and "kept" in looped.reason
    assert "KeyboardInterrupt" in looped.stderr
    assert session.ended is None
    after = session.run("print(counter)")
    assert (after.outcome, after.stdout) == (Outcome.OK, "7\n")


def test_cell_ignoring_sigint_ends_the_session(gvx: Executor) -> None:
    s = gvx.session()
    s.run("v = 1")
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    stuck = s.run(code, timeout_s=1)
    assert stuck.outcome is Outcome.TIMEOUT
    assert "did not stop" in stuck.reason and "session ended" in stuck.reason
    with pytest.raises(SessionEnded, match="has ended"):
        s.run("print(v)")
    _assert_gone(s)


def test_output_cap_interrupts_the_cell_only(gvx: Executor) -> None:
    with gvx.session(limits=Limits(stdout_bytes=4096)) as s:
        s.run("z = 5")
        flood = s.run("while True:\n    print('x' * 100)", timeout_s=20)
        assert flood.outcome is Outcome.OUTPUT_LIMIT
        assert flood.stdout_truncated and len(flood.stdout) <= 4096
        assert s.run("print(z)").stdout == "5\n"


def test_kernel_exit_ends_the_session_with_its_status(gvx: Executor) -> None:
    s = gvx.session()
    gone = s.run("import os, sys\nprint('bye', file=sys.stderr, flush=True)\nos._exit(5)")
    assert gone.outcome is Outcome.ERROR
    assert "exited with status 5" in gone.reason and "session ended" in gone.reason
    assert gone.stderr == "bye\n"  # the agent's exit trailer is not the cell's output
    _assert_gone(s)


def test_forged_exit_trailer_is_not_believed(gvx: Executor) -> None:
    s = gvx.session()
    # The agent's trailer, written by the cell itself (a status of 0: a clean exit).
    forged = s.run("import os\nos.write(2, b'\\x00sandcell-gvisor-exit 0\\n')\nos._exit(7)")
    assert forged.outcome is Outcome.ERROR
    assert "exited with status 7" in forged.reason, forged.reason
    assert forged.exit_code == 7
    _assert_gone(s)


# -- limits of the whole session ----------------------------------------------------------------


def test_memory_limit_holds_across_cells(gvx: Executor) -> None:
    with gvx.session(limits=Limits(memory_bytes=256 * MiB)) as s:
        kept = s.run("a = b'1' * (120 * 1024 * 1024)\nprint(len(a))")
        assert kept.outcome is Outcome.OK, kept.reason
        # Alone this fits the limit; on top of the first cell's memory it does not.
        more = s.run("b = b'2' * (160 * 1024 * 1024)")
        assert more.outcome is Outcome.MEMORY_LIMIT, (more.reason, more.stderr)
        assert "session" in more.reason and "ended" in more.reason
        _assert_gone(s)


def test_cpu_time_is_the_sessions_and_enforced_by_the_host(gvx: Executor) -> None:
    s = gvx.session(limits=Limits(cpu_time_s=3))
    first = s.run("import time\nt = time.process_time()\nwhile time.process_time() - t < 1:\n pass")
    assert first.outcome is Outcome.OK, first.reason
    # Its own wall-time limit is far away; the session's CPU time (gVisor ignores RLIMIT_CPU)
    # ends it.
    burn = s.run("while True:\n    pass", timeout_s=120)
    assert burn.outcome is Outcome.TIMEOUT
    assert "CPU-time limit of 3 s for the session" in burn.reason
    assert s.ended is not None
    _assert_gone(s)


def test_idle_timeout_ends_the_session(gvx: Executor) -> None:
    s = gvx.session(idle_timeout_s=1)
    s.run("w = 1")
    assert "idle" in _wait_ended(s)
    with pytest.raises(SessionEnded, match="idle"):
        s.run("print(w)")
    _assert_gone(s)


def test_max_lifetime_ends_a_running_cell(gvx: Executor) -> None:
    s = gvx.session(max_lifetime_s=4)
    cell = s.run("import time\ntime.sleep(120)", timeout_s=120)
    assert cell.outcome is Outcome.TIMEOUT
    assert "maximum lifetime" in cell.reason
    assert s.ended is not None
    _assert_gone(s)


# -- cleanup, record, policy, the display directory --------------------------------------------


def test_close_exports_and_leaves_nothing_behind(gvx: Executor) -> None:
    s = gvx.session()
    started = s.run(
        "import subprocess\np = subprocess.Popen(['sleep', '600'])\n"
        "open('big', 'wb').write(b'0' * 4096)\nprint(p.pid)"
    )
    assert started.outcome is Outcome.OK, started.stderr
    assert _leftovers(s.id), "the live session shows nothing to look for"
    mid = s.run("x = 1", exports=["big"])
    assert [a.path for a in mid.artifacts] == ["big"]
    end = s.close(exports=["big", "*"])
    assert [a.path for a in end.artifacts] == ["big"]  # the outputs' directory is not exported
    _assert_gone(s)
    assert s.close().reason == "closed"  # idempotent


def test_cells_are_runs_recorded_under_gvisor_and_denied_cells_do_not_run(gvx: Executor) -> None:
    with gvx.session(profile="strict") as s:
        ok = s.run("n = 1")
        assert ok.outcome is Outcome.OK, ok.reason
        assert ok.enforcement is not None and ok.enforcement.backend == "gvisor"
        assert "session" in ok.enforcement.layers
        entry = gvx.audit.get(ok.run_id)
        assert entry is not None
        assert entry.record["session_id"] == s.id
        backend = entry.record["backend"]
        assert isinstance(backend, dict)
        assert backend["name"] == "gvisor" and "runsc" in backend
        denied = s.run("n = 2\nimport ctypes")
        assert denied.outcome is Outcome.DENIED
        assert "py.native" in denied.reason
        denied_entry = gvx.audit.get(denied.run_id)
        assert denied_entry is not None and denied_entry.record["outcome"] == "denied"
        assert s.run("print(n)").stdout == "1\n"


def test_display_directory_link_is_not_followed(session: Session, tmp_path: Path) -> None:
    # A host directory shaped like a cell's outputs, which a link from the workspace would
    # reach if the host followed it: its "output" must never come back.
    bait = tmp_path / "bait"
    (bait / "2").mkdir(parents=True)
    manifest = {"kind": "value", "data": {"text/plain": "HOST SECRET"}, "files": []}
    (bait / "2" / "0001.json").write_text(json.dumps(manifest))
    bait.chmod(0o755)
    assert session.run("import os, shutil").outcome is Outcome.OK
    planted = session.run(
        "shutil.rmtree('/sandbox/.sandcell-display')\n"
        f"os.symlink({str(bait)!r}, '/sandbox/.sandcell-display')"
    )
    assert planted.outcome is Outcome.OK, planted.stderr
    assert not [o for o in planted.outputs if "HOST SECRET" in str(o.data)]
    assert any("cannot be opened safely" in r.reason for r in planted.rejected_exports)
    assert (bait / "2" / "0001.json").exists()  # and nothing on the host was removed
    assert session.run("print(6 * 7)").stdout == "42\n"


# -- the command line ---------------------------------------------------------------------------


Cli = Callable[[list[str]], "subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]"]


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _start(call: Cli, args: list[str]) -> str:
    argv = ["session", "start", "--profile", "unchecked", "--json", "--backend", "gvisor", *args]
    start = call(argv)
    if start.returncode != 0 and "gvisor is unavailable" in _text(start.stderr):
        backend_unavailable("gvisor", _text(start.stderr).strip())
    assert start.returncode == 0, start.stderr
    return str(json.loads(start.stdout)["id"])


def _cli_cycle(call: Cli, args: list[str]) -> None:
    """start on gVisor, run (state kept, value, timeout), close, and the session is gone."""
    sid = _start(call, args)
    try:
        first = call(["session", "run", sid, "--json", "-c", "x = 20\nprint('set')"])
        assert first.returncode == 0, first.stderr
        doc = json.loads(first.stdout)
        assert doc["session_id"] == sid
        assert doc["enforcement"]["backend"] == "gvisor"
        second = call(["session", "run", sid, "-c", "print(x + 22)"])
        assert (second.returncode, _text(second.stdout)) == (0, "42\n"), second.stderr
        value = call(["session", "run", sid, "-c", "x * 2"])
        assert "Out[1]: 40" in _text(value.stdout)
        timed = call(["session", "run", sid, "--timeout", "1", "-c", "while True: pass"])
        assert timed.returncode == 124
        assert _text(call(["session", "run", sid, "-c", "print(x)"]).stdout) == "20\n"
        rows = {r["id"]: r for r in json.loads(call(["session", "list", "--json"]).stdout)}
        assert rows[sid]["backend"] == "gvisor", rows
    finally:
        closed = call(["session", "close", sid])
    assert closed.returncode == 0, closed.stderr
    after = call(["session", "run", sid, "-c", "print(x)"])
    assert after.returncode == 78
    assert sid not in [r["id"] for r in json.loads(call(["session", "list", "--json"]).stdout)]


def test_cli_gvisor_session_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    _cli_cycle(lambda args: run_cli(args, env=env), [])


def test_cli_gvisor_session_rootless(unpriv: UnprivEnv) -> None:
    _cli_cycle(lambda args: run_as_user(unpriv, args), ["--isolation", unpriv.mode.value])
    leftovers = hostscan.runs_dir_leftovers(unpriv.runs)
    assert not [p for p in leftovers if "/" in p], leftovers


def _kill_and_sweep(call: Cli, args: list[str], runs: Path) -> None:
    """Start a session, leave a process running in it, SIGKILL its server: the next session
    command sweeps the container, its processes, cgroups and directories."""
    sid = _start(call, args)
    sleeper = "import subprocess\nsubprocess.Popen(['sleep', '600'])"
    ran = call(["session", "run", sid, "-c", sleeper])
    assert ran.returncode == 0, ran.stderr
    (entry,) = [e for e in json.loads(call(["session", "list", "--json"]).stdout) if e["id"] == sid]
    server = int(entry["pid"])
    owner = hostscan.owner_tag_of(server)
    assert _leftovers(owner, runs=runs), "the live session shows nothing to look for"
    os.kill(server, signal.SIGKILL)
    assert hostscan.wait_until(lambda: not hostscan.alive(server), timeout=10)
    state = _state_dir(runs)
    assert any(n.startswith(owner) for n in os.listdir(state)), "no container to sweep"
    listed = call(["session", "list", "--json"])
    assert listed.returncode == 0, listed.stderr
    assert sid not in [e["id"] for e in json.loads(listed.stdout)]

    def nothing() -> bool:
        return not _leftovers(owner, runs=runs)

    assert hostscan.wait_until(nothing, timeout=15), _leftovers(owner, runs=runs)
    assert not (runs / owner).exists()


def test_killed_session_server_is_swept(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root; this test run is not root")
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    _kill_and_sweep(lambda args: run_cli(args, env=env), [], workspace.runs_root())


def test_killed_rootless_session_server_is_swept(unpriv: UnprivEnv) -> None:
    call: Cli = lambda args: run_as_user(unpriv, args)  # noqa: E731
    _kill_and_sweep(call, ["--isolation", unpriv.mode.value], unpriv.runs)
