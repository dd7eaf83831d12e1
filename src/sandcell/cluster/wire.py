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
from sandcell.backends.cell import CellRun, CellScope
from sandcell.backends.cell.state import PauseMode, RestorePoint
from sandcell.cluster.bundles import PathBundle
from sandcell.display import DisplayCollection
from sandcell.errors import ConfigError, InfraError, IsolationUnavailable, SandcellError
from sandcell.run_sockets import SandboxSockets
from sandcell.spec import Artifact, Enforcement, RejectedExport, RunRequest


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

    def error(self) -> SandcellError:
        """The error again, as the replica raises it."""
        if self.kind == "isolation":
            return IsolationUnavailable(self.layer, self.reason, self.fix)
        if self.kind == "config":
            return ConfigError(self.message)
        return InfraError(self.message)


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
    sessions: int = 0
    """Session sandboxes alive on the node (they hold no slot)."""

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
            "sessions": self.sessions,
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
    "CellJob",
    "CellReply",
    "CollectSpec",
    "Collected",
    "NodeReport",
    "OutputPiece",
    "PoolReport",
    "RunFailure",
    "RunJob",
    "RunReply",
    "SessionFacts",
    "SessionJob",
    "Shown",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionJob:
    """A session's sandbox to open on a node (``Backend.session_sandbox``'s arguments)."""

    session_id: str
    rung: str
    runtime: str
    request: RunRequest
    bundles: tuple[PathBundle, ...]
    sockets: SandboxSockets | None = None
    restore: RestorePoint | None = None
    idle_timeout_s: float | None = None
    """The session's idle timeout: the agent ends the sandbox once no call has touched it for
    that long (its replica is gone); None: the sessions' default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionFacts:
    """What a replica keeps of a session's sandbox on a node once it started."""

    enforcement: Enforcement
    pause_modes: frozenset[PauseMode]
    run_dir: str
    """The sandbox's directory on the node's host."""
    sandbox_pid: int | None
    """Its outermost process, on the node's host."""
    versions: Mapping[str, str]
    """The node backend's versions, and the node, for the records of the session's cells."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CellJob:
    """One cell for a session's sandbox on a node."""

    session_id: str
    code: str
    timeout_s: float
    deadline_in_s: float | None
    """The session's hard deadline as seconds from when the replica sent it (monotonic clocks
    are not comparable across machines)."""
    scope: CellScope | None
    stream: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CellReply:
    """How a cell ended on the node, and whether the sandbox lives on."""

    cell: CellRun
    ended: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Collected:
    """Files exported from a session's workspace on the node, with their bytes when the
    stores differ, and whether the sandbox lives on."""

    artifacts: tuple[Artifact, ...]
    rejected: tuple[RejectedExport, ...]
    blobs: Mapping[str, bytes]
    ended: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Shown:
    """A cell's rich outputs read on the node, with their artifacts' bytes when needed."""

    collection: DisplayCollection
    blobs: Mapping[str, bytes]
