"""Closing the microVM pool while it restores a clone kills that clone instead of waiting for its
warm-up, and leaves nothing behind; a pool that must not refill (a one-shot ``sandcell run``)
restores no replacement for the clone it handed out.

Real QEMU from the shared snapshot; skipped where the host has no QEMU or no built guest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration import hostscan

from sandcell import RunRequest
from sandcell.backends.microvm import MicroVMBackend, layout, probe
from sandcell.backends.microvm.pool import WarmVMs
from sandcell.backends.microvm.vm import VM
from sandcell.backends.warm import WarmConfig

status = probe()
pytestmark = pytest.mark.skipif(not status.usable, reason=f"microVM backend: {status.detail}")

_SNAPSHOT_WAIT_S = 600.0
"""After ``sandcell vm build`` the first pool takes the snapshot: minutes on a busy 2-core host."""


@pytest.fixture
def backend() -> Iterator[MicroVMBackend]:
    b = MicroVMBackend()
    try:
        yield b
    finally:
        b.close()


def _pool_dirs() -> set[Path]:
    owner = layout.runs_root() / layout.owner_tag()
    return set(owner.glob("pool-*")) if owner.is_dir() else set()


def _taken(pool: WarmVMs) -> VM:
    assert hostscan.wait_until(lambda: _ready(pool) >= 1, _SNAPSHOT_WAIT_S), pool.error
    got = pool.take(RunRequest(code="print(1)"))
    assert not isinstance(got, str), got
    vm, info = got
    assert info.mode == "pool"
    return vm


def _ready(pool: WarmVMs) -> int:
    stats = pool.stats().pool
    assert stats is not None
    return stats.ready


def test_close_during_a_refill_kills_the_clone_being_restored(backend: MicroVMBackend) -> None:
    before = _pool_dirs()
    pool = WarmVMs(backend.guest, WarmConfig(mode="pool", pool_size=1))
    try:
        _taken(pool).destroy()
        # The refill starts restoring a replacement at once (none is ready, no run holds it).
        assert hostscan.wait_until(lambda: pool._preparing is not None, 60), pool.error
        preparing = pool._preparing
        assert preparing is not None
        qemu_pid = preparing.proc.pid
        run_dir = preparing.run_dir
    finally:
        pool.close()
    # close() returned: the clone it interrupted is dead and reaped, its files are gone, no
    # clone became ready, and the refill thread has ended.
    assert not hostscan.alive(qemu_pid)
    assert preparing.proc.returncode is not None
    assert not run_dir.exists()
    assert not pool._thread.is_alive()
    stats = pool.stats().pool
    assert stats is not None
    assert stats.ready == 0 and stats.forked == 1 and stats.taken == 1
    assert _pool_dirs() <= before
    assert not hostscan.live_procs_matching(str(run_dir))


def test_a_pool_without_refill_restores_no_replacement(backend: MicroVMBackend) -> None:
    before = _pool_dirs()
    pool = WarmVMs(backend.guest, WarmConfig(mode="pool", pool_size=1, refill=False))
    try:
        _taken(pool).destroy()
        # Its one clone handed out, a second run is told at once that no clone will come (it
        # starts cold), and no replacement is being restored.
        assert pool.take(RunRequest(code="print(2)")) == "no pooled VM was ready in time"
        assert pool._preparing is None
        stats = pool.stats().pool
        assert stats is not None and stats.forked == 1 and stats.ready == 0 and stats.taken == 1
        assert _pool_dirs() <= before
    finally:
        pool.close()
    assert not pool._thread.is_alive()
    assert _pool_dirs() <= before
