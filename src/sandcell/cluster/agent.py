"""The sandcell agent of one node: a Ray actor holding that node's backends and warm pools.

A replica (a ``sandcell serve`` process, or any Executor given a :class:`~sandcell.cluster.
fleet.Cluster`) keeps everything above the backend: policy, approvals, validation, the run's
record. It sends the agent a :class:`~sandcell.cluster.wire.RunJob` and the agent runs it on the
node's own backend of the rung asked for, exactly as a local backend would: the node's home
(``$SANDCELL_HOME`` where its ``ray start`` ran) holds its warm pools and its artifact store.

At most ``slots`` runs at once (the node's ``sandcell_slots`` resource); more wait here, in the
order a slot frees. The agent reserves no Ray resource itself: its runs are sandboxes, not Ray
work, and reserving the node's slots would keep ``sandcell batch --ray`` off it.
"""

from __future__ import annotations

import hashlib
import os
import queue
import shutil
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sandcell.artifacts import ArtifactStore, ExportLimits, collect_exports
from sandcell.backends.base import Backend, BackendResult, OutputSink
from sandcell.backends.cell.state import PauseMode, SandboxMetrics, SavedState
from sandcell.backends.registry import LADDER
from sandcell.backends.warm import WarmStats
from sandcell.cluster.bundles import staging_dir, unpack
from sandcell.cluster.cells import NodeSessions
from sandcell.cluster.store_id import store_identity
from sandcell.cluster.wire import (
    CellJob,
    CellReply,
    Collected,
    CollectSpec,
    NodeReport,
    OutputPiece,
    PoolReport,
    RunFailure,
    RunJob,
    RunReply,
    SessionFacts,
    SessionJob,
    Shown,
)
from sandcell.display import DisplayCollection, take_outputs
from sandcell.errors import ConfigError, InfraError, IsolationUnavailable, SandcellError
from sandcell.home import bulk_dir, data_dir
from sandcell.pipeline.backends import Backends
from sandcell.spec import Artifact, Enforcement, Outcome, RejectedExport, RunRequest

if TYPE_CHECKING:
    from sandcell.backends.warm import WarmConfig

T = TypeVar("T")

RUNG_RESOURCE = "sandcell_rung_"
"""Prefix of the custom resources by which a node names the rungs it offers
(``sandcell_rung_gvisor``); a node naming none offers every rung its host probe passes."""


def probed_rungs() -> tuple[str, ...]:
    """The rungs this host can run, as ``sandcell doctor`` decides it."""
    from sandcell.doctor import diagnose

    ok = {c.name.removeprefix("backend ") for c in diagnose().checks if c.ok}
    return tuple(r for r in LADDER if r in ok)


def offered_rungs(probed: tuple[str, ...], declared: tuple[str, ...]) -> tuple[str, ...]:
    """What a node offers: its probe's rungs, narrowed to those it declares (if it declares any).
    A declared rung the probe refuses is not offered: never a rung the host cannot enforce."""
    return tuple(r for r in probed if not declared or r in declared)


class _Collector:
    """The node's side of the pipeline's collector: rich outputs first, then the exports."""

    def __init__(self, spec: CollectSpec, store: ArtifactStore) -> None:
        self._spec = spec
        self._store = store
        self.shown: DisplayCollection | None = None

    def __call__(self, ws: Path) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
        if self._spec.display:
            # First, and the output directory goes with it: never exported as a file.
            self.shown = take_outputs(ws, self._store)
        if not self._spec.globs:
            return (), ()
        return collect_exports(ws, self._spec.globs, self._store, self._spec.limits)

    def merge(self, br: BackendResult) -> BackendResult:
        """``br`` with the rich outputs added, as the replica's pipeline adds its own."""
        if self.shown is None or br.outcome is Outcome.INFRA_ERROR:
            return br
        return replace(
            br,
            outputs=br.outputs + self.shown.outputs,
            rejected_exports=br.rejected_exports + self.shown.rejected,
        )


def failure_of(exc: SandcellError) -> RunFailure:
    if isinstance(exc, IsolationUnavailable):
        return RunFailure(
            kind="isolation", message=str(exc), layer=exc.layer, reason=exc.reason, fix=exc.fix
        )
    if isinstance(exc, ConfigError):
        return RunFailure(kind="config", message=str(exc))
    return RunFailure(kind="infra", message=str(exc))


class NodeAgent:
    """The body of the per-node actor (made a Ray actor by :mod:`sandcell.cluster.fleet`)."""

    def __init__(
        self, *, slots: int, declared_rungs: tuple[str, ...], warm: WarmConfig | None
    ) -> None:
        import ray

        _unblock_interrupt()
        self._home = data_dir()
        self._node_id = str(ray.get_runtime_context().get_node_id())
        self._store = ArtifactStore(bulk_dir(self._home) / "artifacts")
        self._store_id = store_identity(self._store.root)
        self._slots = slots
        self._rungs = offered_rungs(probed_rungs(), declared_rungs)
        self._backends = Backends(None, warm)
        self._built: dict[tuple[str, str], Backend] = {}
        self._cond = threading.Condition()
        self._running: dict[str, Backend] = {}
        self._queued: dict[str, str | None] = {}
        """Run id → None while it waits for a slot, the reason once cancelled there."""
        where = {"node_id": self._node_id, "node_home": str(self._home)}
        self._sessions = NodeSessions(self._store, self._store_id, self._home, where)

    # -- what a replica calls ------------------------------------------------------------------

    def describe(self) -> NodeReport:
        pools = []
        with self._cond:
            built = dict(self._built)
            running, queued = len(self._running), len(self._queued)
        for (rung, runtime), backend in sorted(built.items()):
            stats = backend.warm_stats()
            if stats is None:
                continue
            # A template's own pool (none in template mode), or gVisor's pool of sandboxes.
            pool = stats.pool if isinstance(stats, WarmStats) else stats
            ready, size = (pool.ready, pool.size) if pool is not None else (0, 0)
            pools.append(
                PoolReport(rung=rung, runtime=runtime, mode=stats.mode, ready=ready, size=size)
            )
        return NodeReport(
            node_id=self._node_id,
            hostname=socket.gethostname(),
            home=str(self._home),
            pid=os.getpid(),
            rungs=self._rungs,
            slots=self._slots,
            running=running,
            queued=queued,
            pools=tuple(pools),
            runtimes=_runtimes(),
            store_id=self._store_id,
            sessions=self._sessions.count(),
        )

    def prepare(self, rung: str, runtime: str) -> NodeReport:
        """Build the backend of ``rung`` in ``runtime`` now (its warm pool fills), so that the
        first run placed here does not pay for it."""
        _unblock_interrupt()  # a warm pool's processes start from here
        self._backend(rung, runtime)
        return self.describe()

    def run(self, job: RunJob) -> Iterator[OutputPiece | RunReply | RunFailure]:
        """Run ``job``: yields its output pieces (with ``job.stream``) as the program writes
        them, then one RunReply, or one RunFailure when it could not be attempted."""
        # ``yield from``: Ray streams the results of a method that is a generator function.
        yield from _streamed(
            lambda sink: self._run(job, sink if job.stream else None), f"sandcell-run-{job.run_id}"
        )

    # -- sessions (cluster/cells.py holds them) ------------------------------------------------

    def session_open(self, job: SessionJob) -> SessionFacts | RunFailure:
        return _answer(lambda: self._sessions.open(self._backend(job.rung, job.runtime), job))

    def session_cell(self, job: CellJob) -> Iterator[OutputPiece | CellReply | RunFailure]:
        """A cell: yields its output pieces (with ``job.stream``), then one CellReply."""
        yield from _streamed(
            lambda sink: self._sessions.cell(job, sink if job.stream else None),
            f"sandcell-cell-{job.session_id}",
        )

    def session_cancel(self, session_id: str, reason: str) -> bool:
        return self._sessions.cancel(session_id, reason)

    def session_files(self, session_id: str) -> list[str] | RunFailure:
        return _answer(lambda: self._sessions.files(session_id))

    def session_export(
        self, session_id: str, globs: tuple[str, ...], limits: ExportLimits, store_id: str
    ) -> Collected | RunFailure:
        return _answer(lambda: self._sessions.export(session_id, globs, limits, store_id))

    def session_outputs(self, session_id: str, out_dir: str, store_id: str) -> Shown | RunFailure:
        return _answer(lambda: self._sessions.outputs(session_id, out_dir, store_id))

    def session_save(
        self, session_id: str, state_dir: str, mode: PauseMode, keep_running: bool
    ) -> SavedState | RunFailure:
        return _answer(lambda: self._sessions.save(session_id, Path(state_dir), mode, keep_running))

    def session_metrics(self, session_id: str) -> tuple[SandboxMetrics, str | None] | RunFailure:
        return _answer(lambda: self._sessions.metrics(session_id))

    def session_teardown(
        self, session_id: str, globs: tuple[str, ...], limits: ExportLimits, store_id: str
    ) -> Collected | RunFailure:
        return _answer(lambda: self._sessions.teardown(session_id, globs, limits, store_id))

    def session_end(self, session_id: str) -> bool:
        """End a session's sandbox whose replica is gone (a sweep found it in the directory);
        whether this node had it."""
        _unblock_interrupt()
        return self._sessions.end(session_id)

    def cancel(self, run_id: str, reason: str) -> bool:
        """Stop the run ``run_id`` if it waits or runs here; False when this node has no such
        run (a replica that does not know the node asks every agent)."""
        with self._cond:
            if run_id in self._queued:
                self._queued[run_id] = reason
                self._cond.notify_all()
                return True
            backend = self._running.get(run_id)
        return backend is not None and backend.cancel(run_id, reason)

    def close(self) -> None:
        self._sessions.close()
        for backend in self._backends.all():
            backend.close()

    # -- the run -------------------------------------------------------------------------------

    def _backend(self, rung: str, runtime: str) -> Backend:
        if rung not in self._rungs:
            raise IsolationUnavailable(
                rung,
                f"node {self._node_id} does not offer it "
                f"(it offers {', '.join(self._rungs) or 'none'})",
                "place the run on a node that offers it",
            )
        backend = self._backends.named(rung, runtime)
        with self._cond:
            self._built[(rung, runtime)] = backend
        return backend

    def _run(self, job: RunJob, sink: OutputSink | None) -> RunReply:
        backend = self._backend(job.rung, job.runtime)
        cancelled = self._take_slot(job.run_id, backend)
        if cancelled is not None:
            enforcement = Enforcement(backend=backend.name, layers={}, mode=job.request.mode)
            result = BackendResult.not_run(Outcome.KILLED, f"cancelled: {cancelled}", enforcement)
            return RunReply(result=result, versions=self._versions(backend))
        # The slot is held from here: every way out of the try gives it back.
        staged = staging_dir(self._home, "run", job.run_id)
        try:
            request = self._staged(job, staged)
            collector = _Collector(job.collect, self._store)
            result = backend.run(
                request,
                run_id=job.run_id,
                collect=collector,
                sockets=job.sockets,
                on_output=sink,
            )
            result = collector.merge(result)
        finally:
            with self._cond:
                self._running.pop(job.run_id, None)
                self._cond.notify_all()
            shutil.rmtree(staged, ignore_errors=True)
        blobs = {} if job.store_id == self._store_id else self._blobs(result)
        return RunReply(result=result, blobs=blobs, versions=self._versions(backend))

    def _take_slot(self, run_id: str, backend: Backend) -> str | None:
        """Wait for a free slot and hold it for ``run_id`` (released by :meth:`_run`); the
        reason instead when the run was cancelled while it waited."""
        with self._cond:
            self._queued[run_id] = None
            while len(self._running) >= self._slots and self._queued[run_id] is None:
                self._cond.wait()
            reason = self._queued.pop(run_id)
            if reason is None:
                self._running[run_id] = backend
            return reason

    def _staged(self, job: RunJob, where: Path) -> RunRequest:
        """The request with each bundled path written under ``where`` and named there."""
        if not job.bundles:
            return job.request
        moved: dict[str, Path] = {}
        for i, bundle in enumerate(job.bundles):
            (where / str(i)).mkdir(parents=True)
            moved[bundle.path] = unpack(bundle, where / str(i) / (Path(bundle.path).name or "in"))
        request = job.request
        inputs = tuple(
            replace(item, host_path=moved.get(str(item.host_path), item.host_path))
            for item in request.inputs
        )
        packages = tuple(moved.get(str(p), p) for p in request.packages)
        return replace(request, inputs=inputs, packages=packages)

    def _blobs(self, result: BackendResult) -> dict[str, bytes]:
        shas = {a.sha256 for a in result.artifacts}
        for output in result.outputs:
            shas.update(a.sha256 for a in output.artifacts)
        blobs = {}
        for sha in shas:
            data = self._store.path_for(sha).read_bytes()
            if hashlib.sha256(data).hexdigest() != sha:
                raise InfraError(f"artifact {sha} is damaged in the store of node {self._node_id}")
            blobs[sha] = data
        return blobs

    def _versions(self, backend: Backend) -> dict[str, str]:
        return {**backend.versions(), "node_id": self._node_id, "node_home": str(self._home)}


def _unblock_interrupt() -> None:
    """Let SIGINT through in this thread. Ray's worker threads block it, and a blocked mask is
    inherited by every process started from the thread, across exec: a sandbox started from one
    would hold SIGINT blocked, and a session's cell could not be interrupted (nor a program see
    SIGINT as it does on one machine)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _answer(call: Callable[[], T]) -> T | RunFailure:
    """``call()``, or the sandcell error it raised as data (see RunFailure)."""
    _unblock_interrupt()
    try:
        return call()
    except SandcellError as exc:
        return failure_of(exc)


def _streamed(
    call: Callable[[OutputSink], T], thread_name: str
) -> Iterator[OutputPiece | T | RunFailure]:
    """``call(sink)`` on a thread of its own, yielding what it tells the sink as it comes, then
    its return value (or its failure). The backend calls the sink from its own threads; a
    generator yields from one."""
    items: queue.SimpleQueue[OutputPiece | T | RunFailure] = queue.SimpleQueue()

    def sink(stream: str, data: bytes) -> None:
        items.put(OutputPiece(stream=stream, data=data))

    def body() -> None:
        _unblock_interrupt()
        try:
            items.put(call(sink))
        except SandcellError as exc:
            items.put(failure_of(exc))
        except Exception as exc:  # the replica must hear of it as a failure, not hang
            message = f"the node agent failed: {type(exc).__name__}: {exc}"
            items.put(RunFailure(kind="infra", message=message))

    threading.Thread(target=body, name=thread_name, daemon=True).start()
    while True:
        item = items.get()
        yield item
        if not isinstance(item, OutputPiece):
            return


def _runtimes() -> tuple[str, ...]:
    """The runtimes built on this node; none when its runtime store cannot be read."""
    from sandcell.runtimes.store import list_runtimes

    try:
        return tuple(s.manifest.name for s in list_runtimes())
    except (SandcellError, OSError):
        return ()


__all__ = ["RUNG_RESOURCE", "NodeAgent", "offered_rungs", "probed_rungs"]
