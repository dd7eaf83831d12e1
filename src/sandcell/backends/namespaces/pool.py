"""The warm pool: isolated, never-used children of the template, forked ahead of time.

A refill thread keeps ``size`` children waiting; :meth:`WarmPool.take` hands one out, which serves
exactly one run and is then destroyed; the thread forks a replacement. A child found dead when it
is taken (its template restarted, say) is discarded and the next one tried.

Preparing a child costs a few ms of CPU (fork, namespaces, mounts, the program's restrictions):
while a run is in progress and the pool still has a child to give, the refill waits for the run
to end (at most :data:`REFILL_DEFER_S`), so that on a busy host it does not take the CPU from the
run the caller is waiting for. An empty pool refills at once.

Idle memory is measured per child from ``/proc/PID/smaps_rollup`` of its processes (pid 1 and
the program's process it forked, armed and waiting): PSS (shared pages split between their
users) and USS (pages only that child holds).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from sandcell.backends.namespaces.template import WarmChild
from sandcell.backends.warm import PoolStats, idle_memory
from sandcell.errors import InfraError

__all__ = ["REFILL_DEFER_S", "REFILL_THREADS", "PoolStats", "WarmPool", "idle_memory"]

REFILL_DEFER_S = 0.05
"""Longest the refill waits for runs in progress while the pool can still serve."""
REFILL_THREADS = 2
"""Children prepared at the same time."""


def _children(pid: int) -> tuple[int, ...]:
    """The children of ``pid`` (its main thread's), host pids; none where it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return tuple(int(c) for c in f.read().split())
    except (OSError, ValueError):
        return ()


class WarmPool:
    """``size`` children of one template, refilled in the background."""

    def __init__(self, fork: Callable[[], WarmChild], size: int) -> None:
        self._fork = fork
        self.size = size
        self._ready: collections.deque[WarmChild] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._active = 0
        self._forked = self._taken = self._discarded = self._errors = 0
        self._last_error: str | None = None
        self._filling = 0
        # Two refill threads: most of a child's preparation is waiting (the template's fork,
        # the kernel's grace period on a cgroup attach), which two can overlap.
        self._threads = [
            threading.Thread(target=self._refill, name=f"sandcell-pool-{i}", daemon=True)
            for i in range(REFILL_THREADS)
        ]
        for thread in self._threads:
            thread.start()

    def run_started(self) -> None:
        with self._cond:
            self._active += 1

    def run_finished(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def _wait_for_room(self) -> bool:
        """Wait until a child should be forked; False once the pool is closed (lock held)."""
        deferred_until: float | None = None
        while not self._closed:
            if len(self._ready) + self._filling >= self.size:
                deferred_until = None
                self._cond.wait()
                continue
            if self._active and self._ready:
                now = time.monotonic()
                if deferred_until is None:
                    deferred_until = now + REFILL_DEFER_S
                if now < deferred_until:
                    self._cond.wait(timeout=deferred_until - now)
                    continue
            return True
        return False

    def _refill(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for_room():
                    return
                self._filling += 1
            try:
                child = self._fork()
            except InfraError as exc:
                with self._cond:
                    self._filling -= 1
                    self._errors += 1
                    self._last_error = str(exc)
                    self._cond.notify_all()
                    # A broken template: back off rather than spin; take() reports the error.
                    self._cond.wait(timeout=min(0.05 * 2 ** min(self._errors, 6), 2.0))
                continue
            with self._cond:
                self._filling -= 1
                self._forked += 1
                if self._closed:
                    child.discard()
                    return
                self._ready.append(child)
                self._cond.notify_all()

    def take(self, timeout_s: float) -> tuple[WarmChild, float]:
        """A waiting child and how long the caller waited (ms). Raises InfraError on timeout."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with self._cond:
            while True:
                while self._ready:
                    child = self._ready.popleft()
                    self._cond.notify_all()
                    if child.alive():
                        self._taken += 1
                        return child, (time.monotonic() - t0) * 1000
                    self._discarded += 1
                    child.discard()
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    raise InfraError(
                        "no warm sandbox became available"
                        + (f": {self._last_error}" if self._last_error else "")
                    )
                errors = self._errors
                self._cond.wait(timeout=remaining)
                if self._errors != errors and not self._ready and self._last_error:
                    raise InfraError(f"the warm pool cannot fork: {self._last_error}")

    def stats(self) -> PoolStats:
        with self._cond:
            ready = list(self._ready)
            snapshot = (self._forked, self._taken, self._discarded, self._errors, self._last_error)
        pss = uss = 0
        for child in ready:
            p, u = idle_memory((child.init_pid, *_children(child.init_pid)))
            pss, uss = pss + p, uss + u
        forked, taken, discarded, errors, last = snapshot
        return PoolStats(
            size=self.size,
            ready=len(ready),
            forked=forked,
            taken=taken,
            discarded=discarded,
            refill_errors=errors,
            last_error=last,
            idle_pss_bytes=pss,
            idle_uss_bytes=uss,
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready, self._ready = list(self._ready), collections.deque()
            self._discarded += len(ready)
            self._cond.notify_all()
        for child in ready:
            child.discard()
        for thread in self._threads:
            thread.join(timeout=10)
