"""Sessions through the command line on every rung: the detached session server started by
``sandcell session start``, as root and as the unprivileged user (rootless, in the mode this host
gives users), its cells, and its end: closed by the caller, or swept after its server was killed.

A microVM session server boots its VM cold (seconds under emulation); the namespaces rung's is
the default backend, started without ``--backend``. What is left on the host is checked with
each rung's own view of it (tests/contract/sessions/traces.py).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, backend_unavailable, run_as_user, run_cli, runtime_required
from tests.contract.sessions.rungs import need_microvm, only_on
from tests.contract.sessions.traces import gvisor_leftovers, gvisor_state_dir, qemus_under
from tests.integration import hostscan

from sandcell.backends.host import workspace
from sandcell.sessions import registry

Cli = Callable[[list[str]], "subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]"]

VM_ENV = {k: os.environ[k] for k in ("SANDCELL_VM_DIR",) if k in os.environ}
"""Passed on to the ordinary user's CLI (a guest image built elsewhere than the default)."""


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _as_root(tmp_path: Path) -> tuple[Cli, Path]:
    """A root CLI with its own data directory, and that directory."""
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    home = tmp_path / "home"
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    return (lambda args: run_cli(args, env=env, timeout=300)), home


def _as_user(unpriv: UnprivEnv) -> Cli:
    return lambda args: run_as_user(unpriv, args, timeout=300, extra_env=VM_ENV)


def _user_args(rung: str, unpriv: UnprivEnv) -> list[str]:
    # The microVM's boundary is the guest kernel whatever the host gives the user.
    return [] if rung == "microvm" else ["--isolation", unpriv.mode.value]


def _start(call: Cli, rung: str, *extra: str) -> str:
    if rung == "microvm":
        need_microvm()
    backend = [] if rung == "namespaces" else ["--backend", rung]
    start = call(["session", "start", "--profile", "unchecked", "--json", *backend, *extra])
    if start.returncode != 0 and f"{rung} is unavailable" in _text(start.stderr):
        backend_unavailable(rung, _text(start.stderr).strip())
    assert start.returncode == 0, start.stderr
    sid = json.loads(start.stdout)["id"]
    assert isinstance(sid, str)
    return sid


def _vm_dir(home: Path, sid: str, runs_root: Path) -> Path:
    owner = json.loads((home / "sessions" / f"{sid}.json").read_text())["owner"]
    return runs_root / str(owner)


def _cycle(
    call: Cli,
    rung: str,
    home: Path,
    extra: list[str],
    *,
    vm_runs: Path,
    data: Path | None = None,
) -> None:
    """start (with ``data`` as an input), cells (state, a value, an interrupted cell), list,
    close with an export; then the session is gone, and so is a microVM server's VM (under
    ``vm_runs``, the caller's microVM run directories)."""
    sid = _start(call, rung, *extra, *(["--input", str(data)] if data is not None else []))
    vm_dir = _vm_dir(home, sid, vm_runs) if rung == "microvm" else None
    try:
        first = call(["session", "run", sid, "--json", "-c", "x = 20\nopen('r.txt', 'w')"])
        assert first.returncode == 0, first.stderr
        doc = json.loads(first.stdout)
        assert doc["session_id"] == sid and doc["enforcement"]["backend"] == rung, doc
        if vm_dir is not None:
            assert vm_dir.is_dir() and qemus_under(vm_dir), "the server's VM runs"
        second = call(["session", "run", sid, "-c", "print(x + 22)"])
        assert (second.returncode, _text(second.stdout)) == (0, "42\n"), second.stderr
        value = call(["session", "run", sid, "-c", "x * 2"])
        assert "Out[1]: 40" in _text(value.stdout)
        timed = call(["session", "run", sid, "--timeout", "1", "-c", "while True: pass"])
        assert timed.returncode == 124
        assert _text(call(["session", "run", sid, "-c", "print(x)"]).stdout) == "20\n"
        if data is not None:
            read = call(["session", "run", sid, "-c", f"print(open('{data.name}').read())"])
            assert _text(read.stdout) == data.read_text() + "\n", read.stderr
        rows = {r["id"]: r for r in json.loads(call(["session", "list", "--json"]).stdout)}
        assert rows[sid]["backend"] == rung, rows
        table = _text(call(["session", "list"]).stdout).splitlines()
        assert table[0].split()[:4] == ["ID", "PID", "PROFILE", "BACKEND"], table
        assert [line.split()[3] for line in table if line.startswith(sid)] == [rung]
    finally:
        closed = call(["session", "close", sid, "--json", "--export", "r.txt"])
    assert closed.returncode == 0, closed.stderr
    assert [a["path"] for a in json.loads(closed.stdout)["artifacts"]] == ["r.txt"], closed.stdout
    after = call(["session", "run", sid, "-c", "print(x)"])
    assert after.returncode == 78
    assert "no live session" in _text(after.stderr)
    assert sid not in [r["id"] for r in json.loads(call(["session", "list", "--json"]).stdout)]
    if vm_dir is not None:
        assert hostscan.wait_until(lambda: not vm_dir.exists() and not qemus_under(vm_dir), 30)


def _user_vm_runs(unpriv: UnprivEnv) -> Path:
    """Where the ordinary user's microVMs live (a directory of that user's own)."""
    from sandcell.backends.microvm import layout

    uid = pwd.getpwnam(unpriv.user).pw_uid
    return layout.runs_root().with_name(f"sandcell-vm-{uid}")


def _root_vm_runs() -> Path:
    from sandcell.backends.microvm import layout

    return layout.runs_root()


def test_cli_session_as_root(rung: str, tmp_path: Path) -> None:
    call, home = _as_root(tmp_path)
    data = tmp_path / "sales.csv"
    data.write_text("day,n\n1,3\n")
    _cycle(call, rung, home, [], vm_runs=_root_vm_runs(), data=data)


def test_cli_session_as_unprivileged_user(rung: str, unpriv: UnprivEnv) -> None:
    args = _user_args(rung, unpriv)
    _cycle(_as_user(unpriv), rung, unpriv.home, args, vm_runs=_user_vm_runs(unpriv))
    leftovers = hostscan.runs_dir_leftovers(unpriv.runs)
    assert not [p for p in leftovers if "/" in p], leftovers


def _kill_and_sweep(
    call: Cli, rung: str, home: Path, extra: list[str], runs: Path, *, by_api: bool
) -> None:
    """Start a session, leave a process running in it, SIGKILL its server: the next session
    command (or, ``by_api``, :func:`registry.sweep` first) sweeps what its sandbox left
    (processes, mounts, cgroups, directories). The wasm rung has no processes: its kernel and
    sandbox are what is left."""
    sid = _start(call, rung, *extra)
    sleeper = "import subprocess\nsubprocess.Popen(['sleep', '600'])"
    if rung == "wasm":  # no processes: the kernel (Node) is the one left, with its sandbox's
        sleeper = "open('kept', 'w').write('kept')"
    ran = call(["session", "run", sid, "-c", sleeper])
    assert ran.returncode == 0, ran.stderr
    (entry,) = [e for e in json.loads(call(["session", "list", "--json"]).stdout) if e["id"] == sid]
    server = int(entry["pid"])
    owner = str(json.loads((home / "sessions" / f"{sid}.json").read_text())["owner"])
    left = _left_by(rung, owner, runs)
    assert left(), "the live session shows nothing to look for"
    if rung == "gvisor":
        state = gvisor_state_dir(runs)
        assert any(n.startswith(owner) for n in os.listdir(state)), "no container to sweep"
    os.kill(server, signal.SIGKILL)
    # Dead is enough, reaped or not: a zombie supervisor holds nothing any more.
    assert hostscan.wait_until(lambda: not hostscan.alive(server), timeout=30)
    if by_api:
        assert sid in registry.sweep(home)
    listed = call(["session", "list", "--json"])
    assert listed.returncode == 0, listed.stderr
    assert sid not in [e["id"] for e in json.loads(listed.stdout)]
    assert hostscan.wait_until(lambda: not left(), timeout=20), left()
    assert not (home / "sessions" / f"{sid}.sock").exists()


def _left_by(rung: str, owner: str, runs: Path) -> Callable[[], list[str]]:
    """What the sandbox of a session server whose owner tag is ``owner`` left on the host."""
    if rung == "gvisor":
        return lambda: gvisor_leftovers(owner, runs=runs) + _dir(runs / owner)
    if rung == "microvm":
        vm_dir = runs / owner
        return lambda: [f"QEMU {p.pid}" for p in qemus_under(vm_dir)] + _dir(vm_dir)

    def namespaces() -> list[str]:
        left = [f"process {p.pid}" for p in hostscan.live_procs_matching(owner)]
        left += [str(c) for c in hostscan.cgroups_of(owner)] + _dir(runs / owner)
        return left + [f"mount {m}" for m in hostscan.mounts_under(runs / owner)]

    return namespaces


def _dir(path: Path) -> list[str]:
    return [f"directory {path}"] if path.exists() else []


def test_a_killed_session_server_is_swept(rung: str, tmp_path: Path) -> None:
    call, home = _as_root(tmp_path)
    runs = _root_vm_runs() if rung == "microvm" else workspace.runs_root()
    _kill_and_sweep(call, rung, home, [], runs, by_api=True)
    assert registry.entries(home) == []


@only_on(
    "gvisor",
    reason="a session started as the ordinary user costs seconds per rung; the sweep is the "
    "registry's, run on every rung by test_a_killed_session_server_is_swept, and gVisor's rootless "
    "containers are the ones kept in a state directory of the user's own",
)
def test_a_killed_rootless_session_server_is_swept(rung: str, unpriv: UnprivEnv) -> None:
    runs = _user_vm_runs(unpriv) if rung == "microvm" else unpriv.runs
    args = _user_args(rung, unpriv)
    _kill_and_sweep(_as_user(unpriv), rung, unpriv.home, args, runs, by_api=False)


@only_on(
    "namespaces",
    reason="the server ends with its session, whose idle end test_limits.py checks on each rung; "
    "what this adds (the server's exit and its files) is the server's own, the same on every rung",
)
def test_cli_idle_timeout_ends_the_server(rung: str, tmp_path: Path) -> None:
    call, home = _as_root(tmp_path)
    sid = _start(call, rung, "--idle-timeout", "1")
    pid = json.loads((home / "sessions" / f"{sid}.json").read_text())["pid"]

    def gone() -> bool:
        return not hostscan.alive(pid)

    assert hostscan.wait_until(gone, timeout=60), "the session server outlived its idle timeout"
    assert not (home / "sessions" / f"{sid}.sock").exists()
    listed = call(["session", "list", "--json"])
    assert json.loads(listed.stdout) == []


@only_on(
    "namespaces",
    reason="the CLI gives the session its language and the rung starts that language's kernel; "
    "the kernel on each rung is the sessions contract's (test_cells)",
)
def test_cli_session_in_typescript(rung: str, tmp_path: Path) -> None:
    runtime_required("node")
    call, _ = _as_root(tmp_path)
    refused = call(["session", "start", "--profile", "unchecked", "--lang", "bash"])
    assert refused.returncode == 78 and "a session's language is its kernel's" in refused.stderr
    sid = _start(call, rung, "--lang", "ts")
    try:
        first = call(["session", "run", sid, "-c", "const n: number = 20;"])
        assert first.returncode == 0, first.stderr
        second = call(["session", "run", sid, "-c", "console.log(n + 22)"])
        assert (second.returncode, _text(second.stdout)) == (0, "42\n"), second.stderr
    finally:
        closed = call(["session", "close", sid])
    assert closed.returncode == 0, closed.stderr
