"""What crosses Ray between a replica and a node agent: plain, picklable data only.

Nothing here holds a callable, a lock or an open file: a replica's collector (a closure over its
workspace path and store) cannot run on another machine, so the replica sends what the node needs
to build its own (:class:`CollectSpec`), and the node sends back what it collected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sandcell.artifacts import ExportLimits
from sandcell.backends.base import BackendResult
from sandcell.cluster.bundles import PathBundle
from sandcell.run_sockets import SandboxSockets
from sandcell.spec import RunRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectSpec:
    """What the node's collector does once the program has ended: the replica's pipeline would
    take the rich outputs (``display``) and export ``globs`` under ``limits``."""

    globs: tuple[str, ...]
    display: bool
    limits: ExportLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class RunJob:
    """One run sent to a node's agent."""

    run_id: str
    rung: str
    runtime: str
    request: RunRequest
    """As the replica's pipeline gave it; inputs and packages not under the shared directory
    name paths of the replica's host and travel in ``bundles``."""
    bundles: tuple[PathBundle, ...]
    """The contents of each host path of ``request`` that the node cannot see, by path."""
    collect: CollectSpec
    store_id: str
    """The identity of the replica's artifact store: the node sends artifact bytes back unless
    its own store has the same identity (they are one directory)."""
    sockets: SandboxSockets | None = None
    """Only for a run on the replica's own node: unix sockets in a directory of that host."""
    stream: bool = False
    """Send the output pieces while the program runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputPiece:
    """A piece of the program's output, as a backend's output sink is told it."""

    stream: str
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReply:
    """How a run on a node ended: the backend's result (exports and rich outputs collected
    there), the bytes of its artifacts when the stores differ, and where it ran."""

    result: BackendResult
    blobs: Mapping[str, bytes] = field(default_factory=dict)
    """SHA-256 → content of every artifact the result names (empty: one shared store)."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """The node backend's :meth:`~sandcell.backends.base.Backend.versions` and the node."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailure:
    """A run the node could not attempt, as the sandcell error it raised: sent as data because
    sandcell's errors do not all survive pickling (IsolationUnavailable takes three arguments)."""

    kind: Literal["config", "isolation", "infra"]
    message: str
    layer: str = ""
    reason: str = ""
    fix: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolReport:
    """One warm backend of a node: its rung, runtime, and how many starts wait ready."""

    rung: str
    runtime: str
    mode: str
    ready: int
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeReport:
    """What a node's agent advertises."""

    node_id: str
    hostname: str
    home: str
    pid: int
    rungs: tuple[str, ...]
    """The rungs this node runs: those its host probe passes (and, when the node names rungs
    with ``sandcell_rung_<rung>`` resources, only those of them)."""
    slots: int
    running: int
    queued: int
    pools: tuple[PoolReport, ...]
    runtimes: tuple[str, ...]
    """The runtimes built on the node (``sandcell runtime list`` there)."""
    store_id: str

    @property
    def free(self) -> int:
        return max(0, self.slots - self.running - self.queued)

    def to_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "home": self.home,
            "pid": self.pid,
            "rungs": list(self.rungs),
            "slots": self.slots,
            "free_slots": self.free,
            "running": self.running,
            "queued": self.queued,
            "pools": [
                {
                    "rung": p.rung,
                    "runtime": p.runtime,
                    "mode": p.mode,
                    "ready": p.ready,
                    "size": p.size,
                }
                for p in self.pools
            ],
            "runtimes": list(self.runtimes),
        }


__all__ = [
    "CollectSpec",
    "NodeReport",
    "OutputPiece",
    "PoolReport",
    "RunFailure",
    "RunJob",
    "RunReply",
]
