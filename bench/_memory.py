"""Idle memory of ready-to-run interpreters and sandboxes, as PSS.

PSS divides every shared page among the processes mapping it, so N forks of one template that
share their imported modules copy-on-write show what each really adds, and the sum over all of
them is what the machine pays. Processes are found as descendants of this process: a pool whose
processes are reparented elsewhere (double fork to init) would not be seen and is reported as such.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import baseline_env, python_argv
from _machine import cpu_time_ticks, descendants, pss_kib
from _results import MemoryRow
from _variants import PRELOAD, open_warm_executor

__all__ = ["separate_interpreters", "settle", "warm_sandboxes"]

MIB = 1024 * 1024
_READY = "import {mods}, sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"


def _total_pss(pids: list[int]) -> tuple[int, int]:
    """(sum of PSS in KiB, processes measured); processes that exit meanwhile are skipped."""
    total = counted = 0
    for pid in pids:
        try:
            total += pss_kib(pid)
        except (OSError, ValueError):
            continue
        counted += 1
    return total, counted


def settle(exclude: set[int], *, timeout_s: float = 60.0, quiet_s: float = 1.0) -> list[int]:
    """Descendants not in ``exclude``, once none start or exit and they use no CPU for ``quiet_s``.

    Returns whatever is there at ``timeout_s`` if they never go quiet.
    """
    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    prev: tuple[list[int], int] | None = None
    while True:
        pids = [p for p in descendants(me) if p not in exclude]
        state = (pids, cpu_time_ticks(pids))
        if state == prev or time.monotonic() >= deadline:
            return pids
        prev = state
        time.sleep(quiet_s)


def separate_interpreters(n: int) -> MemoryRow:
    """``n`` bare interpreters side by side, each with the preloaded modules imported."""
    code = _READY.format(mods=", ".join(PRELOAD))
    procs = [
        subprocess.Popen(
            python_argv(code),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=baseline_env(),
            text=True,
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"interpreter {p.pid} exited before importing {PRELOAD}")
        total, counted = _total_pss([p.pid for p in procs])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    label = f"separate python processes, {'+'.join(PRELOAD)} imported"
    return MemoryRow(label, n, counted, total, "bare interpreters, no sandbox")


def _warm_stats(ex: Any) -> Any:
    """The backend's own report of its template and pool (None where it has none)."""
    stats = getattr(ex.backend, "warm_stats", None)
    return stats() if callable(stats) else None


def _wait_pool_full(ex: Any, size: int, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # A template's pool reports under ``.pool``; a pool of whole sandboxes (wasm, gVisor:
        # SandboxPoolStats) at the top level.
        st = _warm_stats(ex)
        ready = getattr(getattr(st, "pool", None) or st, "ready", None)
        if not isinstance(ready, int):
            return False
        if ready >= size:
            return True
        time.sleep(0.2)
    return False


def warm_sandboxes(mode: str, *, home: Path, pool_size: int) -> MemoryRow:
    """Every process a warm sandcell Executor keeps while idle, after it has settled."""
    label = f"sandcell {mode} ({'+'.join(PRELOAD)} imported)"
    before = set(descendants(os.getpid()))
    ex, why = open_warm_executor(mode, home=home, pool_size=pool_size)
    if ex is None:
        return MemoryRow(label, 0, 0, None, f"not available: {why}")
    try:
        full = mode != "pool" or _wait_pool_full(ex, pool_size)
        pids = settle(before)
        total, counted = _total_pss(pids)
        st = _warm_stats(ex)
    finally:
        ex.close()
    if not counted:
        return MemoryRow(label, 0, 0, None, "no idle process found under this process")
    own = []
    if st is not None and st.template_pss_bytes:
        own.append(f"template {st.template_pss_bytes / MIB:.1f} MiB")
    if mode == "pool":
        pool = getattr(st, "pool", None)
        if pool is not None and pool.ready:
            per = pool.idle_pss_bytes / MIB / pool.ready
            own.append(f"{pool.ready} waiting children {per:.1f} MiB each")
        note = "all processes (template, bwrap, waiting children) / pool size"
        if not full:
            note += "; the pool was not full after 60 s"
        if own:
            note += "; sandcell's own stats: " + ", ".join(own)
        return MemoryRow(label, pool_size, counted, total, note)
    note = "the template only: no sandbox waits, each run forks from it at call time"
    return MemoryRow(label, 0, counted, total, note)
