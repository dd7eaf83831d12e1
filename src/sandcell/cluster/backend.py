"""The backend of a replica whose runs go to the nodes of a Ray cluster.

:class:`ClusterBackend` is an ordinary :class:`~sandcell.backends.base.Backend` of one rung and
runtime: the executor's pipeline calls :meth:`~ClusterBackend.run` as it calls a local backend,
and everything around it (policy, approvals, validation, the record, redaction of the live and
final output) stays in the replica. The run itself goes to the node :class:`~sandcell.cluster.
fleet.Cluster` places it on: the node's agent runs it on its own backend of that rung, collects
the exports and rich outputs there, and streams the output back as it is written.

- Inputs and package directories the node cannot see (not under ``$SANDCELL_SHARED_DIR``, and
  the node is another machine) travel as bytes (:mod:`sandcell.cluster.bundles`).
- Artifacts travel back as bytes unless the node's store is this replica's (one shared
  directory, :mod:`sandcell.cluster.store_id`); each is stored here after its SHA-256 is checked.
- A run whose profile reaches outside has sockets in this process's directory: it goes only to
  the agent of this replica's own node, which sees that directory; else IsolationUnavailable.
- A node or agent that dies during a run ends it with InfraError ``node lost``: the pipeline
  records it once as ``infra_error``, and the node gets no more runs from this replica.
- A session's sandbox lives on a node too (:mod:`sandcell.cluster.remote_cell`); the session
  itself stays in the replica.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sandcell.artifacts import ArtifactStore, validate_globs
from sandcell.backends.base import BackendResult, Collector, OutputSink
from sandcell.cluster.bundles import PathBundle, pack, visible
from sandcell.cluster.fleet import Cluster, Member, lost_errors
from sandcell.cluster.wire import (
    CollectSpec,
    OutputPiece,
    RunFailure,
    RunJob,
    RunReply,
    SessionJob,
)
from sandcell.errors import InfraError
from sandcell.spec import RunRequest

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.backends.cell.state import RestorePoint
    from sandcell.backends.registry import BackendName
    from sandcell.backends.warm import WarmReport
    from sandcell.run_sockets import SandboxSockets

_CANCEL_TIMEOUT_S = 10.0
_STREAM_POLL_S = 1.0
"""How often a run waiting for its node's next word checks that the cluster is still there."""


class ClusterBackend:
    """Runs on ``rung`` in ``runtime``, each placed on a node of ``cluster``; thread-safe."""

    def __init__(
        self,
        cluster: Cluster,
        rung: BackendName,
        runtime: str,
        *,
        pinned: Mapping[str, str] | None = None,
    ) -> None:
        """``pinned``: the versions this backend reports whatever ran last (a session's, whose
        cells all run on its node)."""
        self.name: str = rung
        self._rung: BackendName = rung
        self._pinned = dict(pinned) if pinned is not None else None
        self.collects_elsewhere = True
        """Read by the pipeline: the workspace is on a node, and so is the collector."""
        self.runtime = runtime
        self._cluster = cluster
        self._lock = threading.Lock()
        self._in_flight: dict[str, Member] = {}
        self._last = threading.local()

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        """Run ``request`` on a node. ``collect`` (the replica's closure over a workspace of
        this host) is not called: the node collects what the request declares, under the
        cluster's export limits, into its own store."""
        del collect
        cluster = self._cluster
        self._last.versions = {"placement": "ray cluster"}
        with cluster.placed(self.name, self.runtime, own_node=sockets is not None) as member:
            # The record of a run that never comes back still names the node it was lost with.
            self._last.versions = {"placement": "ray cluster", "node_id": member.node_id}
            cluster.placed_run(run_id, member.node_id)
            job = RunJob(
                run_id=run_id,
                rung=self.name,
                runtime=self.runtime,
                request=request,
                bundles=self._bundles(request, member),
                collect=CollectSpec(
                    globs=validate_globs(request.exports),
                    display=request.display,
                    limits=cluster.export_limits,
                ),
                store_id=cluster.store_id,
                sockets=sockets,
                stream=on_output is not None,
            )
            with self._lock:
                self._in_flight[run_id] = member
            try:
                reply = self._drive(member, job, on_output)
            finally:
                with self._lock:
                    self._in_flight.pop(run_id, None)
        store_blobs(cluster.store, reply.blobs, f"run {run_id}")
        self._last.versions = dict(reply.versions)
        return reply.result

    def _bundles(self, request: RunRequest, member: Member) -> tuple[PathBundle, ...]:
        if member.node_id == self._cluster.own_node_id:
            return ()  # this host: the node sees the paths as they are
        shared = self._cluster.shared
        paths = [i.host_path for i in request.inputs] + list(request.packages)
        return pack(p for p in paths if not visible(p, shared))

    def _drive(self, member: Member, job: RunJob, on_output: OutputSink | None) -> RunReply:
        cluster = self._cluster
        ray = cluster.ray
        reply: RunReply | None = None
        try:
            for item in agent_items(cluster, member.actor.run.remote(job)):
                if item is UNREACHABLE:
                    raise self._lost(member, str(cluster.unreachable))
                if isinstance(item, OutputPiece):
                    if on_output is not None:
                        on_output(item.stream, item.data)
                elif isinstance(item, RunFailure):
                    raise item.error()
                elif isinstance(item, RunReply):
                    reply = item
        except lost_errors(ray) as exc:
            self._cluster.lost(member)
            if cluster.unreachable is None:
                # Ray says the same when only the connection broke (ActorUnavailableError):
                # the run may still be going there, with no one to hear its result. Told to
                # stop, should the agent be reachable again; nothing to wait for if it is gone.
                with contextlib.suppress(Exception):
                    member.actor.cancel.remote(job.run_id, "its replica lost contact with the node")
            raise self._lost(member, last_line(exc)) from None
        except ray.exceptions.RayTaskError as exc:
            raise InfraError(
                f"the sandcell agent of node {member.node_id} failed: {last_line(exc)}"
            ) from None
        if reply is None:
            raise InfraError(f"the sandcell agent of node {member.node_id} ended without a result")
        return reply

    @staticmethod
    def _lost(member: Member, why: str) -> InfraError:
        where = member.report.hostname if member.report else member.spec.address
        return InfraError(
            f"node lost: node {member.node_id} ({where}) or its sandcell agent went away "
            f"during the run: {why}"
        )

    def pinned(self, versions: Mapping[str, str]) -> ClusterBackend:
        """This backend, reporting ``versions`` (those of a session's node) in every record."""
        return ClusterBackend(self._cluster, self._rung, self.runtime, pinned=versions)

    def node_of(self, run_id: str) -> str | None:
        """The node id of the run ``run_id`` while it is in flight from here, else None."""
        with self._lock:
            member = self._in_flight.get(run_id)
        return member.node_id if member is not None else None

    def versions(self) -> Mapping[str, str]:
        """The versions of the node backend that ran this thread's last run, and the node."""
        if self._pinned is not None:
            return self._pinned
        found: dict[str, str] | None = getattr(self._last, "versions", None)
        return found if found is not None else {"placement": "ray cluster"}

    def cancel(self, run_id: str, reason: str) -> bool:
        with self._lock:
            member = self._in_flight.get(run_id)
        if member is None:
            return False
        ray = self._cluster.ray
        try:
            told: bool = ray.get(
                member.actor.cancel.remote(run_id, reason), timeout=_CANCEL_TIMEOUT_S
            )
        except (*lost_errors(ray), ray.exceptions.GetTimeoutError):
            return False  # the node is gone: the run ends "node lost" by itself
        return told

    def cancel_all(self, reason: str) -> int:
        """Stop this replica's runs in flight on this rung (other replicas' runs stay)."""
        with self._lock:
            run_ids = list(self._in_flight)
        return sum(self.cancel(r, reason) for r in run_ids)

    def warm_stats(self) -> WarmReport | None:
        """None: warm pools are each node's (``sandcell cluster status`` shows them)."""
        return None

    def session_sandbox(
        self,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> CellSandbox:
        """A session's sandbox on a node (:class:`~sandcell.cluster.remote_cell.
        RemoteCellSandbox`, not started yet). It holds no slot; it goes to this replica's own
        node when its ways out are sockets here, or when it comes back from a state the other
        nodes do not see."""
        from sandcell.cluster.remote_cell import RemoteCellSandbox

        cluster = self._cluster
        here = sockets is not None or (
            restore is not None and not visible(restore.state_dir, cluster.shared)
        )
        member = cluster.take(self.name, self.runtime, own_node=here)
        cluster.give_back(member)  # placed by load now; a session is not a run in flight
        job = SessionJob(
            session_id=session_id,
            rung=self.name,
            runtime=self.runtime,
            request=request,
            bundles=self._bundles(request, member),
            sockets=sockets,
            restore=restore,
        )
        return RemoteCellSandbox(self, cluster, member, job)

    def close(self) -> None:
        """Nothing of its own to close: the cluster's owner closes the cluster."""


UNREACHABLE = object()
"""What :func:`agent_items` yields last when the cluster became unreachable meanwhile."""


def agent_items(cluster: Cluster, stream: Any) -> Iterator[object]:
    """The items of an agent's streamed answer (a Ray streaming generator) as they come, then
    :data:`UNREACHABLE` and no more if the cluster's head goes away first: waited for in turns,
    since with the head gone Ray's own wait would have no end."""
    ray = cluster.ray
    while True:
        ready, _ = ray.wait([stream], timeout=_STREAM_POLL_S)
        if not ready:
            if cluster.unreachable is not None:
                yield UNREACHABLE
                return
            continue
        try:
            ref = next(stream)
        except StopIteration:
            return
        yield ray.get(ref)


def store_blobs(store: ArtifactStore, blobs: Mapping[str, bytes], what: str) -> None:
    """Put the run's artifacts into this replica's store, each checked against its SHA-256."""
    store.put_arrived(blobs, what=what)


def last_line(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).strip().splitlines() if x.strip()]
    return " | ".join(lines[-2:])[-400:] or type(exc).__name__


__all__ = ["UNREACHABLE", "ClusterBackend", "agent_items"]
