"""What the tenant store counts for quotas: what each tenant owns (newest first, paged by key),
the bytes that count against ``max_stored_bytes`` and the CPU used today, against both databases
(``store_backend``): with PostgreSQL every replica reads the same counts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.service.tenants import Tenant, TenantStore

pytestmark = pytest.mark.usefixtures("store_backend")

QUOTAS = {
    "max_concurrent": 2,
    "runs_per_minute": 10,
    "cpu_seconds_per_day": 60,
    "max_stored_bytes": 1 << 20,
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TenantStore]:
    with TenantStore(tmp_path / "service.sqlite3") as s:
        yield s


@pytest.fixture
def tenant(store: TenantStore) -> Tenant:
    return store.add("acme", profiles=["strict"], **QUOTAS)[0]


def test_what_a_run_made_is_owned_and_counted(store: TenantStore, tenant: Tenant) -> None:
    other = store.add("other", profiles=["strict"], **QUOTAS)[0]
    store.record_run(
        tenant.id,
        runs=["r1"],
        approvals=["a1"],
        artifacts=[("sha-1", 100), ("sha-2", 20)],
        cpu_ms=1500.0,
    )
    store.record_run(tenant.id, runs=["r1"], approvals=[], artifacts=[], cpu_ms=500.5)
    store.set_size(tenant.id, "approval", "a1", 7)
    assert store.owns(tenant.id, "run", "r1") and not store.owns(other.id, "run", "r1")
    assert store.all_owned(tenant.id, "artifact") == {"sha-1", "sha-2"}
    assert store.stored_by_kind(tenant.id) == {"artifact": 120, "approval": 7}
    assert store.stored_bytes(tenant.id) == 127
    assert sorted(store.counted(tenant.id, "artifact")) == ["sha-1", "sha-2"]
    assert store.cpu_ms_today(tenant.id) == 2000.5
    assert store.usage(tenant.id) == (2000.5, 127)
    assert store.usage(other.id) == (0.0, 0)
    assert store.stored_by_kind(other.id) == {"artifact": 0, "approval": 0}
    assert store.disown(tenant.id, "artifact", "sha-2")
    assert not store.disown(tenant.id, "artifact", "sha-2")
    assert store.stored_bytes(tenant.id) == 107


def test_cpu_added_from_threads_is_all_counted(store: TenantStore, tenant: Tenant) -> None:
    def add() -> None:
        for _ in range(20):
            store.add_cpu(tenant.id, 1.5)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.cpu_ms_today(tenant.id) == 120.0
    store.add_cpu(tenant.id, -50.0)  # never negative: a clock step back is no refund
    assert store.cpu_ms_today(tenant.id) == 120.0


def test_owned_pages_newest_first_and_by_key(store: TenantStore, tenant: Tenant) -> None:
    # One call: the same created_at for all, so the order within it is the insertion order.
    store.own(tenant.id, "run", [f"r{i}" for i in range(5)])
    store.own(tenant.id, "run", ["r5", "r6"])
    store.own(tenant.id, "run", ["r6"])  # owned already: ignored
    newest = ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    assert store.owned(tenant.id, "run", limit=10) == newest
    assert store.owned(tenant.id, "run", limit=2, offset=3) == newest[3:5]
    assert store.owned_after(tenant.id, "run", after=None, limit=3) == newest[:3]
    assert store.owned_after(tenant.id, "run", after="r4", limit=3) == newest[3:6]
    assert store.owned_after(tenant.id, "run", after="r0", limit=3) == []
