"""Teardown off the call path: a warm run's sandbox is destroyed after its result was returned."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from sandcell.backends.host import cgroups
from sandcell.backends.namespaces.template import WarmChild

__all__ = ["Teardown", "destroyer"]


def destroyer(child: WarmChild, cgroup: cgroups.RunCgroup | None) -> Callable[[], None]:
    def destroy() -> None:
        # End-of-file and SIGKILL end pid 1, and with it the run's pid namespace; then nothing
        # of the run may be left in its cgroup when the cgroup goes (a pooled child's own
        # cgroup goes with discard()). A frozen run dies when kill_all thaws it after the kill.
        child.discard()
        if cgroup is not None and child.armed is None:
            cgroup.kill_all()
            cgroup.remove()

    return destroy


class Teardown:
    """Destroys used sandboxes on one worker thread, after their results were returned.

    The backlog is bounded: when it is full, the next run waits for room, so a burst of runs
    can never leave an unbounded number of dead sandboxes behind. :meth:`drain` returns once
    every submitted sandbox is gone.
    """

    def __init__(self, backlog: int = 32) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=backlog)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, destroy: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="sandcell-teardown", daemon=True
                )
                self._thread.start()
        self._queue.put(destroy)

    def drain(self) -> None:
        self._queue.join()

    def _work(self) -> None:
        while True:
            destroy = self._queue.get()
            try:
                destroy()
            except Exception:  # noqa: S110 - one failed teardown must not stop the others;
                pass  # the sweep at the next start removes what it left
            finally:
                self._queue.task_done()
