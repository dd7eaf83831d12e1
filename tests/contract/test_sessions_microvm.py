"""Sessions on the microVM backend: one VM kept alive across cells, for real.

As root through the in-process executor (the suite's pooled microVM executor: a session VM is a
restored clone of the snapshot) and through the CLI as root and as the unprivileged user (the
detached session server; a cold boot). Each VM costs seconds under TCG, so each test groups the
assertions of one session. What a closed session leaves is checked on the host: the QEMU process
(and its jail), the jail's cgroup and the VM's run directory.

They skip with the reason where the host has no QEMU or no built guest (``scripts/install-vm``,
then ``sandcell vm build``), and fail instead where ``SANDCELL_REQUIRE_BACKENDS`` names microvm.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import (
    UnprivEnv,
    backend_unavailable,
    ladder_executor,
    run_as_user,
    run_cli,
    settle_pools,
)
from tests.integration import hostscan

from sandcell import Executor, Limits, Outcome
from sandcell.backends.microvm import layout, probe
from sandcell.errors import InfraError
from sandcell.sessions import Session, SessionEnded, registry
from sandcell.spec import MiB

status = probe()
_VM_ENV = {k: os.environ[k] for k in ("SANDCELL_VM_DIR",) if k in os.environ}
"""Passed on to the ordinary user's CLI (a guest image built elsewhere than the default)."""


@pytest.fixture
def vm_ex(ladder_executors: dict[tuple[str, str], Executor], root_home: Path) -> Executor:
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    ex = ladder_executor(ladder_executors, root_home, "microvm", "pool")
    # Sessions start from pooled clones, as designed, not cold while the snapshot is taken.
    settle_pools({("microvm", "pool"): ex}, timeout=300)
    return ex


def _need_microvm() -> None:
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    if _STALE:
        pytest.fail(_STALE[0])


_STALE: list[str] = []
"""Set once a guest image without sessions was found: the other tests fail at once."""


def _open(ex: Executor, **options: Any) -> Session:
    _need_microvm()
    try:
        return ex.session(**options)
    except InfraError as exc:
        if "built before sessions" in str(exc):
            _STALE.append(f"the guest image cannot run sessions: {exc}")
        raise


# -- what a session leaves on the host --------------------------------------------------------


def _jail_cgroups(pid: int) -> list[Path]:
    """The jail's cgroup directories of the VM whose outermost process is ``pid``."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        rel = line.split(":", 2)[-1]
        if ".vm-" in rel:
            found += [base / rel.lstrip("/") for base in hostscan.cgroup_bases()]
    return [p for p in found if p.is_dir()]


def _qemus_under(path: Path) -> list[hostscan.Proc]:
    return [p for p in hostscan.live_procs_matching(str(path) + "/") if "qemu" in p.cmdline]


class _Trace:
    """Where a session's VM lives, taken while it runs, to check after its end."""

    def __init__(self, s: Session) -> None:
        assert s.sandbox_pid is not None
        self.pid = s.sandbox_pid
        self.run_dir = s.run_dir
        self.cgroups = _jail_cgroups(self.pid)
        assert self.run_dir.is_dir() and _qemus_under(self.run_dir), "the session's VM runs"

    def leftovers(self) -> list[str]:
        left = [f"QEMU {p.pid}" for p in _qemus_under(self.run_dir)]
        if hostscan.alive(self.pid):
            left.append(f"VM process {self.pid}")
        if self.run_dir.exists():
            left.append(f"run directory {self.run_dir}")
        left += [f"cgroup {c}" for c in self.cgroups if c.exists()]
        return left

    def assert_gone(self) -> None:
        assert hostscan.wait_until(lambda: not self.leftovers(), timeout=20), self.leftovers()


def _wait_ended(s: Session, timeout: float = 90) -> str:
    assert hostscan.wait_until(lambda: s.ended is not None, timeout=timeout), "session alive"
    assert s.ended is not None
    return s.ended


# -- in-process, as root ----------------------------------------------------------------------


def test_state_outputs_files_exports_and_records(vm_ex: Executor) -> None:
    # A figure's first import builds matplotlib's font cache: CPU seconds under TCG.
    s = _open(vm_ex, limits=Limits(wall_time_s=120, cpu_time_s=240))
    trace = _Trace(s)
    first = s.run(
        "import json, os\nx = 41\nopen('notes.txt', 'w').write('kept')\n"
        "os.symlink('/etc/passwd', 'link')\nos.makedirs('sub')\nopen('sub/b.txt', 'w').close()"
    )
    assert first.outcome is Outcome.OK, first.reason + first.stderr
    second = s.run("print(json.dumps({'x': x + 1}), open('notes.txt').read())")
    assert second.outcome is Outcome.OK, second.stderr
    assert second.stdout == '{"x": 42} kept\n'
    assert s.files() == ["notes.txt", "sub/b.txt"]  # the link is not a file of the workspace
    # Rich outputs: the last expression's value, a table, a figure (PNG and SVG).
    shown = s.run("x")
    assert [(o.kind, o.data.get("text/plain")) for o in shown.outputs] == [("value", "41")]
    table = s.run("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert [o.kind for o in table.outputs] == ["table"], table.stderr
    figure = s.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);")
    assert figure.outcome is Outcome.OK, figure.reason + figure.stderr
    assert [o.kind for o in figure.outputs] == ["figure"]
    media = sorted(a.media_type for a in figure.outputs[0].artifacts)
    assert media == ["image/png", "image/svg+xml"]
    # The guest reads the figure's chart data too; display() and shell escapes work there.
    chart = json.loads(figure.outputs[0].data["application/vnd.sandcell.chart+json"])
    assert chart["type"] == "line" and chart["elements"][0]["points"][2] == [2.0, 3.0]
    ordered = s.run("display(1)\n_sandcell_shell('echo from-guest')\n2")
    assert ordered.stdout == "from-guest\n", ordered.stderr
    assert [(o.data["text/plain"], o.displayed) for o in ordered.outputs] == [
        ("1", True),
        ("2", False),
    ]
    # Errors and exit statuses end the cell, not the session; tracebacks show the cell only.
    failed = s.run("1 / 0")
    assert failed.outcome is Outcome.ERROR and "ZeroDivisionError" in failed.stderr
    assert "kernel" not in failed.stderr
    exited = s.run("import sys; sys.exit(3)")
    assert (exited.outcome, exited.exit_code) == (Outcome.ERROR, 3)
    # Exports during the session pass the host's checks: the link is refused.
    out = s.run(
        "open('a.csv', 'w').write('a,b')\nos.symlink('/etc/shadow', 'b.csv')", exports=["*.csv"]
    )
    assert [a.path for a in out.artifacts] == ["a.csv"]
    assert [r.path for r in out.rejected_exports] == ["b.csv"]
    assert vm_ex.store.path_for(out.artifacts[0].sha256).read_text() == "a,b"
    # Every cell is a run in the record, naming the microVM backend and its boundary versions.
    versions = vm_ex.backend.versions()
    for r in (first, second, out):
        assert r.session_id == s.id
        entry = vm_ex.audit.get(r.run_id)
        assert entry is not None and entry.record["session_id"] == s.id
        backend = entry.record["backend"]
        assert isinstance(backend, dict)
        assert backend["guest_kernel_sha256"] == versions["guest_kernel_sha256"]
        assert r.enforcement is not None and r.enforcement.backend == "microvm"
        assert "session" in r.enforcement.layers and "guest_kernel" in r.enforcement.layers
    end = s.close(exports=["notes.txt"])
    assert [a.path for a in end.artifacts] == ["notes.txt"]
    trace.assert_gone()
    assert s.close().reason == "closed"  # idempotent


def test_interrupts_output_caps_and_pids_keep_the_session(vm_ex: Executor) -> None:
    with _open(vm_ex, limits=Limits(stdout_bytes=4096, max_pids=16)) as s:
        s.run("counter = 7")
        looped = s.run("while True:\n    counter += 0", timeout_s=1)
        assert looped.outcome is Outcome.TIMEOUT, looped.reason
        assert "interrupted" in looped.reason and "kept" in looped.reason
        assert "KeyboardInterrupt" in looped.stderr
        flood = s.run("while True:\n    print('x' * 100)", timeout_s=30)
        assert flood.outcome is Outcome.OUTPUT_LIMIT, flood.reason
        assert flood.stdout_truncated and len(flood.stdout) <= 4096
        # The session's pids limit (cgroup and RLIMIT_NPROC in the guest) refuses the 17th.
        spawn = s.run(
            "import subprocess\nprocs = []\ntry:\n"
            "    for _ in range(40):\n        procs.append(subprocess.Popen(['sleep', '60']))\n"
            "except OSError as e:\n    print('refused', e.errno)\n"
            "print(len(procs) < 16)"
        )
        assert spawn.outcome is Outcome.OK, spawn.reason + spawn.stderr
        assert spawn.stdout.split() == ["refused", "11", "True"], spawn.stdout
        after = s.run("[p.kill() for p in procs]\nprint(counter)")
        assert after.stdout == "7\n" and s.ended is None
        # Output and reply in quick succession, again and again: the relay keeps them in order
        # and never waits on a pipe it already drained (a stuck agent would time these out).
        for i in range(25):
            quick = s.run(f"print({i})\nimport sys; sys.stderr.write('e')", timeout_s=20)
            assert (quick.stdout, quick.stderr) == (f"{i}\n", "e"), quick.reason


def test_a_kernel_ignoring_the_interrupt_ends_the_session_and_its_vm(vm_ex: Executor) -> None:
    s = _open(
        vm_ex,
    )
    trace = _Trace(s)
    s.run("v = 1")
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    stuck = s.run(code, timeout_s=1)
    assert stuck.outcome is Outcome.TIMEOUT
    assert "did not stop" in stuck.reason and "session ended" in stuck.reason
    assert s.ended is not None
    with pytest.raises(SessionEnded, match="has ended"):
        s.run("print(v)")
    trace.assert_gone()


def test_memory_limit_is_the_sessions(vm_ex: Executor) -> None:
    s = _open(vm_ex, limits=Limits(memory_bytes=160 * MiB))
    trace = _Trace(s)
    kept = s.run("a = b'1' * (100 * 1024 * 1024)\nprint(len(a))")
    assert kept.outcome is Outcome.OK, kept.reason
    # Alone this fits the limit; on top of the first cell's memory it does not.
    more = s.run("b = b'2' * (100 * 1024 * 1024)")
    assert more.outcome is Outcome.MEMORY_LIMIT, (more.reason, more.stderr)
    assert "session" in more.reason and "ended" in more.reason
    assert s.ended is not None
    trace.assert_gone()


def test_cpu_time_limit_is_the_sessions(vm_ex: Executor) -> None:
    s = _open(vm_ex, limits=Limits(cpu_time_s=2, wall_time_s=60))
    trace = _Trace(s)
    spent = s.run("while True:\n    pass", timeout_s=60)
    assert spent.outcome is Outcome.TIMEOUT, spent.reason
    assert "CPU-time limit" in spent.reason and "session" in spent.reason
    assert s.ended is not None
    trace.assert_gone()


def test_max_lifetime_ends_a_running_cell(vm_ex: Executor) -> None:
    s = _open(vm_ex, max_lifetime_s=8)  # a pooled VM opens in about a second
    trace = _Trace(s)
    cell = s.run("import time\ntime.sleep(120)", timeout_s=120)
    assert cell.outcome is Outcome.TIMEOUT
    assert "maximum lifetime" in cell.reason
    assert s.ended is not None
    trace.assert_gone()


def test_denied_cells_do_not_run_and_idle_ends_the_session(vm_ex: Executor) -> None:
    # The strict profile's runtime (analysis) is not the pool's: the session boots cold, which
    # takes longer than its idle timeout here; the idle time starts once it is up.
    s = _open(vm_ex, profile="strict", idle_timeout_s=6)
    trace = _Trace(s)
    assert s.run("n = 1").outcome is Outcome.OK
    denied = s.run("n = 2\nimport ctypes")
    assert denied.outcome is Outcome.DENIED and "py.native" in denied.reason
    entry = vm_ex.audit.get(denied.run_id)
    assert entry is not None and entry.record["outcome"] == "denied"
    assert entry.record["session_id"] == s.id
    assert s.run("print(n)").stdout == "1\n"
    assert "idle" in _wait_ended(s)
    with pytest.raises(SessionEnded, match="idle"):
        s.run("print(n)")
    trace.assert_gone()


# -- the command line ---------------------------------------------------------------------------


Cli = Callable[[list[str]], "subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]"]


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _start(call: Cli, *extra: str) -> str:
    _need_microvm()
    start = call(
        ["session", "start", "--backend", "microvm", "--profile", "unchecked", "--json", *extra]
    )
    assert start.returncode == 0, start.stderr
    sid = json.loads(start.stdout)["id"]
    assert isinstance(sid, str)
    return sid


def _cycle(call: Cli, home: Path, runs_root: Path, data: Path | None = None) -> None:
    """start (with ``data`` as an input), cells (state, a value, an interrupted cell), close
    with an export; then the session and its server's VM directory are gone."""
    sid = _start(call, *(["--input", str(data)] if data is not None else []))
    owner = json.loads((home / "sessions" / f"{sid}.json").read_text())["owner"]
    vm_dir = runs_root / owner
    try:
        first = call(["session", "run", sid, "--json", "-c", "x = 20\nopen('r.txt', 'w')"])
        assert first.returncode == 0, first.stderr
        result = json.loads(first.stdout)
        assert result["session_id"] == sid and result["enforcement"]["backend"] == "microvm"
        assert vm_dir.is_dir() and _qemus_under(vm_dir), "the server's VM runs"
        second = call(["session", "run", sid, "-c", "print(x + 22)"])
        assert _text(second.stdout) == "42\n", second.stderr
        value = call(["session", "run", sid, "-c", "x * 2"])
        assert "Out[1]: 40" in _text(value.stdout)
        timed = call(["session", "run", sid, "--timeout", "1", "-c", "while True: pass"])
        assert timed.returncode == 124
        assert sid in [r["id"] for r in json.loads(call(["session", "list", "--json"]).stdout)]
        if data is not None:
            read = call(["session", "run", sid, "-c", f"print(open('{data.name}').read())"])
            assert _text(read.stdout) == data.read_text() + "\n", read.stderr
    finally:
        closed = call(["session", "close", sid, "--json", "--export", "r.txt"])
    assert closed.returncode == 0, closed.stderr
    assert [a["path"] for a in json.loads(closed.stdout)["artifacts"]] == ["r.txt"], closed.stdout
    after = call(["session", "run", sid, "-c", "print(x)"])
    assert after.returncode == 78 and "no live session" in _text(after.stderr)
    assert hostscan.wait_until(lambda: not vm_dir.exists() and not _qemus_under(vm_dir), 30)


def test_cli_session_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    _need_microvm()
    home = tmp_path / "home"
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    data = tmp_path / "sales.csv"
    data.write_text("day,n\n1,3\n")
    _cycle(lambda args: run_cli(args, env=env, timeout=300), home, layout.runs_root(), data)


def test_cli_session_as_unprivileged_user(unpriv: UnprivEnv) -> None:
    _need_microvm()
    uid = pwd.getpwnam(unpriv.user).pw_uid
    runs_root = layout.runs_root().with_name(f"sandcell-vm-{uid}")
    _cycle(
        lambda args: run_as_user(unpriv, args, timeout=300, extra_env=_VM_ENV),
        unpriv.home,
        runs_root,
    )


def test_a_killed_session_server_leaves_nothing_after_the_sweep(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root; this test run is not root")
    _need_microvm()
    home = tmp_path / "home"
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    sid = _start(lambda args: run_cli(args, env=env, timeout=300))
    entry = registry.read(home, sid)
    assert entry is not None
    vm_dir = layout.runs_root() / entry.owner
    ran = run_cli(
        ["session", "run", sid, "-c", "import subprocess\nsubprocess.Popen(['sleep', '600'])"],
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    assert vm_dir.is_dir() and _qemus_under(vm_dir), "the server's VM runs"
    os.kill(entry.pid, signal.SIGKILL)
    # Dead is enough, reaped or not: a zombie supervisor holds nothing any more.
    assert hostscan.wait_until(lambda: not hostscan.alive(entry.pid), timeout=30)
    swept = registry.sweep(home)
    # Another supervisor's start may have swept the VM directory first: what counts is that
    # nothing is left.
    assert sid in swept
    assert hostscan.wait_until(lambda: not _qemus_under(vm_dir), timeout=20), _qemus_under(vm_dir)
    assert not vm_dir.exists()
    assert not (home / "sessions" / f"{sid}.sock").exists()
    assert registry.entries(home) == []
