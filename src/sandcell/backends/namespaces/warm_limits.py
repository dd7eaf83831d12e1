"""The cgroup limits of pooled warm sandboxes: prepared ahead, rewritten at take where they differ.

A pooled child's cgroup is created with the limits of the last run served (a profile's runs
usually share them), so that a take rarely has a limit to rewrite.
"""

from __future__ import annotations

from sandcell.backends.host import cgroups
from sandcell.backends.namespaces.template import Armed
from sandcell.errors import InfraError
from sandcell.spec import Limits

__all__ = ["PoolLimits"]


class PoolLimits:
    """The limits the next pooled sandbox is prepared with, and the rewrite at take."""

    def __init__(self, host: cgroups.CgroupHost | None) -> None:
        self.swap = False if host is None else cgroups.swap_accounting(host)
        defaults = Limits()
        self.fill = (defaults.memory_bytes, defaults.max_pids)
        """(memory bytes, max pids) of the last run served."""

    def settings(
        self, host: cgroups.CgroupHost, memory_bytes: int, max_pids: int
    ) -> tuple[cgroups.CgroupSetting, ...]:
        """The writes that prepare a pooled sandbox's cgroup (with the :attr:`fill` the caller
        read once, so that its ``Armed`` record says what was written)."""
        return cgroups.plan_settings(
            host.version, memory_bytes=memory_bytes, max_pids=max_pids, swap_accounting=self.swap
        )

    def retune(self, cgroup: cgroups.RunCgroup, armed: Armed, limits: Limits) -> None:
        """Write the limits of this run where they differ from the prepared ones."""
        self.fill = (limits.memory_bytes, limits.max_pids)
        if (armed.memory_bytes, armed.max_pids) == self.fill:
            return
        host = cgroup.host
        settings = cgroups.plan_settings(
            host.version,
            memory_bytes=limits.memory_bytes,
            max_pids=limits.max_pids,
            swap_accounting=self.swap,
        )
        memory_files = ("memory.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        changed = [
            s
            for s in settings
            if not s.optional
            and (
                (s.file in memory_files and limits.memory_bytes != armed.memory_bytes)
                or (s.file == "pids.max" and limits.max_pids != armed.max_pids)
            )
        ]
        if limits.memory_bytes > armed.memory_bytes:
            # v1: memory+swap may never be below memory alone, so it grows first.
            changed.reverse()
        try:
            for s in changed:
                (cgroup.dirs[s.controller] / s.file).write_text(s.value)
        except OSError as exc:
            raise InfraError(f"could not set the limits of the pooled sandbox: {exc}") from exc
