"""The sweep kills a sandbox start whose outer bwrap died (see
:mod:`sandcell.backends.namespaces.orphans`), and leaves live sandboxes and other bwraps alone.

The orphan is made the way a SIGKILLed supervisor leaves one: a real bwrap with a pid namespace
and a ``sandcell-*`` memfd, whose outer process is killed while the inner one (pid 1 of the
namespace) lives on. Without ``--die-with-parent`` the inner one survives its parent, as the
one found after the soak fault test did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration import hostscan

from sandcell.backends.namespaces import orphans, sweep
from sandcell.backends.namespaces.bwrap import find_bwrap


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def _start(*, memfd: bool) -> tuple[subprocess.Popen[bytes], int]:
    """An outer bwrap and the pid of its inner one (pid 1 of the new pid namespace)."""
    fds: tuple[int, ...] = ()
    if memfd:
        fds = (os.memfd_create("sandcell-seccomp", 0),)
    try:
        outer = subprocess.Popen(
            [find_bwrap().path, "--unshare-pid", "--dev-bind", "/", "/", "--", "sleep", "600"],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
        )
    finally:
        for fd in fds:
            os.close(fd)
    assert hostscan.wait_until(lambda: bool(_children(outer.pid)), timeout=10)
    return outer, _children(outer.pid)[0]


@pytest.fixture
def started() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_an_orphaned_start_is_killed_and_a_live_one_is_not(started: list[int]) -> None:
    if os.geteuid() != 0:
        pytest.skip("bwrap with a pid namespace needs root or user namespaces for this test")
    live, live_inner = _start(memfd=True)
    cut, cut_inner = _start(memfd=True)
    started += [live.pid, live_inner, cut.pid, cut_inner]
    cut.kill()  # the outer bwrap dies, as with its supervisor; the inner one lives on
    cut.wait()
    assert hostscan.alive(cut_inner)
    assert hostscan.wait_until(lambda: cut_inner in orphans.orphans(), timeout=10)
    assert live_inner not in orphans.orphans()  # its outer bwrap still holds it

    removed = sweep()
    assert f"orphaned sandbox start (bwrap pid {cut_inner})" in removed
    assert hostscan.wait_until(lambda: not hostscan.alive(cut_inner), timeout=10)
    assert hostscan.alive(live_inner) and live.poll() is None
    live.kill()
    live.wait()


def test_a_bwrap_without_a_sandcell_memfd_is_not_ours(started: list[int]) -> None:
    if os.geteuid() != 0:
        pytest.skip("bwrap with a pid namespace needs root or user namespaces for this test")
    other, inner = _start(memfd=False)
    started += [other.pid, inner]
    other.kill()
    other.wait()
    assert hostscan.alive(inner)
    assert inner not in orphans.orphans()  # someone else's sandbox: not sandcell's to kill
