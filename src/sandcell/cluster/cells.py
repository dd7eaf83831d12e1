"""The session sandboxes of one node, held by its agent for the replicas that opened them.

A session (:mod:`sandcell.sessions.session`) stays in the replica that opened it, with its policy,
records and watchdog; only its sandbox is here, reached by its session id. Each call is what the
replica's :class:`~sandcell.cluster.remote_cell.RemoteCellSandbox` was asked, done on the live
sandbox; exports and rich outputs land in the node's store and travel back as bytes when the
replica's store is another directory. A session holds no slot: it is idle most of its life, and
runs are what slots bound.

A sandbox nobody touches ends here on its own: its session's idle timeout travels with it, and
a sandbox no call has reached for that long (plus :data:`IDLE_GRACE_S`) is torn down. While its
replica lives the session's own watchdog ends it first (and samples it every few seconds, which
touches it); when the replica is gone and no other replica sweeps it, this is what ends it.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sandcell.artifacts import ArtifactStore, ExportLimits, collect_exports
from sandcell.backends.base import Backend, Collector, OutputSink
from sandcell.backends.cell import CellSandbox, open_cell_sandbox
from sandcell.backends.cell.state import PauseMode, SandboxMetrics, SavedState
from sandcell.backends.cell.verdict import CellCancel
from sandcell.cluster.bundles import staging_dir, unpack
from sandcell.cluster.wire import CellJob, CellReply, Collected, SessionFacts, SessionJob, Shown
from sandcell.errors import ConfigError, InfraError
from sandcell.sessions.session import DEFAULT_IDLE_TIMEOUT_S
from sandcell.spec import Artifact

log = logging.getLogger(__name__)


IDLE_GRACE_S = 10.0
"""Beyond a session's idle timeout before its untouched sandbox ends here: the replica's
watchdog, which ends it at its idle timeout, must come first (its samples, every few
seconds, touch it while the replica lives). ``$SANDCELL_CLUSTER_IDLE_GRACE_S`` on the node
sets another figure."""
IDLE_GRACE_ENV = "SANDCELL_CLUSTER_IDLE_GRACE_S"


def configured_idle_grace_s() -> float:
    """:data:`IDLE_GRACE_S`, or ``$SANDCELL_CLUSTER_IDLE_GRACE_S`` when set to a number (a
    test's cluster waits a second, not ten, for an orphaned session to end)."""
    try:
        return max(0.0, float(os.environ.get(IDLE_GRACE_ENV, IDLE_GRACE_S)))
    except ValueError:
        return IDLE_GRACE_S


_REAP_EVERY_S = 1.0


@dataclass(kw_only=True)
class _Live:
    sandbox: CellSandbox
    staged: Path
    idle_s: float
    grace_s: float
    cancel: CellCancel | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    touched: float = field(default_factory=time.monotonic)
    """When a call last reached it (guarded by the sessions' lock)."""

    def stale(self, now: float) -> bool:
        return now - self.touched > self.idle_s + self.grace_s


class NodeSessions:
    """The live session sandboxes of this node, by session id; thread-safe."""

    def __init__(
        self, store: ArtifactStore, store_id: str, home: Path, where: Mapping[str, str]
    ) -> None:
        """``where``: the node's id and home, named in each cell's record."""
        self._where = dict(where)
        self._store = store
        self._store_id = store_id
        self._home = home
        self._grace_s = configured_idle_grace_s()
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.reaped = 0
        """Sandboxes ended here because nobody touched them for their idle timeout."""
        threading.Thread(
            target=self._reap_loop, name="sandcell-session-reaper", daemon=True
        ).start()

    def count(self) -> int:
        with self._lock:
            return len(self._live)

    def open(self, backend: Backend, job: SessionJob) -> SessionFacts:
        """Open and start the sandbox of ``job``; its facts for the replica."""
        with self._lock:
            if job.session_id in self._live:
                raise ConfigError(f"session {job.session_id} already has a sandbox on this node")
        staged = staging_dir(self._home, "session", job.session_id)
        request = job.request
        try:
            if job.bundles:
                moved: dict[str, Path] = {}
                for i, bundle in enumerate(job.bundles):
                    (staged / str(i)).mkdir(parents=True)
                    name = Path(bundle.path).name or "in"
                    moved[bundle.path] = unpack(bundle, staged / str(i) / name)
                request = replace(
                    request,
                    inputs=tuple(
                        replace(i, host_path=moved.get(str(i.host_path), i.host_path))
                        for i in request.inputs
                    ),
                    packages=tuple(moved.get(str(p), p) for p in request.packages),
                )
            sandbox = open_cell_sandbox(
                backend,
                request,
                session_id=job.session_id,
                sockets=job.sockets,
                restore=job.restore,
            )
            sandbox.start()
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        idle_s = job.idle_timeout_s if job.idle_timeout_s is not None else DEFAULT_IDLE_TIMEOUT_S
        with self._lock:
            self._live[job.session_id] = _Live(
                sandbox=sandbox, staged=staged, idle_s=idle_s, grace_s=self._grace_s
            )
        return SessionFacts(
            enforcement=sandbox.enforcement(),
            pause_modes=sandbox.pause_modes,
            run_dir=str(sandbox.run_dir),
            sandbox_pid=sandbox.sandbox_pid,
            versions={**backend.versions(), **self._where},
        )

    def _get(self, session_id: str) -> _Live:
        with self._lock:
            live = self._live.get(session_id)
            if live is not None:
                live.touched = time.monotonic()
        if live is None:
            raise InfraError(
                f"session {session_id} has no sandbox on this node any more (its agent was "
                "restarted, or the session ended)"
            )
        return live

    def cell(self, job: CellJob, sink: OutputSink | None) -> CellReply:
        live = self._get(job.session_id)
        with live.lock:
            live.cancel = CellCancel()
            deadline = (
                time.monotonic() + job.deadline_in_s if job.deadline_in_s is not None else None
            )
            try:
                cell = live.sandbox.run_cell(
                    job.code,
                    timeout_s=job.timeout_s,
                    hard_deadline=deadline,
                    cancel=live.cancel,
                    on_output=sink,
                    scope=job.scope,
                )
            finally:
                live.cancel = None
            return CellReply(cell=cell, ended=live.sandbox.ended)

    def cancel(self, session_id: str, reason: str) -> bool:
        with self._lock:
            live = self._live.get(session_id)
        cancel = live.cancel if live is not None else None
        if cancel is None:
            return False
        cancel.request(reason)
        return True

    def files(self, session_id: str) -> list[str]:
        live = self._get(session_id)
        with live.lock:
            return live.sandbox.files()

    def export(
        self, session_id: str, globs: Sequence[str], limits: ExportLimits, store_id: str
    ) -> Collected:
        live = self._get(session_id)
        with live.lock:
            artifacts, rejected = live.sandbox.export(globs, self._collector(globs, limits))
            ended = live.sandbox.ended
        return Collected(
            artifacts=artifacts,
            rejected=rejected,
            blobs=self._blobs(artifacts, store_id),
            ended=ended,
        )

    def outputs(self, session_id: str, out_dir: str, store_id: str) -> Shown:
        live = self._get(session_id)
        with live.lock:
            shown = live.sandbox.outputs(out_dir, self._store)
        found = tuple(a for o in shown.outputs for a in o.artifacts)
        return Shown(collection=shown, blobs=self._blobs(found, store_id))

    def save(
        self, session_id: str, state_dir: Path, mode: PauseMode, keep_running: bool
    ) -> SavedState:
        live = self._get(session_id)
        with live.lock:
            return live.sandbox.save(state_dir, mode=mode, keep_running=keep_running)

    def metrics(self, session_id: str) -> tuple[SandboxMetrics, str | None]:
        live = self._get(session_id)
        return live.sandbox.metrics(), live.sandbox.ended

    def teardown(
        self, session_id: str, globs: Sequence[str], limits: ExportLimits, store_id: str
    ) -> Collected:
        with self._lock:
            live = self._live.pop(session_id, None)
        if live is None:
            return Collected(artifacts=(), rejected=(), blobs={}, ended="closed")
        try:
            with live.lock:
                collect = self._collector(globs, limits) if globs else None
                artifacts, rejected = live.sandbox.teardown(globs, collect)
        finally:
            shutil.rmtree(live.staged, ignore_errors=True)
        return Collected(
            artifacts=artifacts,
            rejected=rejected,
            blobs=self._blobs(artifacts, store_id),
            ended=live.sandbox.ended,
        )

    def end(self, session_id: str) -> bool:
        """End the sandbox of ``session_id`` with nothing exported (its replica is gone);
        whether there was one."""
        with self._lock:
            live = self._live.pop(session_id, None)
        if live is None:
            return False
        if live.cancel is not None:
            live.cancel.request("its replica was lost")
        try:
            with live.lock:
                live.sandbox.teardown()
        finally:
            shutil.rmtree(live.staged, ignore_errors=True)
        return True

    def reap(self) -> list[str]:
        """End the sandboxes no call has touched for their idle timeout (and the grace), but
        none a call is using now (a long cell touched it only when it began); their ids."""
        now = time.monotonic()
        with self._lock:
            stale = [(k, v) for k, v in self._live.items() if v.stale(now)]
        ended = []
        for session_id, live in stale:
            if not live.lock.acquire(blocking=False):
                continue  # a call holds it: not idle
            try:
                with self._lock:
                    # Touched meanwhile (a call waiting for its lock), or ended by its replica.
                    if self._live.get(session_id) is not live or not live.stale(time.monotonic()):
                        continue
                    del self._live[session_id]
                try:
                    live.sandbox.teardown()
                finally:
                    shutil.rmtree(live.staged, ignore_errors=True)
            finally:
                live.lock.release()
            ended.append(session_id)
        self.reaped += len(ended)
        return ended

    def _reap_loop(self) -> None:
        while not self._stop.wait(_REAP_EVERY_S):
            try:
                for session_id in self.reap():
                    log.warning(
                        "session %s: its sandbox was idle past its timeout, ended", session_id
                    )
            except Exception:  # the next round tries again; the agent must not lose its reaper
                log.exception("the session reaper failed")

    def close(self) -> None:
        """End every session sandbox here (the agent is going away)."""
        self._stop.set()
        with self._lock:
            live = list(self._live.values())
            self._live.clear()
        for one in live:
            one.sandbox.teardown()
            shutil.rmtree(one.staged, ignore_errors=True)

    def _collector(self, globs: Sequence[str], limits: ExportLimits) -> Collector:
        store = self._store
        return lambda view: collect_exports(view, tuple(globs), store, limits)

    def _blobs(self, artifacts: Sequence[Artifact], store_id: str) -> dict[str, bytes]:
        if store_id == self._store_id:
            return {}
        return {a.sha256: self._store.path_for(a.sha256).read_bytes() for a in artifacts}


__all__ = ["NodeSessions"]
