"""Sessions that last, through the command line: ``sandcell session pause|resume|fork|snapshot|
snapshots|snapshot-delete|delete|show`` and ``start --snapshot|--on-idle pause``, with real
detached session servers.

The whole path (the server's ops, the states under the home, the servers a resume, a fork or a
snapshot start, the audit chain) is the same on every rung, so it runs on the namespaces rung in
``files`` mode, where a server starts quickest; what each rung keeps in ``memory`` mode is
tests/contract/sessions/test_lasting.py's, and one gVisor test here takes a memory pause through
the command line. Runs as root with a data directory of its own (the root CLI of test_cli.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import backend_unavailable, run_cli
from tests.integration import hostscan

from sandcell.audit import AuditLog

Cli = Callable[..., "subprocess.CompletedProcess[str]"]

SETUP = "x = 41\nimport os\nos.makedirs('d', exist_ok=True)\nopen('d/kept.txt', 'w').write('kept')"


def _cli(tmp_path: Path) -> tuple[Cli, Path]:
    if os.geteuid() != 0:
        pytest.skip("the root CLI test runs as root; this test run is not root")
    home = tmp_path / "home"
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    env.pop("SANDCELL_BACKEND", None)

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), env=env, timeout=300)

    return call, home


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def _start(call: Cli, *extra: str) -> str:
    sid = json.loads(_ok(call("session", "start", "--profile", "unchecked", "--json", *extra)))
    return str(sid["id"])


def _rows(call: Cli, *extra: str) -> dict[str, dict[str, object]]:
    return {str(r["id"]): r for r in json.loads(_ok(call("session", "list", "--json", *extra)))}


def _server_pid(home: Path, sid: str) -> int:
    return int(json.loads((home / "sessions" / f"{sid}.json").read_text())["pid"])


def _owner(home: Path, sid: str) -> str:
    return str(json.loads((home / "sessions" / f"{sid}.json").read_text())["owner"])


def _nothing_left(owner: str) -> bool:
    return not hostscan.live_procs_matching(owner) and not hostscan.cgroups_of(owner)


def _events(home: Path) -> list[dict[str, object]]:
    log = AuditLog(home / "audit.sqlite3")
    try:
        entries = [e.record for e in log.list(limit=500)]
    finally:
        log.close()
    return [dict(r) for r in reversed(entries) if r.get("kind") == "session_event"]


def _close_all(call: Cli) -> None:
    for sid, row in _rows(call).items():
        if row["state"] == "live":
            call("session", "close", sid)


def test_pause_list_show_resume_in_files_mode(tmp_path: Path) -> None:
    call, home = _cli(tmp_path)
    sid = _start(call)
    try:
        _ok(call("session", "run", sid, "-c", SETUP))
        shown = json.loads(_ok(call("session", "show", sid, "--json")))
        assert shown["state"] == "live" and shown["info"]["backend"] == "namespaces", shown
        assert shown["metrics"], "a live session has at least the sample taken when asked"
        sample = shown["metrics"][-1]
        assert sample["mem_total_bytes"] > 0 and sample["disk_total_bytes"] > 0, sample
        table = _ok(call("session", "show", sid))
        assert "CPU" in table and "MEMORY" in table and "DISK" in table, table
        server, owner = _server_pid(home, sid), _owner(home, sid)

        paused = json.loads(_ok(call("session", "pause", sid, "--mode", "files", "--json")))
        state = paused["state"]
        assert (state["kind"], state["mode"], state["session_id"]) == ("paused", "files", sid)
        assert state["stored_bytes"] > 0 and state["expires_at"] is not None, state
        # The server saved, exited and unregistered; its sandbox left nothing running.
        assert hostscan.wait_until(lambda: not hostscan.alive(server), timeout=60)
        assert not (home / "sessions" / f"{sid}.json").exists()
        assert hostscan.wait_until(lambda: _nothing_left(owner), timeout=30)

        rows = _rows(call)
        assert rows[sid]["state"] == "paused" and rows[sid]["pid"] is None, rows
        assert rows[sid]["stored_bytes"] == state["stored_bytes"] and rows[sid]["cells"] == 1
        assert _rows(call, "--state", "live") == {}
        assert list(_rows(call, "--state", "paused")) == [sid]
        table = _ok(call("session", "list")).splitlines()
        assert table[0].split()[:7] == ["ID", "PID", "PROFILE", "BACKEND", "CELLS", "STATE", "SIZE"]
        assert [line.split()[5] for line in table if line.startswith(sid)] == ["paused"]
        assert "paused (files)" in _ok(call("session", "show", sid))

        refused = call("session", "run", sid, "-c", "print(1)")
        assert refused.returncode == 78
        assert f"paused: resume it with `sandcell session resume {sid}`" in refused.stderr
        assert call("session", "close", sid).returncode == 78

        assert _ok(call("session", "resume", sid)).strip() == sid
        assert _rows(call)[sid]["state"] == "live"
        assert _ok(call("session", "run", sid, "-c", "print(open('d/kept.txt').read())")) == (
            "kept\n"
        )
        # Files mode keeps files only: the interpreter came back empty.
        gone = call("session", "run", sid, "-c", "print(x)")
        assert gone.returncode == 1 and "NameError" in gone.stderr, gone
        assert call("session", "resume", sid).returncode == 78  # live: nothing to resume
    finally:
        _close_all(call)
    events = [(e["event"], e["session_id"]) for e in _events(home)]
    assert events == [("pause", sid), ("resume", sid)], events
    _ok(call("audit", "verify"))


def test_resume_after_every_sandcell_process_was_killed(tmp_path: Path) -> None:
    """A "host restart": the paused state on disk is all a resume needs. Every process of this
    home (the session servers and their sandboxes) is killed; the live session is lost, as a
    live one is at a restart, and the paused one comes back."""
    call, home = _cli(tmp_path)
    paused, live = _start(call), _start(call)
    try:
        _ok(call("session", "run", paused, "-c", SETUP))
        _ok(call("session", "pause", paused, "--mode", "files"))
        owner = _owner(home, live)
        for proc in hostscan.live_procs_matching(str(home)) + hostscan.live_procs_matching(owner):
            os.kill(proc.pid, signal.SIGKILL)
        assert hostscan.wait_until(lambda: not hostscan.live_procs_matching(str(home)), 30)

        rows = _rows(call)  # sweeps what the killed server left
        assert list(rows) == [paused] and rows[paused]["state"] == "paused", rows
        lost = call("session", "resume", live)
        assert lost.returncode == 78 and f"no paused session {live}" in lost.stderr

        assert _ok(call("session", "resume", paused)).strip() == paused
        read = call("session", "run", paused, "-c", "print(open('d/kept.txt').read())")
        assert _ok(read) == "kept\n"
    finally:
        _close_all(call)


def test_fork_a_live_and_a_paused_session(tmp_path: Path) -> None:
    call, home = _cli(tmp_path)
    parent = _start(call)
    children: list[str] = []
    try:
        _ok(call("session", "run", parent, "-c", SETUP))
        forked = json.loads(
            _ok(call("session", "fork", parent, "-n", "2", "--mode", "files", "--json"))
        )
        children = list(forked["children"])
        assert forked["parent"] == parent and len(set(children)) == 2 and parent not in children
        rows = _rows(call)
        assert all(rows[c]["state"] == "live" for c in [parent, *children]), rows
        # Each copy has its own workspace: a write in one is seen by no other.
        _ok(call("session", "run", children[0], "-c", "open('d/kept.txt', 'w').write('first')"))
        for sid, want in ((children[0], "first"), (children[1], "kept"), (parent, "kept")):
            read = call("session", "run", sid, "-c", "print(open('d/kept.txt').read())")
            assert _ok(read) == want + "\n", sid
        shown = json.loads(_ok(call("session", "show", children[1], "--json")))
        assert shown["info"]["parent"] == parent
        # The fork point is removed once the copies started.
        states = home / "states"
        assert [d.name for d in states.iterdir() if not d.name.startswith(".")] == []

        _ok(call("session", "pause", parent, "--mode", "files"))
        refused = call("session", "fork", parent, "--mode", "memory")
        assert refused.returncode == 78 and "paused with its files" in refused.stderr
        (third,) = _ok(call("session", "fork", parent)).split()
        children.append(third)
        assert _rows(call)[parent]["state"] == "paused"  # a paused parent stays paused
        read = call("session", "run", third, "-c", "print(open('d/kept.txt').read())")
        assert _ok(read) == "kept\n"
        assert call("session", "fork", parent, "-n", "21").returncode == 78
    finally:
        _close_all(call)
    forks = [e for e in _events(home) if e["event"] == "fork"]
    assert [(e["session_id"], e["children"]) for e in forks] == [
        (parent, children[:2]),
        (parent, children[2:]),
    ]


def test_snapshots_start_sessions_and_are_deleted(tmp_path: Path) -> None:
    call, home = _cli(tmp_path)
    sid = _start(call)
    started: str | None = None
    try:
        _ok(call("session", "run", sid, "-c", SETUP))
        snap = json.loads(
            _ok(call("session", "snapshot", sid, "base", "--mode", "files", "--json"))
        )
        assert (snap["state"]["kind"], snap["state"]["name"]) == ("snapshot", "base")
        assert snap["state"]["expires_at"] is None
        assert _rows(call)[sid]["state"] == "live"  # a snapshot leaves the session running
        listed = json.loads(_ok(call("session", "snapshots", "--json")))
        assert [(s["name"], s["session_id"], s["mode"]) for s in listed] == [("base", sid, "files")]
        assert "base" in _ok(call("session", "snapshots"))

        mixed = call("session", "start", "--snapshot", "base", "--memory", "64")
        assert mixed.returncode == 78 and "--memory cannot be given with --snapshot" in mixed.stderr
        started = _ok(call("session", "start", "--snapshot", "base")).strip()
        assert started != sid
        read = call("session", "run", started, "-c", "print(open('d/kept.txt').read())")
        assert _ok(read) == "kept\n"
        assert json.loads(_ok(call("session", "show", started, "--json")))["info"]["parent"] == sid

        assert "deleted snapshot base" in _ok(call("session", "snapshot-delete", "base"))
        assert json.loads(_ok(call("session", "snapshots", "--json"))) == []
        gone = call("session", "start", "--snapshot", "base")
        assert gone.returncode == 78 and "no snapshot named 'base'" in gone.stderr
    finally:
        _close_all(call)
    events = [(e["event"], e["session_id"]) for e in _events(home)]
    assert events == [("snapshot", sid), ("start_from_snapshot", started)], events


def test_an_idle_session_pauses_and_its_server_exits(tmp_path: Path) -> None:
    call, home = _cli(tmp_path)
    sid = _start(call, "--idle-timeout", "1", "--on-idle", "pause", "--paused-ttl", "600")
    entry, state = home / "sessions" / f"{sid}.json", home / "states" / sid

    def paused() -> bool:
        return not entry.exists() and state.is_dir()

    try:
        server = _server_pid(home, sid)
        _ok(call("session", "run", sid, "-c", SETUP))
        assert hostscan.wait_until(lambda: not hostscan.alive(server), timeout=120)
        row = _rows(call)[sid]
        assert row["state"] == "paused" and row["expires_at"] is not None, row
        # The resumed session keeps its settings, so it may pause again (idle for 1 s) before
        # a cell reaches it: that cell is refused as a paused session's, and it is resumed again.
        for _ in range(5):
            assert _ok(call("session", "resume", sid)).strip() == sid
            read = call("session", "run", sid, "-c", "print(open('d/kept.txt').read())")
            if read.returncode == 0:
                break
            assert "is paused" in read.stderr, read.stderr
        assert _ok(read) == "kept\n"
        assert hostscan.wait_until(paused, timeout=120), "the resumed session paused again"
    finally:
        _close_all(call)
    pauses = [e for e in _events(home) if e["event"] == "pause"]
    assert len(pauses) >= 2 and all(str(e["by"]).startswith("on_idle") for e in pauses), pauses


def test_a_tampered_state_is_refused_and_deleted(tmp_path: Path) -> None:
    call, home = _cli(tmp_path)
    sid = _start(call)
    try:
        _ok(call("session", "run", sid, "-c", SETUP))
        _ok(call("session", "pause", sid, "--mode", "files"))
        files = [p for p in (home / "states" / sid / "data").rglob("*") if p.is_file()]
        assert files, "the paused state holds files"
        with files[0].open("ab") as f:
            f.write(b"changed")
        refused = call("session", "resume", sid)
        assert refused.returncode == 78, refused
        assert "changed after it was saved" in refused.stderr, refused.stderr
        assert sid not in _rows(call, "--state", "live")
        live = _start(call)
        assert call("session", "delete", live).returncode == 78  # a live one is closed instead
        deleted = json.loads(_ok(call("session", "delete", sid, "--json")))
        assert deleted["deleted"]["id"] == sid
        assert sid not in _rows(call)
        assert call("session", "delete", sid).returncode == 78
    finally:
        _close_all(call)


def test_a_mode_the_rung_lacks_is_refused_and_the_session_goes_on(tmp_path: Path) -> None:
    from sandcell.backends.namespaces import session_state

    if "memory" in {m.value for m in session_state.PAUSE_MODES}:
        pytest.skip("the namespaces rung offers memory mode here; nothing to refuse")
    call, _home = _cli(tmp_path)
    sid = _start(call)
    try:
        _ok(call("session", "run", sid, "-c", "x = 41"))
        refused = call("session", "pause", sid, "--mode", "memory")
        assert refused.returncode == 78 and "offers: files" in refused.stderr, refused.stderr
        assert _ok(call("session", "run", sid, "-c", "print(x + 1)")) == "42\n"
    finally:
        _close_all(call)


def test_gvisor_memory_pause_through_the_cli(tmp_path: Path) -> None:
    call, _home = _cli(tmp_path)
    start = call("session", "start", "--profile", "unchecked", "--backend", "gvisor", "--json")
    if start.returncode != 0 and "gvisor is unavailable" in start.stderr:
        backend_unavailable("gvisor", start.stderr.strip())
    sid = str(json.loads(_ok(start))["id"])
    try:
        _ok(call("session", "run", sid, "-c", SETUP))
        paused = call("session", "pause", sid, "--mode", "memory", "--json")
        if paused.returncode == 78 and "cannot save" in paused.stderr:
            pytest.skip(f"the gVisor rung does not offer memory mode yet: {paused.stderr.strip()}")
        state = json.loads(_ok(paused))["state"]
        assert (state["mode"], state["backend"]) == ("memory", "gvisor"), state
        assert _ok(call("session", "resume", sid)).strip() == sid
        # Memory mode keeps the interpreter: its variables come back with the files.
        both = call("session", "run", sid, "-c", "print(x + 1, open('d/kept.txt').read())")
        assert _ok(both) == "42 kept\n"
    finally:
        _close_all(call)
