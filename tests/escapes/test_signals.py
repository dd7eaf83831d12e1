"""Escapes by signalling or tracing host processes: the sandbox's pid namespace holds only its own
processes, so host pids are not there to signal, and kill(-1) reaches nothing outside."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from tests.conftest import wasm_cannot

if TYPE_CHECKING:
    from .conftest import Attack


@pytest.fixture
def host_victim(attack: Attack, request: pytest.FixtureRequest, token: str) -> Iterator[int]:
    """A ``sleep`` on the host owned by the same host user as the sandbox (so plain permission
    checks would let a signal through): its pid. Killed after the test."""
    if attack.identity == "root":
        uid = gid = 0
    else:
        entry = pwd.getpwnam(request.getfixturevalue("unpriv").user)
        uid, gid = entry.pw_uid, entry.pw_gid
    proc = subprocess.Popen(
        [f"sleep-{token}", "60"],
        executable="/bin/sleep",
        user=uid,
        group=gid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
    )
    try:
        assert _alive(proc.pid), "the host victim did not start"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_blocks_signal_to_host_process(attack: Attack, host_victim: int) -> None:
    """The host pid does not exist in the sandbox (or is another, sandboxed process)."""
    wasm_cannot(attack.sandbox, "processes")
    pid = host_victim
    assert pid > 100, "the victim's pid could be mistaken for a sandboxed one"
    pidfd_ok = "errno.ESRCH, errno.EPERM"
    if attack.sandbox.backend == "gvisor":
        # gVisor's sentry does not implement pidfd_open: the call does not exist there.
        pidfd_ok += ", errno.ENOSYS"
    body = f"""
    attempt("kill({pid}, 0)", lambda: os.kill({pid}, 0) or "signal delivered",
            ok=(errno.ESRCH, errno.EPERM))
    attempt("kill({pid}, SIGKILL)", lambda: os.kill({pid}, 9) or "signal delivered",
            ok=(errno.ESRCH, errno.EPERM))
    attempt("pidfd_open({pid})", lambda: os.pidfd_open({pid}), ok=({pidfd_ok}))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=3)
    assert _alive(pid), f"[{attack.identity}] ESCAPE: the host process {pid} was killed"


def test_blocks_kill_all_host_processes(attack: Attack, host_victim: int) -> None:
    """kill(-1, SIGKILL) from inside (every process the caller may signal) leaves the host alone."""
    wasm_cannot(attack.sandbox, "processes")
    body = """
    import signal, time
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        os.kill(-1, signal.SIGKILL)
        how = "sent"
    except OSError as exc:
        how = errname(exc)
    _, status = os.waitpid(child, 0)
    # The signal did go out (it killed the sandbox's own child); the host checks its process.
    killed_own = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    blocked("kill(-1, SIGKILL) beyond the sandbox", f"{how}, own child killed: {killed_own}")
    """
    res = attack.run(body)
    out = attack.expect_blocked(res, attempts=1)
    assert "own child killed: True" in out, out
    assert _alive(host_victim), f"[{attack.identity}] ESCAPE: kill(-1) killed a host process"
    assert _alive(os.getpid())


def test_blocks_signal_to_sandbox_supervisor(attack: Attack) -> None:
    """The parent of the sandbox init (bwrap's parent: the supervisor) is out of reach: getppid of
    init is 0 and the supervisor's host pid is not in the namespace."""
    wasm_cannot(attack.sandbox, "processes")
    supervisor = os.getpid()  # as root the executor is this process; as the user, its ancestor
    microvm = attack.sandbox.backend == "microvm"
    body = f"""
    try:
        with open("/proc/1/stat") as f:
            ppid = int(f.read().rpartition(")")[2].split()[1])
    except FileNotFoundError:
        if not {microvm!r}:
            raise
        # The guest's pid 1 is the agent, hidden from the program; the supervisor is a host
        # process, outside the guest kernel altogether.
        ppid = None
    if ppid is None:
        blocked("find the supervisor from /proc/1/stat", f"ENOENT, parent pid {{os.getppid()}}")
    elif ppid == 0:
        blocked("find the supervisor from /proc/1/stat", "ppid 0")
    else:
        breach(f"the sandbox init has a visible parent {{ppid}}")
    attempt("kill({supervisor}, 0)", lambda: os.kill({supervisor}, 0) or "delivered",
            ok=(errno.ESRCH, errno.EPERM))
    """
    res = attack.run(body)
    attack.expect_blocked(res, attempts=2)
