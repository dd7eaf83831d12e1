"""Warm starts as every rung sees them: what a caller asks for (:class:`WarmConfig`) and what a
backend's template and pool report (:class:`WarmStats`, :class:`PoolStats`; gVisor's pool of
whole sandboxes :class:`SandboxPoolStats`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sandcell.errors import ConfigError
from sandcell.spec import DEFAULT_RUNTIME

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmConfig:
    """How python runs start: from a template, or from a pool of children forked ahead."""

    mode: Literal["template", "pool"] = "template"
    """``template``: fork at call time; ``pool``: take a child forked ahead of time."""
    preload: tuple[str, ...] = ("numpy", "pandas")
    """Modules the template imports once (trusted runtime code, never the program's)."""
    pool_size: int = 4
    """Children kept waiting in ``pool`` mode."""
    start_timeout_s: float = 120.0
    """How long the template may take to import ``preload``."""
    take_timeout_s: float = 30.0
    """How long a run waits for a pooled child before it starts cold."""
    refill: bool = True
    """``pool`` mode: replace each child a run takes. False for a process that runs one program
    (``sandcell run``): the pool is filled once, ahead of the run, and a replacement would only
    take CPU from that run and be destroyed unused (the microVM and gVisor pools honour it)."""
    runtime: str | None = None
    """The runtime (``sandcell runtime list``) the template or pool is made of; None:
    ``default``. A run in another runtime starts cold. ``preload`` names that the runtime does
    not have are left out, not an error (``minimal`` has no numpy)."""

    def __post_init__(self) -> None:
        if self.mode not in ("template", "pool"):
            raise ConfigError(f"warm start mode {self.mode!r}: choose 'template' or 'pool'")
        if isinstance(self.preload, str):
            raise ConfigError("preload is a tuple of module names, not one string")
        for name in self.preload:
            if not _MODULE.match(name):
                raise ConfigError(f"preload: {name!r} is not a module name")
        if not 1 <= self.pool_size <= 256:
            raise ConfigError(f"pool_size must be between 1 and 256, got {self.pool_size}")
        if self.start_timeout_s <= 0 or self.take_timeout_s <= 0:
            raise ConfigError("warm start timeouts must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmStats:
    """What a backend's warm starts report: the namespaces template's, or a pool's."""

    mode: str
    template_id: str | None
    template_pid: int | None
    """Host pid of the template process (unchanged across runs while it lives)."""
    template_state: Mapping[str, Any]
    """The template's own report: threads, number of modules, sys.modules digest."""
    template_pss_bytes: int
    template_restarts: int
    runs: int
    fallbacks: int
    pool: PoolStats | None
    cgroup_prefix: str
    """Start of the names of this starter's pooled cgroups (the owner tag, then its own tag)."""
    node_pool: SandboxPoolStats | None = None
    """The namespaces pool of waiting Node sandboxes (JavaScript and TypeScript runs), if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStats:
    """A snapshot of the pool."""

    size: int
    """How many children the pool keeps waiting."""
    ready: int
    """How many are waiting now."""
    forked: int
    """Children forked since the pool started."""
    taken: int
    """Children handed to runs (each used once)."""
    discarded: int
    """Children destroyed unused (found dead, or the pool closed)."""
    refill_errors: int
    last_error: str | None
    idle_pss_bytes: int
    """PSS of all waiting children together."""
    idle_uss_bytes: int
    """USS (private pages) of all waiting children together."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxPoolStats:
    """What a pool of whole sandboxes started ahead reports (gVisor's: each is used once)."""

    mode: str
    template_id: str
    preload: tuple[str, ...]
    size: int
    ready: int
    started: int
    """Sandboxes started since the pool began."""
    taken: int
    """Sandboxes handed to runs (each used once)."""
    discarded: int
    """Sandboxes destroyed unused (found dead, or the pool closed)."""
    refill_errors: int
    last_error: str | None
    idle_memory_bytes: int
    """Memory charged to the waiting sandboxes' cgroups together (0 without cgroups)."""
    runtime: str = DEFAULT_RUNTIME
    """The runtime the pooled sandboxes mount (a request in another one starts cold)."""


WarmReport = WarmStats | SandboxPoolStats
"""What :meth:`~sandcell.backends.base.Backend.warm_stats` reports: a template's (and its pool's)
or a pool of whole sandboxes'."""


def idle_memory(pids: tuple[int, ...]) -> tuple[int, int]:
    """(PSS, USS) in bytes of these processes together, from smaps_rollup (0 where unreadable)."""
    pss = uss = 0
    for pid in dict.fromkeys(pids):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key == "Pss":
                        pss += int(rest.split()[0]) * 1024
                    elif key in ("Private_Clean", "Private_Dirty"):
                        uss += int(rest.split()[0]) * 1024
        except (OSError, ValueError):
            continue
    return pss, uss
