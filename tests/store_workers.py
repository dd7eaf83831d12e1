"""Bodies of the child processes of tests/unit/test_store_postgres.py: several sandcell
processes (replicas, nodes) on one PostgreSQL database (``$SANDCELL_DATABASE_URL``, inherited).

A module of their own so that each spawned child imports only the store it opens, not the test
module's imports (Alembic's script loader, the test harness): a child then starts in a fraction
of the time, which four of them on a loaded 2-core machine feel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

QUOTAS = {
    "max_concurrent": 2,
    "runs_per_minute": 10,
    "cpu_seconds_per_day": 60,
    "max_stored_bytes": 1 << 20,
}


class Barrier(Protocol):
    def wait(self, timeout: float | None = ...) -> int: ...


def append_many(home: str, worker: int, count: int, barrier: Barrier) -> None:
    """Its own AuditLog on the shared database, then ``count`` appends, started together with
    the other workers' so that their transactions interleave."""
    from sandcell.audit import AuditLog

    with AuditLog(Path(home) / "audit.sqlite3") as audit:
        barrier.wait()
        for i in range(count):
            audit.append({"run_id": f"w{worker}-{i:03d}", "worker": worker, "i": i})


def open_one_store(home: str, which: int, barrier: Barrier) -> None:
    """Open store number ``which`` (0-3) on a fresh database at the same moment as the other
    workers open theirs, and use it."""
    path = Path(home)
    barrier.wait()
    if which == 0:
        from sandcell.audit import AuditLog

        with AuditLog(path / "audit.sqlite3") as audit:
            audit.append({"run_id": "from-child"})
    elif which == 1:
        from sandcell.service.tenants import TenantStore

        with TenantStore(path / "service.sqlite3") as tenants:
            tenants.add("acme", profiles=["strict"], **QUOTAS)
    elif which == 2:
        from sandcell.agent.paused import PausedStore

        with PausedStore(path / "agent.sqlite3") as paused:
            paused.save("a1", {"question": "q"})
    else:
        from sandcell.policy.approvals import ApprovalStore

        with ApprovalStore(path / "approvals.sqlite3") as approvals:
            approvals.list()
