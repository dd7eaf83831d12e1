"""Group commit: appends that arrive while one is being written go out together, in one
transaction, and each caller still returns only once its own record is committed.

The leader/follower scheme (as in database logs):

* a caller that finds no write in flight becomes the *leader*: it takes everything waiting (at
  least its own item), writes it through its ``write`` function, hands each waiter its outcome,
  then passes the lead to the first caller that arrived meanwhile, and returns its own outcome;
* a caller that finds a write in flight queues its item and sleeps until either its outcome is
  in or it has been handed the lead (then it writes the next batch, its own item included).

Nothing waits for a window: a lone caller writes at once, so grouping adds no latency; only the
callers already waiting when the writer becomes free share its next transaction. A batch is
written by ``write`` as one unit: it returns one outcome per item (a value, or the exception of
that item alone), or raises, and then every caller of the batch gets that exception.

The scheme is per process: a group must not cross ``fork()`` (its lock could be held by a
thread the child does not have), so :class:`SharedGroups` starts a forked child with none.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCommit", "SharedGroups", "Writer"]

T = TypeVar("T")
R = TypeVar("R")

Writer = Callable[[Sequence[T]], Sequence[R | BaseException]]
"""Writes a batch in one transaction: one outcome per item, in order, or raises for all."""


class _Waiter(Generic[T, R]):
    """One caller's item and, once the batch holding it is written, its outcome."""

    __slots__ = ("done", "error", "item", "leads", "result", "woken")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.done = False
        """The batch holding the item is over: ``result`` or ``error`` is its outcome."""
        self.leads = False
        """Set (before ``woken``) when the caller is handed the lead instead of an outcome."""
        # Held until the caller may go on: a bare lock costs a fraction of an Event, and most
        # callers (every lone one) never wait on it.
        self.woken = threading.Lock()
        self.woken.acquire()


class GroupCommit(Generic[T, R]):
    """Batches concurrent :meth:`submit` calls (see the module). Thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: list[_Waiter[T, R]] = []
        self._leader: _Waiter[T, R] | None = None
        """The caller writing, or chosen to write next: while there is one, newcomers queue."""

    def waiting(self) -> int:
        """How many items are queued (a leader's own until it takes them)."""
        with self._mutex:
            return len(self._queue)

    def submit(self, item: T, write: Writer[T, R]) -> R:
        """Have ``item`` written, alone or with others waiting, and return its outcome (or
        raise its error) once its batch is committed. ``write`` is used if this caller leads."""
        me: _Waiter[T, R] = _Waiter(item)
        try:
            with self._mutex:
                self._queue.append(me)
                if self._leader is None:
                    self._leader = me
                lead = self._leader is me
            if not lead:
                me.woken.acquire()
                lead = me.leads
        except BaseException:
            self._leave(me, write)
            raise
        if lead:
            self._lead(me, write)
        return self._outcome(me)

    def _leave(self, me: _Waiter[T, R], write: Writer[T, R]) -> None:
        """The caller was interrupted before its item was taken (Ctrl-C in the main thread):
        the group must not be left waiting on it. Chosen to lead, it writes the batch first;
        only queued, its item is withdrawn (nothing of it is written); in a batch being
        written, it leaves that write to finish without it."""
        with self._mutex:
            if me not in self._queue:
                return
            lead = self._leader is me
            if not lead:
                self._queue.remove(me)
        if lead:
            self._lead(me, write)

    def _lead(self, me: _Waiter[T, R], write: Writer[T, R]) -> None:
        """Write everything queued (``me``, the leader's own item, is among it), deliver the
        outcomes, and hand the lead to the first caller queued meanwhile, if any."""
        with self._mutex:
            batch, self._queue = self._queue, []
        try:
            outcomes = write([w.item for w in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} got {len(outcomes)} outcomes")
        except BaseException as e:
            # Whatever failed the batch (even an interrupt of the leader) is every waiter's.
            for w in batch:
                w.error = e
        else:
            for w, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    w.error = outcome
                else:
                    w.result = outcome
        finally:
            # Even when write raised: the lead passes on, so no queued caller sleeps forever.
            # Handed over under the mutex, so that _leave sees either the old leader or the new.
            with self._mutex:
                following = self._queue[0] if self._queue else None
                self._leader = following
                if following is not None:
                    following.leads = True
                    following.woken.release()
            for w in batch:
                w.done = True
                if w is not me:  # the leader never waits on its lock (it may be free already)
                    w.woken.release()

    @staticmethod
    def _outcome(me: _Waiter[T, R]) -> R:
        if me.error is not None:
            # The same exception object for every caller of a failed batch, as
            # concurrent.futures does for the waiters of one future.
            raise me.error
        if not me.done:
            raise RuntimeError("group commit: a caller was woken without an outcome")
        return me.result  # type: ignore[return-value]  # done without error: the write's value


class SharedGroups(Generic[T, R]):
    """The group of each place written to (a database, a file) in this process, so that several
    stores opened on the same place batch together; a group lives while a store holds it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._groups: weakref.WeakValueDictionary[str, GroupCommit[T, R]]
        self._groups = weakref.WeakValueDictionary()
        # The child of a fork() starts with none: the parent's could be mid-write (a leader
        # chosen, a mutex held) by a thread the child does not have.
        os.register_at_fork(after_in_child=self._forget)

    def get(self, key: str) -> GroupCommit[T, R]:
        """The group writing to ``key``."""
        with self._mutex:
            found = self._groups.get(key)
            if found is None:
                found = GroupCommit()
                self._groups[key] = found
            return found

    def _forget(self) -> None:
        self._mutex = threading.Lock()
        self._groups = weakref.WeakValueDictionary()
