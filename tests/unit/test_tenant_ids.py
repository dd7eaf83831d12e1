"""The service's tenant store: ids that are never reused, approver keys, and a store made before
either existed (its tenants get ids; what they own and their CPU use move from names to ids).
The store runs against both databases (``store_backend``); the migration of an old SQLite file
is SQLite's alone (PostgreSQL's schema is kept by sandcell.db.migrations)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sandcell.service.tenants import TenantError, TenantStore, hash_key

pytestmark = pytest.mark.usefixtures("store_backend")

QUOTAS = {
    "max_concurrent": 2,
    "runs_per_minute": 10,
    "cpu_seconds_per_day": 60,
    "max_stored_bytes": 1 << 20,
}

# The schema of service.sqlite3 before tenant ids and approver keys (application id "SCSV").
_OLD_SCHEMA = (
    """CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        key_sha256 TEXT NOT NULL UNIQUE,
        profiles TEXT NOT NULL,
        max_concurrent INTEGER NOT NULL,
        runs_per_minute INTEGER NOT NULL,
        cpu_seconds_per_day INTEGER NOT NULL,
        max_stored_bytes INTEGER NOT NULL,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE owned (
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        size INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        PRIMARY KEY (kind, id, tenant)
    )""",
    "CREATE INDEX owned_by_tenant ON owned (tenant, kind, created_at)",
    """CREATE TABLE cpu_usage (
        tenant TEXT NOT NULL,
        day TEXT NOT NULL,
        cpu_ms REAL NOT NULL,
        PRIMARY KEY (tenant, day)
    )""",
)


def test_a_name_added_again_is_another_tenant(tmp_path: Path) -> None:
    with TenantStore(tmp_path / "service.sqlite3") as store:
        first, _ = store.add("acme", profiles=["strict"], **QUOTAS)
        store.own(first.id, "run", ["r1"])
        store.remove("acme")
        second, key = store.add("acme", profiles=["strict"], **QUOTAS)
        assert second.id != first.id and len(second.id) == 32
        assert not store.owns(second.id, "run", "r1")
        assert store.authenticate(key) == second
        assert store.by_id(first.id) is None


def test_approver_keys_authenticate_as_approvers_only(tmp_path: Path) -> None:
    with TenantStore(tmp_path / "service.sqlite3") as store:
        tenant, key = store.add("acme", profiles=["strict"], **QUOTAS)
        approver = store.add_approver("acme", "alice")
        assert approver.startswith("sca_")
        assert store.authenticate(approver) is None  # it runs nothing
        found = store.authenticate_principal(approver)
        assert found is not None and found.role == "approver" and found.tenant.id == tenant.id
        assert found.who == "approver:acme/alice"
        submitter = store.authenticate_principal(key)
        assert submitter is not None and submitter.role == "submitter"
        assert store.approvers(tenant.id) == ["alice"]
        with pytest.raises(TenantError, match="has an approver 'alice'"):
            store.add_approver("acme", "alice")
        store.remove_approver("acme", "alice")
        assert store.authenticate_principal(approver) is None
        assert store.principal_with_key(tenant.id, hash_key(approver)) is None


@pytest.mark.sqlite_only
def test_a_store_from_before_ids_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "service.sqlite3"
    conn = sqlite3.connect(path)
    for statement in _OLD_SCHEMA:
        conn.execute(statement)
    conn.execute("PRAGMA application_id = 1396921174")  # 0x53435356
    conn.execute(
        "INSERT INTO tenants VALUES ('acme', ?, '[\"strict\"]', 2, 10, 60, 1048576, 'then')",
        (hash_key("sc_old-key"),),
    )
    conn.execute("INSERT INTO owned VALUES ('run', 'r1', 'acme', 0, 'then')")
    conn.execute("INSERT INTO owned VALUES ('artifact', 'a1', 'acme', 100, 'then')")
    conn.execute("INSERT INTO cpu_usage VALUES ('acme', '2026-01-01', 5.0)")
    conn.commit()
    conn.close()
    with TenantStore(path) as store:
        tenant = store.authenticate("sc_old-key")
        assert tenant is not None and tenant.name == "acme" and len(tenant.id) == 32
        assert store.owns(tenant.id, "run", "r1")
        assert not store.owns("acme", "run", "r1")
        assert store.stored_bytes(tenant.id) == 100
        assert store.add_approver("acme", "alice").startswith("sca_")
    with TenantStore(path) as again:  # opened again: nothing moves twice
        assert again.get("acme").id == tenant.id
        assert again.owns(tenant.id, "run", "r1")
