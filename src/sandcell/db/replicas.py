"""What the replicas of a service share in PostgreSQL beyond the stores (schema
``sandcell_cluster``, :mod:`sandcell.db.migrations`): who is alive, the quota counts, the runs
in flight and the session directory.

Each replica (one ``sandcell serve`` on ``$SANDCELL_DATABASE_URL``) registers a row and keeps it
fresh with :meth:`ReplicaState.heartbeat`; a row older than ``dead_after_s`` is a dead replica.
A dead replica is swept by whichever replica notices (:meth:`ReplicaState.sweep`): its holds
(which count until then, fail closed) and quota starts are dropped, its runs in flight are
handed to the caller to be recorded as lost (each exactly once: the audit log refuses a second
record of a run id), its sessions leave the directory.

Quotas count across replicas: a tenant's ``max_concurrent`` against the sum of the holds of
every replica not swept, its ``runs_per_minute`` against the starts of the last minute on the
database's clock. Each admission is one transaction under an advisory lock of its tenant, so two
replicas admitting the same tenant's runs at once take turns and never both take the last slot.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sandcell.db.postgres import DatabaseUnavailable, PgConnection
from sandcell.errors import StoreUnavailable

__all__ = [
    "DEAD_AFTER_ENV",
    "DEAD_AFTER_S",
    "Admission",
    "LostRun",
    "Owner",
    "ReplicaState",
    "SessionPlace",
    "Swept",
    "configured_dead_after_s",
    "new_replica_id",
]

SCHEMA = "sandcell_cluster"
DEAD_AFTER_S = 15.0
"""A replica whose heartbeat is older than this is dead (it beats every few seconds);
``$SANDCELL_REPLICA_DEAD_AFTER_S`` sets another figure."""
DEAD_AFTER_ENV = "SANDCELL_REPLICA_DEAD_AFTER_S"


def configured_dead_after_s() -> float:
    """:data:`DEAD_AFTER_S`, or ``$SANDCELL_REPLICA_DEAD_AFTER_S`` when set to a number."""
    try:
        return max(1.0, float(os.environ.get(DEAD_AFTER_ENV, DEAD_AFTER_S)))
    except ValueError:
        return DEAD_AFTER_S


_WINDOW_S = 60


_HOLDING = "SELECT coalesce(sum(count), 0) FROM holds WHERE tenant = ?"
"""Sandboxes a tenant holds across the replicas not swept yet. A replica whose heartbeat is
late still counts (fail closed): after a database outage every replica's heartbeat is late
until it beats again, and counting only the fresh ones then admitted a whole quota more
while the runs admitted before it still ran. A dead replica's holds go with its sweep."""
_STARTED = (
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(at)), 0) FROM starts "
    "WHERE tenant = ? AND at > now() - make_interval(secs => ?)"
)
"""A tenant's starts in the window, and the age of the oldest."""


def new_replica_id() -> str:
    """This process's name among the replicas: host, pid and a random tail (a restarted replica
    with the same pid is a new one)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _tenant_lock(tenant: str) -> int:
    digest = hashlib.sha256(f"sandcell-quota:{tenant}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """Whether a start was admitted; when not, why and how long until it may be."""

    admitted: bool
    holding: int
    """Sandboxes the tenant holds across the replicas not swept (before this start)."""
    started: int
    """Its starts in the last minute (before this one)."""
    retry_after_s: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LostRun:
    """A run a dead replica had begun and not answered."""

    run_id: str
    tenant: str
    replica: str
    node: str | None
    started_at: str
    code: str
    language: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Swept:
    """What a sweep took from dead replicas: their unanswered runs and their live sessions
    (whose sandboxes, on a cluster, still live in their nodes' agents)."""

    runs: tuple[LostRun, ...]
    sessions: tuple[SessionPlace, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """The replica that holds something, and where it answers."""

    replica: str
    address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPlace:
    """Where a live session is: its node, the replica that opened it."""

    session_id: str
    tenant: str
    node: str
    replica: str
    e2b_id: str | None
    profile: str


class ReplicaState:
    """One replica's rows in ``sandcell_cluster`` (see the module). Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str | None = None,
        dead_after_s: float | None = None,
        address: str = "",
    ) -> None:
        """``address``: the base URL other replicas reach this one at (requests for what this
        replica holds are forwarded there, :mod:`sandcell.service.forwarding`)."""
        from sandcell.db.migrate import ensure_current

        ensure_current(url)
        self.id = replica_id or new_replica_id()
        self.address = address
        self.dead_after_s = dead_after_s if dead_after_s is not None else configured_dead_after_s()
        self._lock = threading.Lock()
        self._ended: set[str] = set()
        """Runs answered while the database was unreachable, still to leave runs_in_flight."""
        self.unreachable: str | None = None
        """Why the database was unreachable at this replica's last use of it (the heartbeat
        uses it every few seconds), or None when that use worked: what ``/healthz`` tells
        without a query of its own."""
        try:
            self._conn = PgConnection(url, schema=SCHEMA)
        except DatabaseUnavailable as e:
            raise StoreUnavailable(f"replica state: {e}") from e
        self.where = self._conn.where

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _txn(self) -> Iterator[PgConnection]:
        with self._lock:
            conn = self._conn
            try:
                # READ COMMITTED: each statement sees what committed before it, so a count read
                # after taking a tenant's lock includes the turn that held it before.
                conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except DatabaseUnavailable as e:
                self.unreachable = str(e)
                raise StoreUnavailable(f"replica state: {e}; try again once it is back") from e
            self.unreachable = None

    @staticmethod
    def _one(conn: PgConnection, sql: str, params: tuple[object, ...]) -> tuple[object, ...]:
        row = conn.execute(sql, params).fetchone()
        assert row is not None  # an aggregate always answers one row
        return row

    # --- liveness ----------------------------------------------------------------------------

    def register(self) -> None:
        """Add (or refresh) this replica's row."""
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO replicas (id, host, pid, address) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET seen_at = now(), address = excluded.address",
                (self.id, socket.gethostname(), os.getpid(), self.address),
            )

    def heartbeat(self) -> None:
        """Say this replica is alive; its row comes back if a sweep removed it. The runs that
        ended while the database was unreachable leave ``runs_in_flight`` now."""
        self.register()
        with self._lock:
            ended = sorted(self._ended)
        for run_id in ended:
            self.run_finished(run_id)

    def leave(self) -> None:
        """Remove this replica and everything it holds (a clean stop)."""
        with self._txn() as conn:
            for table in ("holds", "runs_in_flight", "sessions", "mcp_sessions"):
                conn.execute(f"DELETE FROM {table} WHERE replica = ?", (self.id,))  # noqa: S608
            conn.execute("DELETE FROM replicas WHERE id = ?", (self.id,))

    def live_replicas(self) -> list[str]:
        with self._txn() as conn:
            rows = conn.execute(
                "SELECT id FROM replicas WHERE seen_at > now() - make_interval(secs => ?) "
                "ORDER BY id",
                (self.dead_after_s,),
            )
            return [str(r[0]) for r in rows.fetchall()]

    def live_peers(self) -> list[Owner]:
        """The live replicas other than this one that serve at an address, with it (a listing
        asks each of them for its own part, :mod:`sandcell.service.listings`)."""
        with self._txn() as conn:
            rows = conn.execute(
                "SELECT id, address FROM replicas WHERE seen_at > now() - make_interval(secs => ?) "
                "AND id <> ? AND address <> '' ORDER BY id",
                (self.dead_after_s, self.id),
            ).fetchall()
        return [Owner(replica=str(r[0]), address=str(r[1])) for r in rows]

    def sweep(self, record: Callable[[LostRun], None] | None = None) -> Swept:
        """Remove the dead replicas and what they held; return the runs they left unanswered
        and the sessions they had open (to be ended where their sandboxes live). Each dead
        replica is swept by one caller only. ``record(lost)`` records a run as lost
        inside the sweep's transaction: if it fails (or this process dies first), nothing is
        removed and the next sweep tries again, so no lost run goes unrecorded (a second try
        finds its record already there)."""
        lost: list[LostRun] = []
        sessions: list[SessionPlace] = []
        with self._txn() as conn:
            dead = conn.execute(
                "SELECT id FROM replicas WHERE seen_at <= now() - make_interval(secs => ?) "
                "FOR UPDATE SKIP LOCKED",
                (self.dead_after_s,),
            ).fetchall()
            for (replica,) in dead:
                rows = conn.execute(
                    "DELETE FROM runs_in_flight WHERE replica = ? "
                    "RETURNING run_id, tenant, node, started_at, code, language",
                    (replica,),
                ).fetchall()
                lost += [
                    LostRun(
                        run_id=str(r[0]),
                        tenant=str(r[1]),
                        replica=str(replica),
                        node=None if r[2] is None else str(r[2]),
                        started_at=r[3].isoformat(),
                        code=str(r[4]),
                        language=str(r[5]),
                    )
                    for r in rows
                ]
                conn.execute("DELETE FROM holds WHERE replica = ?", (replica,))
                gone = conn.execute(
                    "DELETE FROM sessions WHERE replica = ? "
                    "RETURNING session_id, tenant, node, replica, e2b_id, profile",
                    (replica,),
                ).fetchall()
                sessions += [_place(r) for r in gone]
                conn.execute("DELETE FROM mcp_sessions WHERE replica = ?", (replica,))
                conn.execute("DELETE FROM replicas WHERE id = ?", (replica,))
            # Starts age out on their own; drop those no window will count again.
            conn.execute(
                "DELETE FROM starts WHERE at <= now() - make_interval(secs => ?)", (_WINDOW_S,)
            )
            if record is not None:
                for run in lost:
                    record(run)
        return Swept(runs=tuple(lost), sessions=tuple(sorted(sessions, key=_session_key)))

    def owner(self, kind: str, key: str) -> Owner | None:
        """The live replica (other than this one) holding a ``session`` (by session or E2B
        sandbox id) or a ``run`` in flight, with the address it serves at; None when none
        does (unknown, here, or its replica is dead)."""
        if kind == "run":
            sql = "SELECT t.replica FROM runs_in_flight t WHERE t.run_id = ?"
            params: tuple[object, ...] = (key,)
        elif kind == "mcp":
            sql = "SELECT t.replica FROM mcp_sessions t WHERE t.mcp_session_id = ?"
            params = (key,)
        elif kind == "session":
            sql = "SELECT t.replica FROM sessions t WHERE t.session_id = ? OR t.e2b_id = ?"
            params = (key, key)
        else:
            raise ValueError(f"no owner kind {kind!r}")
        with self._txn() as conn:
            row = conn.execute(
                f"SELECT r.id, r.address FROM replicas r WHERE r.id = ({sql}) "  # noqa: S608
                "AND r.seen_at > now() - make_interval(secs => ?)",
                (*params, self.dead_after_s),
            ).fetchone()
        if row is None or str(row[0]) == self.id or not row[1]:
            return None
        return Owner(replica=str(row[0]), address=str(row[1]))

    # --- quotas ------------------------------------------------------------------------------

    def admit(
        self, tenant: str, *, max_concurrent: int, runs_per_minute: int, sandbox: bool
    ) -> Admission:
        """Count one start of ``tenant`` (``sandbox``: it holds a sandbox until
        :meth:`release`) if its quotas allow, across every replica not swept."""
        with self._txn() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_tenant_lock(tenant),))
            holding = int(str(self._one(conn, _HOLDING, (tenant,))[0]))
            counted, oldest_age = self._one(conn, _STARTED, (tenant, _WINDOW_S))
            started = int(str(counted))
            if sandbox and holding >= max_concurrent:
                return Admission(admitted=False, holding=holding, started=started, retry_after_s=1)
            if started >= runs_per_minute:
                wait = max(1, int(_WINDOW_S - float(str(oldest_age))) + 1)
                return Admission(
                    admitted=False, holding=holding, started=started, retry_after_s=wait
                )
            conn.execute("INSERT INTO starts (tenant) VALUES (?)", (tenant,))
            if sandbox:
                conn.execute(
                    "INSERT INTO holds (replica, tenant, count) VALUES (?, ?, 1) "
                    "ON CONFLICT (replica, tenant) DO UPDATE SET count = holds.count + 1",
                    (self.id, tenant),
                )
            return Admission(admitted=True, holding=holding, started=started)

    def release(self, tenant: str) -> None:
        """Give back one sandbox of ``tenant`` held by this replica."""
        with self._txn() as conn:
            conn.execute(
                "UPDATE holds SET count = count - 1 WHERE replica = ? AND tenant = ? AND count > 0",
                (self.id, tenant),
            )
            conn.execute("DELETE FROM holds WHERE replica = ? AND count = 0", (self.id,))

    def holding(self, tenant: str) -> int:
        """Sandboxes ``tenant`` holds across the replicas not swept."""
        with self._txn() as conn:
            return int(str(self._one(conn, _HOLDING, (tenant,))[0]))

    # --- runs in flight ----------------------------------------------------------------------

    def run_started(
        self,
        run_id: str,
        tenant: str,
        *,
        code: str = "",
        language: str = "",
        node: str | None = None,
    ) -> None:
        """Note a run this replica has begun (its code and language go into the record of a
        run lost with the replica)."""
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO runs_in_flight (run_id, tenant, replica, node, code, language) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET node = excluded.node",
                (run_id, tenant, self.id, node, code, language),
            )

    def run_placed(self, run_id: str, node: str) -> None:
        """Note the node this replica's run ``run_id`` went to (a cluster places it after it
        was noted as begun): should this replica die, the sweep cancels it there."""
        with self._txn() as conn:
            conn.execute(
                "UPDATE runs_in_flight SET node = ? WHERE run_id = ? AND replica = ?",
                (node, run_id, self.id),
            )

    def run_finished(self, run_id: str) -> None:
        """The run was answered. While the database is unreachable the note is kept here and
        removed there by a later heartbeat (it must not stay: the run would be recorded as lost
        should this replica die later, and other replicas would ask this one about it)."""
        try:
            with self._txn() as conn:
                conn.execute("DELETE FROM runs_in_flight WHERE run_id = ?", (run_id,))
        except StoreUnavailable:
            with self._lock:
                self._ended.add(run_id)
            raise
        with self._lock:
            self._ended.discard(run_id)

    def runs_in_flight(self) -> list[str]:
        """This replica's runs begun and not answered."""
        with self._txn() as conn:
            rows = conn.execute(
                "SELECT run_id FROM runs_in_flight WHERE replica = ? ORDER BY run_id", (self.id,)
            )
            return [str(r[0]) for r in rows.fetchall()]

    # --- the session directory ---------------------------------------------------------------

    def place_session(
        self, session_id: str, *, tenant: str, node: str, profile: str, e2b_id: str | None = None
    ) -> None:
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO sessions (session_id, tenant, node, replica, e2b_id, profile) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
                "node = excluded.node, replica = excluded.replica, profile = excluded.profile",
                (session_id, tenant, node, self.id, e2b_id, profile),
            )

    def session_place(self, session_id: str) -> SessionPlace | None:
        """Where ``session_id`` (or an E2B sandbox id) lives, if it is live anywhere."""
        with self._txn() as conn:
            row = conn.execute(
                "SELECT session_id, tenant, node, replica, e2b_id, profile FROM sessions "
                "WHERE session_id = ? OR e2b_id = ?",
                (session_id, session_id),
            ).fetchone()
        return None if row is None else _place(row)

    def sessions_on(self, node: str) -> list[SessionPlace]:
        with self._txn() as conn:
            rows = conn.execute(
                "SELECT session_id, tenant, node, replica, e2b_id, profile FROM sessions "
                "WHERE node = ? ORDER BY session_id",
                (node,),
            ).fetchall()
        return [_place(r) for r in rows]

    def place_mcp(self, mcp_session_id: str) -> None:
        """Note an MCP connection this replica answered the initialize of."""
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO mcp_sessions (mcp_session_id, replica) VALUES (?, ?) "
                "ON CONFLICT (mcp_session_id) DO UPDATE SET replica = excluded.replica",
                (mcp_session_id, self.id),
            )

    def mcp_ended(self, mcp_session_id: str) -> None:
        with self._txn() as conn:
            conn.execute("DELETE FROM mcp_sessions WHERE mcp_session_id = ?", (mcp_session_id,))

    def session_ended(self, session_id: str) -> None:
        with self._txn() as conn:
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))

    def forget_node(self, node: str) -> list[SessionPlace]:
        """Drop the sessions of a lost node from the directory; returns them."""
        gone = self.sessions_on(node)
        with self._txn() as conn:
            conn.execute("DELETE FROM sessions WHERE node = ?", (node,))
        return gone


def _place(row: Sequence[object]) -> SessionPlace:
    """A row ``session_id, tenant, node, replica, e2b_id, profile`` of the directory."""
    return SessionPlace(
        session_id=str(row[0]),
        tenant=str(row[1]),
        node=str(row[2]),
        replica=str(row[3]),
        e2b_id=None if row[4] is None else str(row[4]),
        profile=str(row[5]),
    )


def _session_key(place: SessionPlace) -> str:
    return place.session_id
