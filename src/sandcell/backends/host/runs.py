"""The runs in flight of one backend, each with a way to stop it: what ``cancel_all`` reaches.

A start path registers its run for exactly as long as the run can be stopped::

    with backend.runs.register(run_id, stop.set) as cancellation:
        launched = launch(..., stop=stop)
    if launched.stopped_by == "cancelled":
        reason = cancellation.reason

``kill`` is called with the registry's lock held, so that it never runs after the ``with``
block has ended (the cold path closes the pipe it writes to right after). It must therefore be
quick, must not block, and must not call back into the registry: set a flag, write to a pipe,
send a signal to a process that is still the run's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sandcell.errors import ConfigError


class Cancellation:
    """The cancellation state of one registered run."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None
        """Why the run was cancelled (set before its kill is called), or None."""

    @property
    def cancelled(self) -> bool:
        return self.reason is not None


class RunRegistry:
    """Thread-safe map of run id → kill callback, for the runs in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[Callable[[], None], Cancellation]] = {}

    @contextmanager
    def register(self, run_id: str, kill: Callable[[], None]) -> Iterator[Cancellation]:
        """Make the run cancellable for the duration of the ``with`` block (see the module)."""
        cancellation = Cancellation()
        with self._lock:
            if run_id in self._runs:
                raise ConfigError(
                    f"run id {run_id!r} is already in flight on this backend; give each run "
                    "its own id"
                )
            self._runs[run_id] = (kill, cancellation)
        try:
            yield cancellation
        finally:
            with self._lock:
                del self._runs[run_id]

    def cancel_all(self, reason: str) -> int:
        """Cancel every run in flight; returns how many were told to stop.

        A run already cancelled keeps its first reason, but its kill is called again. A kill
        that raises does not spare the runs after it; the first error is raised at the end.
        """
        error: Exception | None = None
        with self._lock:
            for kill, cancellation in self._runs.values():
                if cancellation.reason is None:
                    cancellation.reason = reason
                try:
                    kill()
                except Exception as exc:
                    error = error or exc
            count = len(self._runs)
        if error is not None:
            raise error
        return count

    def cancel(self, run_id: str, reason: str) -> bool:
        """Cancel one run if it is in flight; False when it is not registered (now)."""
        with self._lock:
            found = self._runs.get(run_id)
            if found is None:
                return False
            kill, cancellation = found
            if cancellation.reason is None:
                cancellation.reason = reason
            kill()
        return True

    def in_flight(self) -> tuple[str, ...]:
        """The ids of the runs registered now."""
        with self._lock:
            return tuple(self._runs)


__all__ = ["Cancellation", "RunRegistry"]
