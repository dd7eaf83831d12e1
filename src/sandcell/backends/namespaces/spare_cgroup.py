"""A cgroup made ahead for the next cold run, so that starting a run does not wait on the host.

Creating a run's cgroup takes the kernel's cgroup lock once per controller (three directories on
cgroup v1), which every other cgroup change on the host also takes: on a busy host it is the
slowest step of preparing a run (measured at 6-10 ms on the shared development host, against a
few tenths of a millisecond when it is quiet). :class:`SpareCgroup` keeps one empty group,
created on a background thread with the limits of the last run served; a run takes it, limits
rewritten where its own differ (as a pooled warm sandbox's are, ``warm_limits.py``), and the next
one is made while the run runs. A run that finds none creates its own as before.

A spare group holds no process and has counted nothing (CPU time, peak memory, OOM and pids
events all start at zero), so a run's usage reads the same as from a group made for it. While it
waits it is named like the groups prepared ahead for warm sandboxes (``<owner>.w<id>-<id>``); a
run renames it to the name its own group would have had (``<owner>.<run id>``), a rename being
one short step under the lock where creating is several. cgroup v2 cannot rename a group, so
only v1 hosts keep a spare (v2 hosts could start the sandbox in its group with
``CLONE_INTO_CGROUP`` instead). The sweep removes a spare whose supervisor died, and
:meth:`SpareCgroup.close` otherwise.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from pathlib import Path

from sandcell.backends.namespaces import cgroups, workspace
from sandcell.backends.namespaces.template import Armed
from sandcell.backends.namespaces.warm_limits import PoolLimits
from sandcell.errors import InfraError, IsolationUnavailable
from sandcell.spec import Limits

__all__ = ["SpareCgroup"]


class SpareCgroup:
    """At most one cgroup waiting for the next cold run (thread-safe)."""

    def __init__(self, host: cgroups.CgroupHost) -> None:
        self._host = host
        self._limits = PoolLimits(host)
        self._lock = threading.Lock()
        self._spare: tuple[cgroups.RunCgroup, int, int] | None = None
        self._maker: threading.Thread | None = None
        self._wanted = threading.Event()
        self._closed = False
        self._prefix = f"{workspace.owner_tag()}.w{uuid.uuid4().hex[:8]}-cold-"

    @staticmethod
    def usable(host: cgroups.CgroupHost) -> bool:
        """Whether spares can be kept on ``host`` (a v1 hierarchy: groups can be renamed)."""
        return host.version == 1

    def waiting(self) -> str | None:
        """The name of the group waiting for the next run, or None while there is none (the
        maker may be part way through creating one)."""
        with self._lock:
            return None if self._spare is None else self._spare[0].name

    def take(self, limits: Limits, name: str) -> cgroups.RunCgroup:
        """A new, empty cgroup named ``name`` with ``limits``: the spare when there is one,
        else made now. Raises IsolationUnavailable as :meth:`RunCgroup.create` does."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            try:
                _rename(spare[0], name)
            except OSError:
                spare[0].remove()
                spare = None
        if spare is None:
            group = cgroups.RunCgroup(self._host, name)
            group.create(self._limits.settings(self._host, limits.memory_bytes, limits.max_pids))
            self._limits.fill = (limits.memory_bytes, limits.max_pids)
        else:
            group, memory_bytes, max_pids = spare
            armed = Armed(
                cgroup=group,
                landlock_abi=None,
                memory_bytes=memory_bytes,
                max_pids=max_pids,
                cpu_base_ms=0.0,
            )
            try:
                self._limits.retune(group, armed, limits)
            except InfraError as exc:
                group.remove()
                raise IsolationUnavailable(
                    "cgroups",
                    f"could not set the limits of cgroup {group.name}: {exc}",
                    "check that the cgroup hierarchy is writable (see `sandcell doctor`)",
                ) from exc
        self._refill()
        return group

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
        if spare is not None:
            spare[0].remove()

    def _refill(self) -> None:
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
            with self._lock:
                if not self._closed and self._spare is None:
                    self._spare = (group, memory_bytes, max_pids)
                    continue
            group.remove()


def _rename(group: cgroups.RunCgroup, name: str) -> None:
    """Rename ``group`` in every controller; on a failure part way, the ones renamed go back
    (the caller then removes the group under its old name)."""
    done: list[tuple[Path, Path]] = []
    try:
        for ctrl, old in group.dirs.items():
            new = old.with_name(name)
            os.rename(old, new)
            done.append((old, new))
            group.dirs[ctrl] = new
    except OSError:
        for old, new in reversed(done):
            with contextlib.suppress(OSError):
                os.rename(new, old)
        group.dirs = {c: b / group.name for c, b in group.host.bases.items()}
        raise
    group.name = name
