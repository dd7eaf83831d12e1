"""A session's sandbox on another node, as the session in the replica sees it.

:class:`RemoteCellSandbox` is a :class:`~sandcell.backends.cell.CellSandbox` whose every call goes
to the agent of the node that holds the live sandbox (:mod:`sandcell.cluster.cells`): the session
(policy, records, watchdog, the session's ways out) stays in the replica that opened it. Output
of a cell streams back as it is written; a cancel the session asks for reaches the node; exports
and rich outputs come back as bytes unless the node's store is the replica's.

When the node or its agent goes away, the sandbox is gone with it: the cell running then ends
``infra_error`` (``node lost: ...``), :attr:`RemoteCellSandbox.ended` says so and the session
ends; every later call but :meth:`~RemoteCellSandbox.teardown` raises InfraError.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sandcell.artifacts import ArtifactStore
from sandcell.backends.base import Backend, Collector, OutputSink
from sandcell.backends.cell import CellRun, CellScope, Exported
from sandcell.backends.cell.state import PauseMode, PauseRefused, SandboxMetrics, SavedState
from sandcell.cluster.backend import (
    UNREACHABLE,
    ClusterBackend,
    agent_items,
    last_line,
    store_blobs,
)
from sandcell.cluster.bundles import visible
from sandcell.cluster.fleet import Cluster, Member, lost_errors
from sandcell.cluster.wire import (
    CellJob,
    CellReply,
    Collected,
    OutputPiece,
    RunFailure,
    SessionFacts,
    SessionJob,
    Shown,
)
from sandcell.display import DisplayCollection
from sandcell.errors import InfraError
from sandcell.spec import Enforcement, Outcome, Usage

if TYPE_CHECKING:
    from sandcell.backends.cell.verdict import CellCancel

T = TypeVar("T")

_CANCEL_POLL_S = 0.05
"""How often a running cell's cancel is looked at (the session sets it from another thread)."""
_CALL_TIMEOUT_S = 300.0


class RemoteCellSandbox:
    """The live sandbox of session ``job.session_id`` on ``member``'s node. Not thread-safe,
    as the contract says: the session serialises its calls."""

    def __init__(
        self, backend: ClusterBackend, cluster: Cluster, member: Member, job: SessionJob
    ) -> None:
        self._backend: Backend = backend
        self._placing = backend
        self._cluster = cluster
        self._member = member
        self._job = job
        self._id = job.session_id
        self._facts: SessionFacts | None = None
        self._ended: str | None = None
        self._torn_down = False

    # -- properties ----------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def ended(self) -> str | None:
        return self._ended

    @property
    def sandbox_pid(self) -> int | None:
        """Its outermost process on the node's host (not this one's)."""
        return self._facts.sandbox_pid if self._facts is not None else None

    @property
    def run_dir(self) -> Path:
        """Its directory on the node's host (not this one's)."""
        return Path(self._facts.run_dir) if self._facts is not None else Path()

    @property
    def node_id(self) -> str:
        return self._member.node_id

    def bound_idle(self, idle_timeout_s: float) -> None:
        """Have the agent end the sandbox once untouched for ``idle_timeout_s`` (the
        session's own idle timeout; see cluster/cells.py): told before :meth:`start`."""
        self._job = replace(self._job, idle_timeout_s=idle_timeout_s)

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        """The node sandbox's modes where the node sees this replica's state directories (the
        shared directory, or this replica's own node); none otherwise."""
        if self._facts is None or not self._states_visible():
            return frozenset()
        return self._facts.pause_modes

    # -- the contract --------------------------------------------------------------------------

    def start(self) -> None:
        facts: SessionFacts = self._call(self._member.actor.session_open.remote(self._job))
        self._facts = facts
        # Every cell's record names the node and its backend's versions.
        self._backend = self._placing.pinned(facts.versions)

    def run_cell(
        self,
        code: str,
        *,
        timeout_s: float,
        hard_deadline: float | None,
        cancel: CellCancel | None = None,
        on_output: OutputSink | None = None,
        scope: CellScope | None = None,
    ) -> CellRun:
        self._alive()
        job = CellJob(
            session_id=self._id,
            code=code,
            timeout_s=timeout_s,
            deadline_in_s=hard_deadline - time.monotonic() if hard_deadline is not None else None,
            scope=scope,
            stream=on_output is not None,
        )
        ray = self._cluster.ray
        done = threading.Event()
        watcher = None
        if cancel is not None:
            watcher = threading.Thread(
                target=self._forward_cancel, args=(cancel, done), daemon=True
            )
            watcher.start()
        reply: CellReply | None = None
        try:
            for item in agent_items(self._cluster, self._member.actor.session_cell.remote(job)):
                if item is UNREACHABLE:
                    return self._lost_cell(InfraError(str(self._cluster.unreachable)))
                if isinstance(item, OutputPiece):
                    if on_output is not None:
                        on_output(item.stream, item.data)
                elif isinstance(item, RunFailure):
                    raise item.error()
                elif isinstance(item, CellReply):
                    reply = item
        except lost_errors(ray) as exc:
            return self._lost_cell(exc)
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
        if reply is None:
            raise InfraError(f"the agent of node {self.node_id} ended a cell without a result")
        self._ended = reply.ended
        return reply.cell

    def _forward_cancel(self, cancel: CellCancel, done: threading.Event) -> None:
        while not done.wait(_CANCEL_POLL_S):
            if cancel.reason is not None:
                try:
                    self._member.actor.session_cancel.remote(self._id, cancel.reason)
                except Exception:  # the node is gone: the cell ends "node lost" by itself
                    return
                return

    def enforcement(self) -> Enforcement:
        if self._facts is None:
            raise InfraError(f"session {self._id}'s sandbox was not started")
        return self._facts.enforcement

    def files(self) -> list[str]:
        self._alive()
        found: list[str] = self._call(self._member.actor.session_files.remote(self._id))
        return found

    def export(self, globs: Sequence[str], collect: Collector) -> Exported:
        """Export on the node, under the cluster's export limits (``collect``, a closure over
        this host's store, cannot run there)."""
        del collect
        self._alive()
        got: Collected = self._call(
            self._member.actor.session_export.remote(
                self._id, tuple(globs), self._cluster.export_limits, self._cluster.store_id
            )
        )
        store_blobs(self._cluster.store, got.blobs, f"session {self._id}")
        self._ended = got.ended
        return got.artifacts, got.rejected

    def outputs(self, out_dir: str, store: ArtifactStore) -> DisplayCollection:
        self._alive()
        shown: Shown = self._call(
            self._member.actor.session_outputs.remote(self._id, out_dir, self._cluster.store_id)
        )
        store_blobs(store, shown.blobs, f"session {self._id}")
        return shown.collection

    def save(self, state_dir: Path, *, mode: PauseMode, keep_running: bool) -> SavedState:
        self._alive()
        if not self._states_visible():
            raise PauseRefused(
                f"session {self._id}'s sandbox is on node {self.node_id}, which does not see "
                "this replica's state directory; set $SANDCELL_SHARED_DIR to a directory every "
                "node and replica mounts"
            )
        saved: SavedState = self._call(
            self._member.actor.session_save.remote(self._id, str(state_dir), mode, keep_running),
        )
        return saved

    def metrics(self) -> SandboxMetrics:
        self._alive()
        sample, ended = self._call(self._member.actor.session_metrics.remote(self._id))
        self._ended = ended
        metrics: SandboxMetrics = sample
        return metrics

    def teardown(self, globs: Sequence[str] = (), collect: Collector | None = None) -> Exported:
        del collect
        if self._torn_down or self._facts is None:
            self._torn_down = True
            return (), ()
        self._torn_down = True
        try:
            self._alive()
            got: Collected = self._call(
                self._member.actor.session_teardown.remote(
                    self._id, tuple(globs), self._cluster.export_limits, self._cluster.store_id
                )
            )
        except InfraError:
            if self._ended is not None and self._ended.startswith("node lost"):
                return (), ()  # gone with its node: nothing is left to remove
            raise
        store_blobs(self._cluster.store, got.blobs, f"session {self._id}")
        self._ended = self._ended or got.ended or "closed"
        return got.artifacts, got.rejected

    # -- helpers -------------------------------------------------------------------------------

    def _states_visible(self) -> bool:
        if self._member.node_id == self._cluster.own_node_id:
            return True
        return self._cluster.shared is not None and visible(
            self._cluster.store.root, self._cluster.shared
        )

    def _alive(self) -> None:
        if self._ended is None and not self._member.alive:
            # Its node was dropped (lost, or the whole cluster unreachable): no call may go
            # to a handle of a connection that may be gone.
            self._ended = (
                f"node lost: node {self.node_id} left this replica's view of the cluster "
                f"({self._cluster.unreachable or 'its agent went away'}), and session "
                f"{self._id}'s sandbox with it"
            )
        if self._ended is not None and self._ended.startswith("node lost"):
            raise InfraError(self._ended)

    def _call(self, ref: Any) -> Any:
        ray = self._cluster.ray
        try:
            value = ray.get(ref, timeout=_CALL_TIMEOUT_S)
        except lost_errors(ray) as exc:
            self._mark_lost(exc)
            raise InfraError(self._ended or "node lost") from None
        except ray.exceptions.GetTimeoutError:
            raise InfraError(
                f"the agent of node {self.node_id} did not answer within {_CALL_TIMEOUT_S:.0f} s"
            ) from None
        if isinstance(value, RunFailure):
            raise value.error()
        return value

    def _mark_lost(self, exc: BaseException) -> None:
        self._cluster.lost(self._member)
        where = self._member.report.hostname if self._member.report else self._member.spec.address
        self._ended = (
            f"node lost: node {self.node_id} ({where}) or its sandcell agent went away, and "
            f"session {self._id}'s sandbox with it: {last_line(exc)}"
        )

    def _lost_cell(self, exc: BaseException) -> CellRun:
        self._mark_lost(exc)
        reason = self._ended or "node lost"
        return CellRun(
            outcome=Outcome.INFRA_ERROR,
            reason=reason,
            exit_code=None,
            signal=None,
            stdout=b"",
            stderr=b"",
            stdout_truncated=False,
            stderr_truncated=False,
            usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
            out_dir=None,
            session_ended=reason,
        )


__all__ = ["RemoteCellSandbox"]
