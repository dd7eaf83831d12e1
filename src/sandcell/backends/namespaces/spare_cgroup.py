"""A cgroup made ahead for the next cold run, so that starting a run does not wait on the host.

Creating a run's cgroup takes the kernel's cgroup lock once per controller (three directories on
cgroup v1), which every other cgroup change on the host also takes: on a busy host it is the
slowest step of preparing a run (measured at 6-10 ms on the shared development host, against a
few tenths of a millisecond when it is quiet). :class:`SpareCgroup` keeps one empty group,
created on a background thread with the limits of the last run served; a run takes it, limits
rewritten where its own differ (as a pooled warm sandbox's are, ``warm_limits.py``), and the next
one is made while the run runs. A run that finds none creates its own, and as root starts
its bwrap there through a spawner made for it (``spawner.spawner_in``).

A spare group holds no process but, as root, a spawner blocked in a read (``spawner.py``), so it
has counted nothing (CPU time, peak memory, OOM and pids events at zero, measured: the
spawner's pages stay charged where they were made), and a run's usage reads as from a group made
for it, plus bwrap's own share once the spawner becomes bwrap. It is
named like the groups prepared ahead for warm sandboxes (``<owner>.w<id>-cold-<id>``), and the
run keeps that name: renaming it to the run's id took the same cgroup lock once per controller
(a millisecond at the median on the development host, over 10 ms at the 90th percentile while
the previous run's group was being removed), which was the time the spare was meant to save.
The name still carries the owner, so the sweep finds the group of a dead supervisor; the run
record does not name cgroups. Only v1 hosts keep a spare (v2 hosts could start the sandbox in
its group with ``CLONE_INTO_CGROUP`` instead). The sweep removes a spare whose supervisor died,
and :meth:`SpareCgroup.close` otherwise.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from sandcell.backends.host import cgroups, workspace
from sandcell.backends.namespaces.spawner import EXTRA_PIDS, Spawner
from sandcell.backends.namespaces.template import Armed
from sandcell.backends.namespaces.warm_limits import PoolLimits
from sandcell.errors import InfraError, IsolationUnavailable
from sandcell.spec import Limits

__all__ = ["SpareCgroup", "Taken"]

_ALL: weakref.WeakSet[SpareCgroup] = weakref.WeakSet()
_ALL_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Taken:
    """A cgroup for one cold run, and the spawner waiting inside it (None: attach the sandbox)."""

    group: cgroups.RunCgroup
    spawner: Spawner | None


class SpareCgroup:
    """At most one cgroup waiting for the next cold run (thread-safe).

    ``spawner``: makes a :class:`~sandcell.backends.namespaces.spawner.Spawner`, started and
    moved into each spare as it is made (a spare whose spawner could not be is kept without).
    """

    def __init__(
        self, host: cgroups.CgroupHost, spawner: Callable[[], Spawner] | None = None
    ) -> None:
        self._host = host
        self._limits = PoolLimits(host)
        self._make_spawner = spawner
        self._extra = EXTRA_PIDS if spawner is not None else 0
        self._limits.fill = (self._limits.fill[0], self._limits.fill[1] + self._extra)
        self._lock = threading.Lock()
        self._spare: tuple[cgroups.RunCgroup, int, int, Spawner | None] | None = None
        self._maker: threading.Thread | None = None
        self._wanted = threading.Event()
        self._closed = False
        self._prefix = f"{workspace.owner_tag()}.w{uuid.uuid4().hex[:8]}-cold-"
        with _ALL_LOCK:
            _ALL.add(self)

    @staticmethod
    def usable(host: cgroups.CgroupHost) -> bool:
        """Whether spares are kept on ``host`` (v1 hierarchies only; see the module)."""
        return host.version == 1

    def waiting(self) -> str | None:
        """The name of the group waiting for the next run, or None while there is none (the
        maker may be part way through creating one)."""
        with self._lock:
            return None if self._spare is None else self._spare[0].name

    @staticmethod
    def waiting_anywhere() -> frozenset[str]:
        """The names of the groups waiting in every open SpareCgroup of this process (a leak
        check tells them from groups that runs left)."""
        with _ALL_LOCK:
            spares = list(_ALL)
        return frozenset(n for n in (s.waiting() for s in spares) if n is not None)

    @staticmethod
    def settled_anywhere() -> bool:
        """Whether no open SpareCgroup of this process is part way through making a spare
        (each has one waiting, or never made one)."""
        with _ALL_LOCK:
            spares = list(_ALL)
        for s in spares:
            with s._lock:
                if not s._closed and s._maker is not None and s._spare is None:
                    return False
        return True

    @staticmethod
    def held_fds_anywhere() -> frozenset[int]:
        """The descriptors this process holds for the spawners waiting in every open
        SpareCgroup (a leak check tells them from descriptors that runs left)."""
        with _ALL_LOCK:
            spares = list(_ALL)
        held: set[int] = set()
        for s in spares:
            with s._lock:
                spawner = None if s._spare is None else s._spare[3]
                if spawner is not None:
                    held |= spawner.host_fds()
        return frozenset(held)

    def take(self, limits: Limits, name: str) -> cgroups.RunCgroup:
        """A new, empty cgroup with ``limits``: the spare (under the name it was made with) when
        there is one, else one named ``name`` made now. Raises IsolationUnavailable as
        :meth:`RunCgroup.create` does."""
        taken = self.take_ready(limits, name, command=None)
        self.refill()
        return taken.group

    def take_ready(self, limits: Limits, name: str, *, command: list[str] | None) -> Taken:
        """As :meth:`take`, with the spare's spawner when it is alive and was made for the
        sandbox ``command`` (None: no spawner wanted); any other spawner is ended here.

        The next spare is made only once the caller calls :meth:`refill`: a run calls it once
        its sandbox is started, so the maker's Python does not take the interpreter lock from
        the run's own preparation."""
        with self._lock:
            spare, self._spare = self._spare, None
        spawner: Spawner | None = None
        if spare is None:
            group = cgroups.RunCgroup(self._host, name)
            group.create(self._limits.settings(self._host, limits.memory_bytes, limits.max_pids))
        else:
            group, memory_bytes, max_pids, spawner = spare
            if spawner is not None and (not spawner.alive() or spawner.command != command):
                spawner.discard()
                spawner = None
            armed = Armed(
                cgroup=group,
                landlock_abi=None,
                memory_bytes=memory_bytes,
                max_pids=max_pids,
                cpu_base_ms=0.0,
            )
            # With a spawner in the group, bwrap's own process counts too (see spawner.py).
            wanted = limits.with_(max_pids=limits.max_pids + (EXTRA_PIDS if spawner else 0))
            try:
                self._limits.retune(group, armed, wanted)
            except InfraError as exc:
                if spawner is not None:
                    spawner.discard()
                group.remove()
                raise IsolationUnavailable(
                    "cgroups",
                    f"could not set the limits of cgroup {group.name}: {exc}",
                    "check that the cgroup hierarchy is writable (see `sandcell doctor`)",
                ) from exc
        self._limits.fill = (limits.memory_bytes, limits.max_pids + self._extra)
        return Taken(group, spawner)

    def close(self) -> None:
        """Remove the spare; no other is made after this."""
        with self._lock:
            self._closed = True
            maker = self._maker
        self._wanted.set()
        if maker is not None:
            maker.join()
        with self._lock:
            spare, self._spare = self._spare, None
        with _ALL_LOCK:
            _ALL.discard(self)
        if spare is not None:
            if spare[3] is not None:
                spare[3].discard()
            spare[0].remove()

    def refill(self) -> None:
        """Have the next spare made (on the maker's thread) if none is waiting."""
        # One long-lived maker, woken by an event: starting a thread per run would wait for the
        # new thread to run first, which costs the run the time it was meant to save.
        with self._lock:
            if self._closed:
                return
            if self._maker is None:
                self._maker = threading.Thread(
                    target=self._make_loop, name="sandcell-spare-cgroup", daemon=True
                )
                self._maker.start()
        self._wanted.set()

    def _make_loop(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                if self._closed:
                    return
                if self._spare is not None:
                    continue
            memory_bytes, max_pids = self._limits.fill
            group = cgroups.RunCgroup(self._host, f"{self._prefix}{uuid.uuid4().hex[:12]}")
            try:
                group.create(self._limits.settings(self._host, memory_bytes, max_pids))
            except IsolationUnavailable:
                continue  # the next run creates its own, and reports why it could not
            # Without a spawner (it could not start) the group is still kept: its run moves
            # the sandbox in, and the take rewrites pids.max to the run's own limit.
            spawner = self._spawner_in(group)
            with self._lock:
                if not self._closed and self._spare is None:
                    self._spare = (group, memory_bytes, max_pids, spawner)
                    continue
            if spawner is not None:
                spawner.discard()
            group.remove()

    def _spawner_in(self, group: cgroups.RunCgroup) -> Spawner | None:
        """A spawner started and moved into ``group``, or None (none wanted, or it failed)."""
        if self._make_spawner is None:
            return None
        try:
            spawner = self._make_spawner()
        except InfraError:
            return None
        try:
            group.attach(spawner.pid)
        except OSError:
            spawner.discard()
            return None
        return spawner
