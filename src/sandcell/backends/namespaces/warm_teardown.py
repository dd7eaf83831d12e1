"""Teardown off the call path: a warm run's sandbox is destroyed after its result was returned."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sandcell.backends.host import cgroups
from sandcell.backends.namespaces.template import WarmChild

__all__ = ["Doomed", "Teardown", "destroyer"]


class Doomed(Protocol):
    """A used sandbox, destroyed in two steps so that a backlog dies in parallel."""

    def kill(self) -> None:
        """Signal everything of it; returns at once."""

    def release(self) -> None:
        """Wait for the end :meth:`kill` started, then remove what is left."""


@dataclass(frozen=True, slots=True)
class _WarmSandbox:
    child: WarmChild
    cgroup: cgroups.RunCgroup | None
    """The run's own group, for a child forked at call time (a pooled child's group is its
    own, ``child.armed.cgroup``)."""

    def kill(self) -> None:
        # A frozen run dies when kill_all thaws its group after the signal.
        self.child.kill(self.cgroup)

    def release(self) -> None:
        self.child.release(self.cgroup)


@dataclass(frozen=True, slots=True)
class _Callable:
    destroy: Callable[[], None]

    def kill(self) -> None:
        pass

    def release(self) -> None:
        self.destroy()


def destroyer(child: WarmChild, cgroup: cgroups.RunCgroup | None) -> Doomed:
    """The teardown of a warm run's sandbox: end-of-file and SIGKILL end pid 1, and with it the
    run's pid namespace; its cgroup goes once pid 1 has exited."""
    return _WarmSandbox(child, cgroup if child.armed is None else None)


class Teardown:
    """Destroys used sandboxes on one worker thread, after their results were returned.

    What is waiting is destroyed as one batch: every sandbox of it is killed first, then each
    is waited for and removed, so their deaths overlap. The backlog is bounded: when it is
    full, the next run waits for room, so a burst of runs can never leave an unbounded number
    of dead sandboxes behind. :meth:`drain` returns once every submitted sandbox is gone.
    """

    def __init__(self, backlog: int = 32) -> None:
        self._queue: queue.Queue[Doomed] = queue.Queue(maxsize=backlog)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, doomed: Doomed | Callable[[], None]) -> None:
        """Destroy ``doomed`` off the call path: a :class:`Doomed`, or a function that
        destroys a sandbox in one step."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="sandcell-teardown", daemon=True
                )
                self._thread.start()
        self._queue.put(_Callable(doomed) if callable(doomed) else doomed)

    def drain(self) -> None:
        self._queue.join()

    def _work(self) -> None:
        while True:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._queue.get_nowait())
            # One failed teardown must not stop the others: the sweep at the next start
            # removes what it left.
            for doomed in batch:
                with contextlib.suppress(Exception):
                    doomed.kill()
            for doomed in batch:
                try:
                    with contextlib.suppress(Exception):
                        doomed.release()
                finally:
                    self._queue.task_done()
