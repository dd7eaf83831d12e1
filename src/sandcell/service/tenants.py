"""The service's tenants and what each owns, in one private SQLite file in the sandcell home.

A tenant is an id, a name, the SHA-256 of its API key, the profiles it may run under and its
quotas. Everything a tenant creates through the service (runs, run records, sessions, approvals,
artifacts) is mapped to it here, in the service's own table: the executor's stores know nothing
of tenants, and the service answers 404 for anything not mapped to the caller.

What the service keys by is the tenant's **id**, 16 random bytes made when the tenant is added
and never given to another: its name is for people, and a tenant removed and added again under
the same name is another tenant, which reaches nothing of the first (its live sessions, its
records, its quota counters, a run of the first still finishing).

A tenant may also have **approver keys** (``sandcell tenants add-approver``): they decide the
tenant's held runs and tool calls and do nothing else (no runs, no sessions). The tenant's own
key submits; whether it may also approve is its profile's choice (``submitter_may_approve``),
off unless a profile turns it on.

Keys are 32 random bytes (urlsafe base64, prefixed ``sc_``), shown once when made. Only their
SHA-256 is stored: a slow password hash protects low-entropy secrets against guessing, but a
256-bit random key cannot be guessed, so a fast hash is as safe and keeps authentication cheap
on every request.
"""

from __future__ import annotations

import builtins
import datetime as dt
import hashlib
import hmac
import json
import re
import secrets
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sandcell._sqlite import PrivateStore
from sandcell.errors import ConfigError

__all__ = [
    "APPROVER_KEY_PREFIX",
    "KEY_PREFIX",
    "OwnedKind",
    "Principal",
    "Role",
    "Tenant",
    "TenantError",
    "TenantStore",
    "hash_key",
    "new_key",
]

KEY_PREFIX = "sc_"
APPROVER_KEY_PREFIX = "sca_"
SERVICE_DB = "service.sqlite3"
_APPLICATION_ID = 0x53435356  # "SCSV"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
OwnedKind = Literal["run", "session", "approval", "artifact"]
"""Of these, ``artifact`` and ``approval`` rows carry sizes that count against a tenant's
``max_stored_bytes``."""
Role = Literal["submitter", "approver", "owner"]
"""``submitter``: the tenant's API key; ``approver``: one of its approver keys; ``owner``: the
service's own user on its Unix socket, who both submits and approves."""

_APPROVERS = """CREATE TABLE approvers (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        key_sha256 TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        PRIMARY KEY (tenant, name)
    )"""
"""A tenant's approver keys (``tenant``: its id): each decides its held runs and tool calls."""

_SCHEMA = (
    """CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        id TEXT NOT NULL,
        key_sha256 TEXT NOT NULL UNIQUE,
        profiles TEXT NOT NULL,
        max_concurrent INTEGER NOT NULL,
        runs_per_minute INTEGER NOT NULL,
        cpu_seconds_per_day INTEGER NOT NULL,
        max_stored_bytes INTEGER NOT NULL,
        created_at TEXT NOT NULL
    )""",
    # One row per (kind, id, tenant): an artifact is content-addressed, so two tenants that
    # produce the same bytes both own it; every other id is fresh and has one owner.
    """CREATE TABLE owned (
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        size INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        PRIMARY KEY (kind, id, tenant)
    )""",
    "CREATE UNIQUE INDEX tenants_by_id ON tenants (id)",
    "CREATE INDEX owned_by_tenant ON owned (tenant, kind, created_at)",
    """CREATE TABLE cpu_usage (
        tenant TEXT NOT NULL,
        day TEXT NOT NULL,
        cpu_ms REAL NOT NULL,
        PRIMARY KEY (tenant, day)
    )""",
    _APPROVERS,
)


class TenantError(ConfigError):
    """A tenant that does not exist, a bad name or quota, or a service store that cannot be
    used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    """One tenant of the service: who it is, what it may run, how much."""

    id: str
    """What the service keys the tenant's things by; never another tenant's (see the module)."""
    name: str
    profiles: tuple[str, ...]
    """The profiles its runs and sessions may use; the first is its default."""
    max_concurrent: int
    """Sandboxes (runs in flight and live sessions) it may hold at once."""
    runs_per_minute: int
    """Runs and session cells it may start in any 60 seconds."""
    cpu_seconds_per_day: int
    """CPU seconds its runs may use per UTC day."""
    max_stored_bytes: int
    """Bytes it may keep: artifacts, kept stdin, and held approvals with their inputs."""
    created_at: str
    key_sha256: str = field(default="", repr=False)
    """The hash of its API key as it was read: what a sandbox opened with that key is tied to
    (it ends when the key is rotated)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "profiles": list(self.profiles),
            "max_concurrent": self.max_concurrent,
            "runs_per_minute": self.runs_per_minute,
            "cpu_seconds_per_day": self.cpu_seconds_per_day,
            "max_stored_bytes": self.max_stored_bytes,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who sent a key: the tenant, and whether as its submitter (its API key) or as one of its
    approvers (``approver``: the approver's name)."""

    tenant: Tenant
    role: Role
    approver: str | None = None
    key_sha256: str = field(default="", repr=False)

    @property
    def who(self) -> str:
        """How a decision names the decider in the record."""
        if self.role == "approver":
            return f"approver:{self.tenant.name}/{self.approver}"
        return f"tenant:{self.tenant.name}"


def new_key(prefix: str = KEY_PREFIX) -> str:
    """A fresh key: ``sc_`` (an approver's: ``sca_``) and 32 random bytes, urlsafe base64."""
    return prefix + secrets.token_urlsafe(32)


def new_tenant_id() -> str:
    """16 random bytes: never the id of another tenant, however many come and go."""
    return secrets.token_hex(16)


def hash_key(key: str) -> str:
    """What is stored of a key (see the module for why SHA-256 is enough)."""
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def today() -> str:
    """The UTC day CPU quotas are counted in."""
    return dt.datetime.now(dt.UTC).date().isoformat()


_COLUMNS = (
    "id, name, profiles, max_concurrent, runs_per_minute, cpu_seconds_per_day, max_stored_bytes, "
    "created_at, key_sha256"
)


def _tenant(row: Sequence[object]) -> Tenant:
    id_, name, profiles, conc, rpm, cpu, stored, created, key_sha256 = row
    return Tenant(
        id=str(id_),
        name=str(name),
        profiles=tuple(str(p) for p in json.loads(str(profiles))),
        max_concurrent=int(str(conc)),
        runs_per_minute=int(str(rpm)),
        cpu_seconds_per_day=int(str(cpu)),
        max_stored_bytes=int(str(stored)),
        created_at=str(created),
        key_sha256=str(key_sha256),
    )


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a store made before tenant ids and approver keys up to date (in the opening
    transaction): every tenant gets an id, and what it owns and its CPU use move from its name
    to its id."""
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(tenants)")}
    if "id" not in columns:
        conn.execute("ALTER TABLE tenants ADD COLUMN id TEXT")
        names = [str(r[0]) for r in conn.execute("SELECT name FROM tenants")]
        for name in names:
            conn.execute("UPDATE tenants SET id = ? WHERE name = ?", (new_tenant_id(), name))
        for table in ("owned", "cpu_usage"):
            conn.execute(
                f"UPDATE {table} SET tenant = (SELECT id FROM tenants WHERE name = {table}.tenant) "  # noqa: S608
                "WHERE tenant IN (SELECT name FROM tenants)"
            )
        conn.execute("CREATE UNIQUE INDEX tenants_by_id ON tenants (id)")
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'approvers'").fetchone()
    if found is None:
        conn.execute(_APPROVERS)


def _no_tenant(name: str) -> TenantError:
    return TenantError(f"no tenant {name!r}; `sandcell tenants list` shows them")


def _positive(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TenantError(f"{what} must be a positive whole number, got {value!r}")
    return value


class TenantStore(PrivateStore):
    """Tenants, their hashed keys, what they own and their CPU use, in ``service.sqlite3``."""

    _error = TenantError
    _what = "service store"
    _pg_schema = "sandcell_service"

    def __init__(self, path: Path) -> None:
        super().__init__(
            path,
            application_id=_APPLICATION_ID,
            schema=_SCHEMA,
            advice="point $SANDCELL_HOME (or --home) at another directory",
            check=_migrate,
        )

    @classmethod
    def in_home(cls, home: Path) -> TenantStore:
        return cls(home / SERVICE_DB)

    # -- tenants ---------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        *,
        profiles: Sequence[str],
        max_concurrent: int,
        runs_per_minute: int,
        cpu_seconds_per_day: int,
        max_stored_bytes: int,
    ) -> tuple[Tenant, str]:
        """Add a tenant; returns it and its API key (the only time the key exists in clear)."""
        if not _NAME.match(name):
            raise TenantError(
                f"tenant name {name!r}: use 1-63 lower-case letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if not profiles:
            raise TenantError("give the tenant at least one profile (--profile NAME)")
        key = new_key()
        tenant = Tenant(
            id=new_tenant_id(),
            name=name,
            profiles=tuple(dict.fromkeys(profiles)),
            max_concurrent=_positive(max_concurrent, "max_concurrent"),
            runs_per_minute=_positive(runs_per_minute, "runs_per_minute"),
            cpu_seconds_per_day=_positive(cpu_seconds_per_day, "cpu_seconds_per_day"),
            max_stored_bytes=_positive(max_stored_bytes, "max_stored_bytes"),
            created_at=_now(),
            key_sha256=hash_key(key),
        )
        with self._txn() as conn:
            if conn.execute("SELECT 1 FROM tenants WHERE name = ?", (name,)).fetchone():
                raise TenantError(
                    f"tenant {name!r} exists; remove it first, or rotate its key with "
                    f"`sandcell tenants rotate-key {name}`"
                )
            conn.execute(
                f"INSERT INTO tenants ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (
                    tenant.id,
                    tenant.name,
                    json.dumps(list(tenant.profiles)),
                    tenant.max_concurrent,
                    tenant.runs_per_minute,
                    tenant.cpu_seconds_per_day,
                    tenant.max_stored_bytes,
                    tenant.created_at,
                    tenant.key_sha256,
                ),
            )
        return tenant, key

    def get(self, name: str) -> Tenant:
        with self._txn(write=False) as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM tenants WHERE name = ?",  # noqa: S608
                (name,),
            ).fetchone()
        if row is None:
            raise _no_tenant(name)
        return _tenant(row)

    def by_id(self, tenant_id: str) -> Tenant | None:
        """The tenant with this id, or None once it is removed."""
        row = self._read_one(f"SELECT {_COLUMNS} FROM tenants WHERE id = ?", (tenant_id,))  # noqa: S608
        return None if row is None else _tenant(row)

    def principal_with_key(self, tenant_id: str, key_sha256: str) -> Principal | None:
        """Who the key of hash ``key_sha256`` is for tenant ``tenant_id`` while it still works;
        None once it is rotated or removed, or the tenant is. What a browser session of ``/ui``
        is checked against on every request: it lasts no longer than the key it was opened
        with."""
        tenant = self.by_id(tenant_id)
        if tenant is None:
            return None
        if hmac.compare_digest(tenant.key_sha256, key_sha256):
            return Principal(tenant=tenant, role="submitter", key_sha256=key_sha256)
        row = self._read_one(
            "SELECT name, key_sha256 FROM approvers WHERE tenant = ? AND key_sha256 = ?",
            (tenant_id, key_sha256),
        )
        if row is None or not hmac.compare_digest(str(row[1]), key_sha256):
            return None
        return Principal(
            tenant=tenant, role="approver", approver=str(row[0]), key_sha256=key_sha256
        )

    def keys_now(self) -> dict[str, str]:
        """Tenant id -> the hash of its API key now, for every tenant: what the service checks
        its live sandboxes against (one opened with a key that no longer works is ended)."""
        with self._txn(write=False) as conn:
            rows = conn.execute("SELECT id, key_sha256 FROM tenants").fetchall()
        return {str(i): str(k) for i, k in rows}

    def list(self) -> builtins.list[Tenant]:
        with self._txn(write=False) as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM tenants ORDER BY name").fetchall()  # noqa: S608
        return [_tenant(r) for r in rows]

    def remove(self, name: str) -> None:
        """Remove a tenant, its keys and its mappings. The run records and artifacts stay in
        their stores (the audit chain is never cut), but no tenant reaches them through the
        service any more: a later tenant of the same name has another id and starts with
        nothing; a running service ends the removed tenant's live sandboxes."""
        with self._txn() as conn:
            row = conn.execute("SELECT id FROM tenants WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise _no_tenant(name)
            tenant_id = str(row[0])
            conn.execute("DELETE FROM tenants WHERE id = ?", (tenant_id,))
            conn.execute("DELETE FROM approvers WHERE tenant = ?", (tenant_id,))
            conn.execute("DELETE FROM owned WHERE tenant = ?", (tenant_id,))
            conn.execute("DELETE FROM cpu_usage WHERE tenant = ?", (tenant_id,))

    def rotate_key(self, name: str) -> str:
        """A new key for ``name``; the old one stops working at once, and a running service
        ends the sandboxes opened with it (an E2B sandbox's access token came with it)."""
        key = new_key()
        with self._txn() as conn:
            cur = conn.execute(
                "UPDATE tenants SET key_sha256 = ? WHERE name = ?", (hash_key(key), name)
            )
            if cur.rowcount == 0:
                raise _no_tenant(name)
        return key

    def set_profiles(self, name: str, profiles: Sequence[str]) -> Tenant:
        """Replace the tenant's profiles (the first is its default). Its held runs under a
        profile it loses can no longer be approved (:mod:`sandcell.service.approving`)."""
        if not profiles:
            raise TenantError("give the tenant at least one profile (--profile NAME)")
        with self._txn() as conn:
            cur = conn.execute(
                "UPDATE tenants SET profiles = ? WHERE name = ?",
                (json.dumps(list(dict.fromkeys(profiles))), name),
            )
            if cur.rowcount == 0:
                raise _no_tenant(name)
        return self.get(name)

    # -- approvers -------------------------------------------------------------------------------

    def add_approver(self, tenant_name: str, approver: str) -> str:
        """A new approver key named ``approver`` for the tenant; returns the key (the only time
        it exists in clear)."""
        if not _NAME.match(approver):
            raise TenantError(
                f"approver name {approver!r}: use 1-63 lower-case letters, digits, '.', '_' or "
                "'-', starting with a letter or digit"
            )
        key = new_key(APPROVER_KEY_PREFIX)
        with self._txn() as conn:
            row = conn.execute("SELECT id FROM tenants WHERE name = ?", (tenant_name,)).fetchone()
            if row is None:
                raise _no_tenant(tenant_name)
            try:
                conn.execute(
                    "INSERT INTO approvers (tenant, name, key_sha256, created_at) "
                    "VALUES (?, ?, ?, ?)",
                    (str(row[0]), approver, hash_key(key), _now()),
                )
            except sqlite3.IntegrityError:
                raise TenantError(
                    f"tenant {tenant_name!r} has an approver {approver!r}; remove it first "
                    f"(`sandcell tenants remove-approver {tenant_name} {approver}`) or choose "
                    "another name"
                ) from None
        return key

    def remove_approver(self, tenant_name: str, approver: str) -> None:
        """Remove an approver key; it stops working at once (its browser sessions too)."""
        with self._txn() as conn:
            cur = conn.execute(
                "DELETE FROM approvers WHERE name = ? AND tenant = "
                "(SELECT id FROM tenants WHERE name = ?)",
                (approver, tenant_name),
            )
            if cur.rowcount == 0:
                raise TenantError(
                    f"tenant {tenant_name!r} has no approver {approver!r}; "
                    "`sandcell tenants list` shows them"
                )

    def approvers(self, tenant_id: str) -> builtins.list[str]:
        """The names of the tenant's approver keys."""
        with self._txn(write=False) as conn:
            rows = conn.execute(
                "SELECT name FROM approvers WHERE tenant = ? ORDER BY name", (tenant_id,)
            ).fetchall()
        return [str(r[0]) for r in rows]

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant whose API key this is, or None (an approver key is not one: it runs
        nothing).

        The row is found by the key's hash (an index lookup whose timing depends only on a
        SHA-256 the caller cannot steer towards a stored one), then the hashes are compared in
        constant time all the same.
        """
        digest = hash_key(key)
        row = self._read_one(
            f"SELECT {_COLUMNS} FROM tenants WHERE key_sha256 = ?",  # noqa: S608
            (digest,),
        )
        if row is None or not hmac.compare_digest(str(row[-1]), digest):
            return None
        return _tenant(row)

    def authenticate_principal(self, key: str) -> Principal | None:
        """Whose key this is, the tenant's own or one of its approvers', or None."""
        if not key.startswith(APPROVER_KEY_PREFIX):
            tenant = self.authenticate(key)
            if tenant is None:
                return None
            return Principal(tenant=tenant, role="submitter", key_sha256=tenant.key_sha256)
        digest = hash_key(key)
        row = self._read_one("SELECT tenant FROM approvers WHERE key_sha256 = ?", (digest,))
        return None if row is None else self.principal_with_key(str(row[0]), digest)

    # -- ownership -------------------------------------------------------------------------------
    # Every ``tenant`` here is a tenant's id (never its name: see the module).

    def own(self, tenant: str, kind: OwnedKind, ids: Iterable[str], *, size: int = 0) -> None:
        rows = [(kind, i, tenant, size, _now()) for i in ids]
        if not rows:
            return
        with self._txn() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO owned (kind, id, tenant, size, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )

    def own_artifacts(self, tenant: str, artifacts: Iterable[tuple[str, int]]) -> None:
        now = _now()
        rows = [("artifact", sha, tenant, size, now) for sha, size in artifacts]
        if rows:
            with self._txn() as conn:
                conn.executemany(
                    "INSERT OR IGNORE INTO owned (kind, id, tenant, size, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )

    def disown(self, tenant: str, kind: OwnedKind, id_: str) -> bool:
        """Unmap one thing from the tenant (an artifact it no longer wants counted)."""
        with self._txn() as conn:
            cur = conn.execute(
                "DELETE FROM owned WHERE kind = ? AND id = ? AND tenant = ?", (kind, id_, tenant)
            )
        return cur.rowcount > 0

    def owns(self, tenant: str, kind: OwnedKind, id_: str) -> bool:
        with self._txn(write=False) as conn:
            row = conn.execute(
                "SELECT 1 FROM owned WHERE kind = ? AND id = ? AND tenant = ?",
                (kind, id_, tenant),
            ).fetchone()
        return row is not None

    def owned(
        self, tenant: str, kind: OwnedKind, *, limit: int, offset: int = 0
    ) -> builtins.list[str]:
        """Ids of ``kind`` the tenant owns, newest first."""
        with self._txn(write=False) as conn:
            rows = conn.execute(
                "SELECT id FROM owned WHERE tenant = ? AND kind = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?",
                (tenant, kind, limit, offset),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def owned_after(
        self, tenant: str, kind: OwnedKind, *, after: str | None, limit: int
    ) -> builtins.list[str]:
        """Ids of ``kind`` the tenant owns, newest first, starting past ``after`` (an id of
        the tenant's, from the page before; None for the first page)."""
        where = "tenant = ? AND kind = ?"
        args: builtins.list[object] = [tenant, kind]
        if after is not None:
            # Keyset paging: what is added meanwhile never shifts a page.
            where += (
                " AND (created_at, rowid) < (SELECT created_at, rowid FROM owned "
                "WHERE tenant = ? AND kind = ? AND id = ?)"
            )
            args += [tenant, kind, after]
        with self._txn(write=False) as conn:
            rows = conn.execute(
                f"SELECT id FROM owned WHERE {where} "  # noqa: S608 (constant text)
                "ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def all_owned(self, tenant: str, kind: OwnedKind) -> set[str]:
        with self._txn(write=False) as conn:
            rows = conn.execute(
                "SELECT id FROM owned WHERE tenant = ? AND kind = ?", (tenant, kind)
            ).fetchall()
        return {str(r[0]) for r in rows}

    def stored_bytes(self, tenant: str) -> int:
        """Bytes that count against the tenant's ``max_stored_bytes`` (see
        :meth:`stored_by_kind`)."""
        return sum(self.stored_by_kind(tenant).values())

    def stored_by_kind(self, tenant: str) -> dict[str, int]:
        """What the tenant keeps, by kind: ``artifact`` (exported files, and kept stdin, an
        artifact by its sha256) and ``approval`` (held runs: the stored request, stdin
        included, and their uploaded inputs, until decided)."""
        with self._txn(write=False) as conn:
            rows = conn.execute(
                "SELECT kind, coalesce(sum(size), 0) FROM owned WHERE tenant = ? "
                "AND kind IN ('artifact', 'approval') GROUP BY kind",
                (tenant,),
            ).fetchall()
        found = {str(kind): int(size) for kind, size in rows}
        return {kind: found.get(kind, 0) for kind in ("artifact", "approval")}

    def counted(self, tenant: str, kind: OwnedKind) -> builtins.list[str]:
        """Ids of ``kind`` of the tenant's that count some bytes now."""
        with self._txn(write=False) as conn:
            rows = conn.execute(
                "SELECT id FROM owned WHERE tenant = ? AND kind = ? AND size > 0", (tenant, kind)
            ).fetchall()
        return [str(r[0]) for r in rows]

    def set_size(self, tenant: str, kind: OwnedKind, id_: str, size: int) -> None:
        """Change how many bytes one thing of the tenant's counts (0: it keeps its mapping and
        no longer counts, as a decided approval)."""
        with self._txn() as conn:
            conn.execute(
                "UPDATE owned SET size = ? WHERE kind = ? AND id = ? AND tenant = ?",
                (max(0, size), kind, id_, tenant),
            )

    def record_run(
        self,
        tenant: str,
        *,
        runs: Iterable[str],
        approvals: Iterable[str],
        artifacts: Iterable[tuple[str, int]],
        cpu_ms: float,
    ) -> None:
        """Map what one run made to its tenant and count its CPU, in one transaction (it is
        on the path of every run)."""
        now = _now()
        rows = [("run", i, tenant, 0, now) for i in runs]
        rows += [("approval", i, tenant, 0, now) for i in approvals]
        rows += [("artifact", sha, tenant, size, now) for sha, size in artifacts]
        with self._txn() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO owned (kind, id, tenant, size, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute(
                "INSERT INTO cpu_usage (tenant, day, cpu_ms) VALUES (?, ?, ?) "
                # Qualified: PostgreSQL finds a bare cpu_ms ambiguous (the row or excluded's).
                "ON CONFLICT (tenant, day) "
                "DO UPDATE SET cpu_ms = cpu_usage.cpu_ms + excluded.cpu_ms",
                (tenant, today(), max(0.0, cpu_ms)),
            )

    # -- CPU ---------------------------------------------------------------------------------------

    def add_cpu(self, tenant: str, cpu_ms: float) -> None:
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO cpu_usage (tenant, day, cpu_ms) VALUES (?, ?, ?) "
                # Qualified: PostgreSQL finds a bare cpu_ms ambiguous (the row or excluded's).
                "ON CONFLICT (tenant, day) "
                "DO UPDATE SET cpu_ms = cpu_usage.cpu_ms + excluded.cpu_ms",
                (tenant, today(), max(0.0, cpu_ms)),
            )

    def usage(self, tenant: str) -> tuple[float, int]:
        """``(CPU ms today, stored bytes)`` of the tenant, in one read: what admitting a run
        checks, on every run's path."""
        row = self._read_one(
            "SELECT (SELECT cpu_ms FROM cpu_usage WHERE tenant = ? AND day = ?), "
            "(SELECT coalesce(sum(size), 0) FROM owned WHERE tenant = ? "
            "AND kind IN ('artifact', 'approval'))",
            (tenant, today(), tenant),
        )
        assert row is not None  # a SELECT of two scalar subqueries has one row
        cpu_ms, stored = row
        return (0.0 if cpu_ms is None else float(str(cpu_ms))), int(str(stored))

    def _read_one(self, sql: str, args: Sequence[object]) -> Sequence[object] | None:
        """One statement's first row, without an explicit transaction: a single SELECT is
        consistent by itself, and BEGIN and COMMIT would be two more statements on every
        request's path (authentication, admission)."""
        with self._lock:
            conn = self._connection()
            try:
                row: Sequence[object] | None = conn.execute(sql, args).fetchone()
            except sqlite3.Error as e:
                # An unreachable database is StoreUnavailable (the service answers 503), as in
                # every other method of the store.
                raise self._failed(e, f"{self._what} {self.where}: {e}") from e
        return row

    def cpu_ms_today(self, tenant: str) -> float:
        with self._txn(write=False) as conn:
            row = conn.execute(
                "SELECT cpu_ms FROM cpu_usage WHERE tenant = ? AND day = ?", (tenant, today())
            ).fetchone()
        return 0.0 if row is None else float(row[0])
