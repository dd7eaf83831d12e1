"""This service as one replica of several sharing a PostgreSQL database.

With ``$SANDCELL_DATABASE_URL`` set, :func:`replica_state` gives the service a
:class:`~sandcell.db.replicas.ReplicaState`: its quotas count across replicas, each run it
begins is noted until it is answered, and :class:`ReplicaWatch` keeps its heartbeat and sweeps
the replicas that stopped beating. A dead replica's unanswered runs are recorded here as
``infra_error`` ("replica lost"), each once (the audit log keeps one record per run id, so a
replica that comes back late cannot record it a second time), and their sandboxes are told to
stop: on a cluster, the node each was placed on (noted in the row once placed), or every node
when it was lost before its placement was noted. Its sessions' sandboxes that live in nodes'
agents are ended there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import TYPE_CHECKING

from sandcell.audit.record import utc_now
from sandcell.db.url import database_url
from sandcell.errors import AuditError, SandcellError, StoreUnavailable

if TYPE_CHECKING:
    from sandcell.db.replicas import LostRun, ReplicaState
    from sandcell.service.core import Service

__all__ = ["HEARTBEAT_S", "ReplicaWatch", "lost_run_record", "replica_state"]

log = logging.getLogger("sandcell.service")

HEARTBEAT_S = 2.0
"""How often a replica says it is alive (a replica is dead after DEAD_AFTER_S without)."""


def replica_state(*, address: str = "") -> ReplicaState | None:
    """This process's replica rows when the state is shared in PostgreSQL, else None;
    ``address``: where the other replicas reach it."""
    url = database_url()
    if url is None:
        return None
    from sandcell.db.replicas import ReplicaState

    state = ReplicaState(url, address=address)
    state.register()
    return state


def lost_run_record(lost: LostRun) -> dict[str, object]:
    """The record of a run whose replica died before answering it: what is known of it (its
    code, when it began, where it ran), an ``infra_error`` outcome and no output."""
    empty = hashlib.sha256(b"").hexdigest()
    where = f" on node {lost.node}" if lost.node else ""
    return {
        "run_id": lost.run_id,
        "started_at": lost.started_at,
        "finished_at": utc_now(),
        "code": lost.code,
        "code_sha256": hashlib.sha256(lost.code.encode()).hexdigest(),
        "language": lost.language,
        "outcome": "infra_error",
        "reason": (
            f"replica lost: the service replica {lost.replica} that ran it{where} stopped "
            "answering before the run finished; its sandbox was told to stop"
        ),
        "exit_code": None,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "stdout_sha256": empty,
        "stderr_sha256": empty,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "artifacts": [],
        "rejected_exports": [],
        "outputs": [],
        "lost": {"replica": lost.replica, "node": lost.node},
    }


class ReplicaWatch:
    """The heartbeat and the sweep of one replica (an asyncio task of the service)."""

    def __init__(
        self, service: Service, state: ReplicaState, interval_s: float | None = None
    ) -> None:
        self._service = service
        self._state = state
        # Several beats within the time that makes a replica dead: a beat late by a moment
        # (a busy machine, a slow commit) must not get a live replica swept by another.
        self._interval_s = (
            interval_s if interval_s is not None else min(HEARTBEAT_S, state.dead_after_s / 3)
        )
        self._task: asyncio.Task[None] | None = None
        self.swept = 0
        """Runs of dead replicas this replica recorded as lost."""
        self.ended_sessions = 0
        """Sandboxes of dead replicas' sessions this replica ended on their nodes."""
        self._missed = False
        self._sweep_from = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(SandcellError):
            await asyncio.to_thread(self._state.leave)

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.beat)
            except SandcellError as exc:
                # The database is down or restarting: beat again next time; the rows come back.
                log.warning("replica %s: heartbeat failed: %s", self._state.id, exc)
            await asyncio.sleep(self._interval_s)

    def beat(self) -> None:
        """One heartbeat, then record the runs of the replicas found dead."""
        try:
            self._state.heartbeat()
        except SandcellError:
            self._missed = True
            raise
        now = time.monotonic()
        if self._missed:
            # The database was unreachable: every replica's beats were missed alike, so each
            # looks dead until it beats again. Sweep only once they all had the time to.
            self._missed = False
            self._sweep_from = now + self._state.dead_after_s
        if now < self._sweep_from:
            return
        swept = self._state.sweep(self.record_lost)
        cluster = self._service.cluster
        for lost in swept.runs:
            # Told to stop once the records are in (the node may run it still).
            why = f"its replica {lost.replica} was lost"
            if cluster is not None:
                told = cluster.cancel_run(lost.run_id, why, node=lost.node)
            else:
                told = self._service.executor.cancel(lost.run_id, why)
            self.swept += 1
            log.warning(
                "run %s of replica %s recorded as lost%s",
                lost.run_id,
                lost.replica,
                "; its sandbox was told to stop" if told else "",
            )
        for place in swept.sessions:
            # Its sandbox lives on in a node's agent, which no one else can reach: ended there.
            if cluster is not None and cluster.end_session(place.node, place.session_id):
                self.ended_sessions += 1
                log.warning(
                    "session %s of replica %s ended on node %s",
                    place.session_id,
                    place.replica,
                    place.node,
                )

    def record_lost(self, lost: LostRun) -> None:
        """Record ``lost`` (inside the sweep's transaction: a failure here keeps the run for
        the next sweep) and give it to its tenant."""
        try:
            self._service.executor.audit.append(lost_run_record(lost))
        except AuditError as exc:
            if "already in the audit log" not in str(exc):
                raise
            # Recorded already: by its replica after all (it came back late), or by an earlier
            # sweep whose transaction did not commit. One record stays.
        try:
            self._service.tenants.own(lost.tenant, "run", [lost.run_id])
        except StoreUnavailable:
            raise  # the next sweep gives it to its tenant
        except SandcellError as exc:  # the tenant is gone: the record stays, owned by none
            log.warning(
                "run %s lost: cannot give it to tenant %s: %s", lost.run_id, lost.tenant, exc
            )
