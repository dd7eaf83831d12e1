"""A session's life on every rung: closing it exports and leaves nothing behind, its cells are
admitted by the profile one by one (a denied cell does not run, the session goes on), and two
sessions cannot see each other. Outcomes and leftovers are asserted, never durations."""

from __future__ import annotations

import json

import pytest
from tests.contract.sessions.rungs import open_session
from tests.contract.sessions.traces import trace
from tests.integration import hostscan

from sandcell import Executor, Outcome
from sandcell.sessions import SessionEnded


def test_close_exports_and_leaves_nothing_behind(rung: str, ex: Executor) -> None:
    s = open_session(ex)
    # A process left running that the close must end (the wasm rung has none: files only).
    sleeper = "import subprocess\np = subprocess.Popen(['sleep', '600'])\nprint(p.pid)\n"
    started = s.run(("" if rung == "wasm" else sleeper) + "open('big', 'wb').write(b'0' * 4096)")
    assert started.outcome is Outcome.OK, started.stderr
    host = trace(rung, s)
    members: list[hostscan.Proc] = []
    if rung == "namespaces":
        # The host sees the sandbox's processes in its pid namespace; gVisor's are the Sentry's
        # own and the microVM's are in the guest, out of the host's sight.
        assert s.sandbox_pid is not None
        members = hostscan.pid_namespace_members(s.sandbox_pid)
        assert any("sleep" in p.cmdline for p in members)
    mid = s.run("x = 1", exports=["big"])
    assert [a.path for a in mid.artifacts] == ["big"]
    end = s.close(exports=["big", "*"])
    assert [a.path for a in end.artifacts] == ["big"]  # the outputs' directory is not exported
    host.assert_gone()
    assert not [p for p in members if hostscan.alive(p.pid)]
    assert s.close().reason == "closed"  # idempotent


IDLE_AFTER_A_COLD_BOOT_S = 6
"""The microVM's strict session boots cold (the profile's runtime is not the pool's), which takes
longer than this: its idle time starts once it is up, and it ends idle (the other rungs' idle end
is test_limits.py's; there a delayed start stands for a slow one)."""


def test_denied_cells_do_not_run_and_the_session_goes_on(rung: str, ex: Executor) -> None:
    idle = {"idle_timeout_s": IDLE_AFTER_A_COLD_BOOT_S} if rung == "microvm" else {}
    s = open_session(ex, profile="strict", **idle)
    host = trace(rung, s)
    assert s.run("n = 1").outcome is Outcome.OK
    denied = s.run("n = 2\nimport ctypes")
    assert denied.outcome is Outcome.DENIED
    assert "py.native" in denied.reason
    assert denied.session_id == s.id
    entry = ex.audit.get(denied.run_id)
    assert entry is not None and entry.record["outcome"] == "denied"
    assert entry.record["session_id"] == s.id
    after = s.run("print(n)")
    assert (after.outcome, after.stdout) == (Outcome.OK, "1\n")
    if rung == "microvm":
        assert hostscan.wait_until(lambda: s.ended is not None, timeout=90), "session alive"
        assert s.ended is not None and "idle" in s.ended
        with pytest.raises(SessionEnded, match="idle"):
            s.run("print(n)")
    else:
        s.close()
    host.assert_gone()


def test_two_sessions_cannot_see_each_other(rung: str, ex: Executor) -> None:
    with open_session(ex) as a, open_session(ex) as b:
        a.run("secret = 'a-only'\nopen('a.txt', 'w').write('a')")
        probe = b.run(
            "import os\nprint('secret' in globals(), os.path.exists('a.txt'), "
            "sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
        )
        assert probe.outcome is Outcome.OK, probe.stderr
        seen_secret, seen_file, pids = probe.stdout.split(" ", 2)
        assert (seen_secret, seen_file) == ("False", "False")
        # Only b's own sandbox: its init, the boot, the kernel.
        assert len(json.loads(pids)) <= 3, pids
        assert a.sandbox_pid is not None and b.sandbox_pid is not None
        if rung == "namespaces":
            # Each in a pid namespace of its own (the upper rungs' boundary is their kernel's).
            assert hostscan.pid_namespace(a.sandbox_pid) != hostscan.pid_namespace(b.sandbox_pid)
