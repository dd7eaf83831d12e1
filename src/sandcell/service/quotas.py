"""Per-tenant quotas: sandboxes at once, runs per minute, CPU seconds per day, stored bytes.

Stored bytes are what the service keeps for a tenant: artifacts, each run's stdin (kept by its
sha256 in the artifact store so that the run can be replayed, owned as an artifact), runs held
for approval (their stored request, stdin included, and their uploaded input files) until
they are decided, and its saved session states (paused sessions, snapshots; counted from the
executor's state store, which knows their owner). A submission is refused when what it may
leave stored would go over; a pause, snapshot or fork when its estimated size would.

On one machine, sandboxes at once and the rate window live in memory (a restart forgives a
minute's runs and ends every session anyway). With replicas sharing a PostgreSQL database they
are counted there, across every live replica (:class:`~sandcell.db.replicas.ReplicaState`), so
a tenant's limits hold whichever replica its requests reach. CPU per day and stored bytes live
in the service store. Over a quota, :meth:`Quotas.start` raises a 429 problem with
``Retry-After``.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sandcell.errors import StoreUnavailable
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant, TenantStore

if TYPE_CHECKING:
    from sandcell.db.replicas import ReplicaState

__all__ = ["Quotas"]

log = logging.getLogger("sandcell.service")

_WINDOW_S = 60.0


def _seconds_to_midnight_utc() -> int:
    now = dt.datetime.now(dt.UTC)
    midnight = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, math.ceil((midnight - now).total_seconds()))


def _too_many(detail: str, retry_after: int) -> ServiceProblem:
    return ServiceProblem(429, detail, headers={"Retry-After": str(max(1, retry_after))})


def _holding_too_many(tenant: Tenant, holding: int) -> str:
    return (
        f"tenant {tenant.name!r} holds {holding} sandboxes, its limit (max_concurrent "
        f"{tenant.max_concurrent}); wait for one to finish or close a session"
    )


def _started_too_many(tenant: Tenant, started: int, wait: int) -> str:
    return (
        f"tenant {tenant.name!r} started {started} runs in the last minute, its limit "
        f"(runs_per_minute {tenant.runs_per_minute}); retry in {wait} s"
    )


class Quotas:
    """The quota checks of every run, cell and session start."""

    def __init__(
        self,
        store: TenantStore,
        states: Callable[[str], int] | None = None,
        *,
        shared: ReplicaState | None = None,
    ) -> None:
        """``states(tenant_id)``: the bytes of the tenant's saved session states (None: it
        keeps none); ``shared``: count sandboxes and starts across the replicas there."""
        self._store = store
        self._shared = shared
        self._states = states or (lambda _: 0)
        self._lock = threading.Lock()
        self._holding: dict[str, int] = {}
        self._starts: dict[str, deque[float]] = {}
        self._unreleased: dict[str, int] = {}
        """Shared holds given back while the database was unreachable, by tenant: released
        there once it answers again (before the next admission), never dropped."""

    def holding(self, tenant: str) -> int:
        """Sandboxes the tenant (by id, as everything here) holds now (runs in flight and live
        sessions)."""
        if self._shared is not None:
            self._release_pending()
            return self._shared.holding(tenant)
        with self._lock:
            return self._holding.get(tenant, 0)

    def start(
        self,
        tenant: Tenant,
        *,
        sandbox: bool,
        adding: int = 0,
        settle: Callable[[], bool] | None = None,
    ) -> None:
        """Admit one run (``sandbox``: it takes a sandbox of its own, as a run or a session
        does; a session cell runs in its session's) or raise 429. ``adding``: the bytes the
        submission may leave stored (its stdin, kept with its record; its uploaded inputs,
        kept while it waits for approval), refused if they would go over the stored-bytes
        quota. ``settle``: called once when over that quota, to stop counting what is no
        longer kept (runs held for approval that were decided elsewhere, as on the host's
        command line); True if it freed anything, and the quota is checked again. Every
        admitted ``sandbox`` start is paired with one :meth:`release`."""
        cpu_ms, stored = self._store.usage(tenant.id)
        stored += self._states(tenant.id)
        if settle is not None and self._over(tenant, stored, adding) and settle():
            stored = self._store.stored_bytes(tenant.id) + self._states(tenant.id)
        self._check_stored(tenant, stored, adding)
        self._check_cpu(tenant, cpu_ms)
        if self._shared is not None:
            self._admit_shared(tenant, sandbox=sandbox)
            return
        now = time.monotonic()
        with self._lock:
            holding = self._holding.get(tenant.id, 0)
            if sandbox and holding >= tenant.max_concurrent:
                raise _too_many(_holding_too_many(tenant, holding), 1)
            starts = self._starts.setdefault(tenant.id, deque())
            while starts and starts[0] <= now - _WINDOW_S:
                starts.popleft()
            if len(starts) >= tenant.runs_per_minute:
                wait = math.ceil(starts[0] + _WINDOW_S - now)
                raise _too_many(_started_too_many(tenant, len(starts), wait), wait)
            starts.append(now)
            if sandbox:
                self._holding[tenant.id] = holding + 1

    def _admit_shared(self, tenant: Tenant, *, sandbox: bool) -> None:
        assert self._shared is not None
        self._release_pending()
        got = self._shared.admit(
            tenant.id,
            max_concurrent=tenant.max_concurrent,
            runs_per_minute=tenant.runs_per_minute,
            sandbox=sandbox,
        )
        if got.admitted:
            return
        if sandbox and got.holding >= tenant.max_concurrent:
            raise _too_many(_holding_too_many(tenant, got.holding), got.retry_after_s)
        raise _too_many(
            _started_too_many(tenant, got.started, got.retry_after_s), got.retry_after_s
        )

    def release(self, tenant: str) -> None:
        """Give back one sandbox of ``tenant``. Never raises for an unreachable database: the
        end of a run must not fail on it (its waiters would never hear), so the hold is kept
        here and given back there once the database answers."""
        if self._shared is not None:
            with self._lock:
                self._unreleased[tenant] = self._unreleased.get(tenant, 0) + 1
            self._release_pending()
            return
        with self._lock:
            left = self._holding.get(tenant, 0) - 1
            if left > 0:
                self._holding[tenant] = left
            else:
                self._holding.pop(tenant, None)

    def _release_pending(self) -> None:
        """Give back the shared holds released while the database was unreachable; those it
        still cannot take stay pending."""
        assert self._shared is not None
        while True:
            with self._lock:
                if not self._unreleased:
                    return
                tenant = next(iter(self._unreleased))
                left = self._unreleased.pop(tenant) - 1
                if left:
                    self._unreleased[tenant] = left
            try:
                self._shared.release(tenant)
            except StoreUnavailable as exc:
                with self._lock:
                    self._unreleased[tenant] = self._unreleased.get(tenant, 0) + 1
                log.warning("a sandbox of tenant %s is given back later: %s", tenant, exc)
                return

    def _check_cpu(self, tenant: Tenant, cpu_ms: float) -> None:
        used_s = cpu_ms / 1000.0
        if used_s >= tenant.cpu_seconds_per_day:
            raise _too_many(
                f"tenant {tenant.name!r} used {used_s:.1f} CPU seconds today (UTC), its limit "
                f"(cpu_seconds_per_day {tenant.cpu_seconds_per_day})",
                _seconds_to_midnight_utc(),
            )

    @staticmethod
    def _over(tenant: Tenant, stored: int, adding: int) -> bool:
        limit = tenant.max_stored_bytes
        return not (stored < limit and stored + adding <= limit)

    def _check_stored(self, tenant: Tenant, stored: int, adding: int) -> None:
        limit = tenant.max_stored_bytes
        if not self._over(tenant, stored, adding):
            return
        kept = self._store.stored_by_kind(tenant.id)
        what = (
            f"tenant {tenant.name!r} keeps {stored} bytes ({kept['artifact']} of artifacts and "
            f"kept stdin, {kept['approval']} of runs waiting for approval with their inputs, "
            f"{self._states(tenant.id)} of paused sessions and snapshots)"
        )
        if stored < limit:
            what += (
                f"; this would add about {adding} (its stdin and input files, or the session "
                "state it saves)"
            )
        raise _too_many(
            f"{what}, over its limit (max_stored_bytes {limit}). Free space: delete artifacts "
            "you no longer need with DELETE /v1/artifacts/{sha256} (a run's kept stdin is one, "
            "by the stdin_sha256 of its record), paused sessions (DELETE /v1/paused/{id}) and "
            "snapshots (DELETE /v1/snapshots/{name}), and approve or deny the runs waiting for "
            "approval (/v1/approvals); or send less",
            3600,
        )

    def check_stored(self, tenant: Tenant, adding: int) -> None:
        """Raise the stored-bytes 429 when ``adding`` more bytes would go over (a pause,
        snapshot or fork, before it saves)."""
        _, stored = self._store.usage(tenant.id)
        self._check_stored(tenant, stored + self._states(tenant.id), adding)
