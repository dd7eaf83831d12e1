"""The stores on PostgreSQL alone (``$SANDCELL_DATABASE_URL``): what only a shared database has.

Several processes (replicas, nodes) write one audit chain and open a fresh database together;
the schema is Alembic's, and a database migrated by a newer sandcell is refused; a database that
goes away makes a store call StoreUnavailable and the same store works again once it is back,
while a run's record waits for it. The contract both databases share is in the store tests that
use ``store_backend`` (tests/conftest.py).
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from tests import store_workers
from tests.pg_server import PostgresServer

import sandcell.db.migrate
from sandcell.audit import AuditEntry, AuditLog
from sandcell.db.migrate import HEAD, KNOWN, VERSION_SCHEMA
from sandcell.errors import ConfigError, StoreUnavailable
from sandcell.service.tenants import TenantStore

pytestmark = pytest.mark.timeout(600)

URL_ENV = "SANDCELL_DATABASE_URL"
MIGRATIONS = Path(sandcell.db.migrate.__file__).with_name("migrations")
PASSWORD = "pw-never-shown"
"""In the URLs of the tests that stop their server: no message may show it."""
QUOTAS = store_workers.QUOTAS


@pytest.fixture
def shared_db(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database every store of this test (and of its child processes) uses."""
    monkeypatch.setenv(URL_ENV, postgres_url)
    return postgres_url


# --- several processes ----------------------------------------------------------------------


def _run_children(target: object, args: list[tuple[object, ...]]) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():  # wedged: ended here, and reported by its missing exit code below
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_the_chain_stays_one_chain_under_appends_from_four_processes(
    shared_db: str, tmp_path: Path
) -> None:
    AuditLog(tmp_path / "audit.sqlite3").close()  # migrated before the children start
    barrier = multiprocessing.get_context("spawn").Barrier(4)
    _run_children(store_workers.append_many, [(str(tmp_path), w, 50, barrier) for w in range(4)])
    with AuditLog(tmp_path / "audit.sqlite3") as audit:
        report = audit.verify()
        entries = audit.list(limit=500)
    assert report.ok, report.problems
    assert report.count == 200
    assert sorted(e.seq for e in entries) == list(range(1, 201))
    assert {e.run_id for e in entries} == {f"w{w}-{i:03d}" for w in range(4) for i in range(50)}


def test_a_fresh_database_is_migrated_once_when_four_processes_open_it(
    shared_db: str, tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dbname = urlsplit(shared_db).path.strip("/")
    with psycopg.connect(shared_db, autocommit=True) as conn:
        # The server log then shows every DDL statement run in this database, whoever ran it.
        conn.execute(f"ALTER DATABASE {dbname} SET log_statement = 'ddl'")
    barrier = multiprocessing.get_context("spawn").Barrier(4)
    _run_children(
        store_workers.open_one_store, [(str(tmp_path), which, barrier) for which in range(4)]
    )
    with psycopg.connect(shared_db) as conn:
        versions = conn.execute(f"SELECT version_num FROM {VERSION_SCHEMA}.alembic_version")
        assert [row[0] for row in versions.fetchall()] == [HEAD]
    ours = [line for line in postgres_server.log.read_text().splitlines() if f" {dbname} " in line]
    created = [line for line in ours if "CREATE SCHEMA sandcell_audit" in line]
    assert len(created) == 1, ours
    with AuditLog(tmp_path / "audit.sqlite3") as audit:
        assert audit.get("from-child") is not None
    with TenantStore(tmp_path / "service.sqlite3") as tenants:
        assert tenants.get("acme").name == "acme"


# --- the schema's version -------------------------------------------------------------------


def test_alembics_head_is_the_head_sandcell_names() -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(config)
    assert script.get_heads() == [HEAD]
    assert {rev.revision for rev in script.walk_revisions()} == set(KNOWN)
    assert KNOWN[-1] == HEAD


def test_a_database_at_an_unknown_revision_is_refused(shared_db: str, tmp_path: Path) -> None:
    with psycopg.connect(shared_db) as conn:
        # What a newer sandcell's migration would leave.
        conn.execute(f"CREATE SCHEMA {VERSION_SCHEMA}")
        conn.execute(
            f"CREATE TABLE {VERSION_SCHEMA}.alembic_version (version_num VARCHAR(32) PRIMARY KEY)"
        )
        conn.execute(f"INSERT INTO {VERSION_SCHEMA}.alembic_version VALUES ('9999')")
    with pytest.raises(ConfigError, match="'9999'") as err:
        AuditLog(tmp_path / "audit.sqlite3")
    assert "upgrade sandcell" in str(err.value)
    with psycopg.connect(shared_db) as conn:  # nothing was written to it
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'sandcell%' ORDER BY nspname"
        ).fetchall()
    assert [row[0] for row in schemas] == [VERSION_SCHEMA]
    assert not (tmp_path / "audit.sqlite3").exists()  # and no SQLite file instead


@pytest.mark.parametrize("url", ["mysql://u@127.0.0.1/db", "sqlite:///tmp/x.db", "127.0.0.1/db"])
def test_a_database_url_that_is_not_postgresql_is_a_config_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(URL_ENV, url)
    with pytest.raises(ConfigError, match=f"\\${URL_ENV}"):
        AuditLog(tmp_path / "audit.sqlite3")
    with pytest.raises(ConfigError, match=f"\\${URL_ENV}"):
        TenantStore(tmp_path / "service.sqlite3")
    assert list(tmp_path.iterdir()) == []  # no SQLite file in its place


# --- a database that goes away --------------------------------------------------------------


@pytest.fixture
def own_db(own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh database on ``own_server``, its URL carrying a password (the server trusts
    loopback and ignores it): messages must never show it."""
    if not own_server.is_running():
        own_server.start()  # an earlier test stopped it and failed before starting it again
    name = f"test_{uuid.uuid4().hex[:16]}"
    parts = urlsplit(own_server.create_database(name))
    netloc = f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"
    url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    monkeypatch.setenv(URL_ENV, url)
    yield url
    if not own_server.is_running():
        own_server.start()
    own_server.drop_database(name)


def test_a_store_call_while_the_database_is_down_is_store_unavailable_then_works_again(
    own_db: str, own_server: PostgresServer, tmp_path: Path
) -> None:
    with TenantStore(tmp_path / "service.sqlite3") as tenants:
        tenant = tenants.add("acme", profiles=["strict"], **QUOTAS)[0]
        own_server.stop()
        try:
            shown = f"127.0.0.1:{own_server.port}{urlsplit(own_db).path}"
            for call in (tenants.list, lambda: tenants.by_id(tenant.id)):
                with pytest.raises(StoreUnavailable) as err:
                    call()
                assert shown in str(err.value)
                assert PASSWORD not in str(err.value)
            with pytest.raises(StoreUnavailable) as err:  # opening another one, too
                TenantStore(tmp_path / "service.sqlite3")
            assert PASSWORD not in str(err.value)
        finally:
            own_server.start()
        # The same store object, not reopened: it connects again.
        assert [t.name for t in tenants.list()] == ["acme"]
        assert tenants.by_id(tenant.id) == tenant
        tenants.add("other", profiles=["strict"], **QUOTAS)
        assert {t.name for t in tenants.list()} == {"acme", "other"}


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_after_a_restart_the_first_call_of_each_store_works(
    own_db: str, own_server: PostgresServer, tmp_path: Path, mode: str
) -> None:
    """Connections dropped while idle (the database restarted between two calls) are noticed
    at the next call and replaced at once: no request fails for having come first."""
    with (
        TenantStore(tmp_path / "service.sqlite3") as tenants,
        AuditLog(tmp_path / "audit.sqlite3") as log,
    ):
        tenant = tenants.add("acme", profiles=["strict"], **QUOTAS)[0]
        log.append({"run_id": "before-restart"})
        own_server.stop(mode)
        own_server.start()
        assert tenants.by_id(tenant.id) == tenant  # a read on its own
        tenants.add("other", profiles=["strict"], **QUOTAS)  # a write transaction
        assert log.get("before-restart") is not None
        assert log.append({"run_id": "after-restart"}).seq == 2


def test_a_record_appended_while_the_database_is_down_is_stored_once_it_is_back(
    own_db: str, own_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_RECORD_WAIT_S", "300")
    # Told when an attempt has failed for want of the database (the append then waits and
    # tries again); the real attempt runs unchanged.
    failed = threading.Event()
    attempt = AuditLog._write

    def watched(self: AuditLog, batch: Any) -> Any:
        try:
            return attempt(self, batch)
        except StoreUnavailable:
            failed.set()
            raise

    monkeypatch.setattr(AuditLog, "_write", watched)
    with AuditLog(tmp_path / "audit.sqlite3") as audit:
        audit.append({"run_id": "before"})
        own_server.stop()
        outcome: list[AuditEntry | BaseException] = []

        def append() -> None:
            try:
                outcome.append(audit.append({"run_id": "while-down", "n": 1}))
            except BaseException as e:  # reported by the assertion below
                outcome.append(e)

        appender = threading.Thread(target=append)
        try:
            appender.start()
            assert failed.wait(timeout=120), "the append never tried the stopped database"
            assert outcome == []  # still waiting for the database
        finally:
            own_server.start()
        appender.join(timeout=300)
        assert not appender.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], AuditEntry), outcome
        assert outcome[0].seq == 2
        report = audit.verify()
        assert report.ok, report.problems
        ids = [e.run_id for e in audit.list(limit=10)]
    assert ids == ["while-down", "before"]


def test_a_record_whose_commit_answer_was_lost_is_stored_once(
    own_db: str, own_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit went through but its answer never came back: the append tries again, finds
    its own record, and the log has it once.

    Made real with PostgreSQL's synchronous replication to a standby that never comes: the
    commit is written, then the backend waits for the standby before answering; terminated
    there, it has committed locally and the client only sees its connection drop.
    """
    admin_url = own_server.url("postgres")
    dbname = urlsplit(own_db).path.strip("/")
    # Before the append tries again, the record is already in the database: the first try's
    # commit went through (the real attempts run unchanged).
    stored_before_retry: list[bool] = []
    attempt = AuditLog._write

    def watched(self: AuditLog, batch: Any) -> Any:
        for pending in batch:
            if pending.retried:
                with psycopg.connect(own_server.url(dbname)) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM sandcell_audit.runs WHERE run_id = %s",
                        (pending.run_id,),
                    ).fetchone()
                stored_before_retry.append(row is not None and row[0] == 1)
        return attempt(self, batch)

    monkeypatch.setattr(AuditLog, "_write", watched)
    with AuditLog(tmp_path / "audit.sqlite3") as audit:
        audit.append({"run_id": "before"})
        outcome: list[AuditEntry | BaseException] = []

        def append() -> None:
            try:
                outcome.append(audit.append({"run_id": "answer-lost", "n": 1}))
            except BaseException as e:  # reported by the assertion below
                outcome.append(e)

        appender = threading.Thread(target=append)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            try:
                _set_standby(admin, "never_connects")
                appender.start()
                waiting = _wait_for_sync_rep(admin, dbname)
                admin.execute("SELECT pg_terminate_backend(%s)", (waiting,))
            finally:
                _set_standby(admin, None)
        appender.join(timeout=300)
        assert not appender.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], AuditEntry), outcome
        assert stored_before_retry == [True]  # one retry, and the commit had gone through
        assert outcome[0] == audit.get("answer-lost")
        report = audit.verify()
        assert report.ok, report.problems
        ids = [e.run_id for e in audit.list(limit=10)]
    assert ids == ["answer-lost", "before"]


def _set_standby(admin: psycopg.Connection[tuple[object, ...]], name: str | None) -> None:
    """Name a synchronous standby (commits then wait for it), or none; returns once new
    sessions see the setting (the server has signalled every backend by then)."""
    if name is None:
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
    else:
        admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
    admin.execute("SELECT pg_reload_conf()")
    url = admin.info.dsn
    for _ in range(600):
        with psycopg.connect(url) as probe:
            row = probe.execute("SHOW synchronous_standby_names").fetchone()
        if row is not None and row[0] == (name or ""):
            return
        admin.execute("SELECT pg_sleep(0.05)")  # the postmaster rereads its files meanwhile
    raise AssertionError(f"synchronous_standby_names never became {name!r}")


def _wait_for_sync_rep(admin: psycopg.Connection[tuple[object, ...]], dbname: str) -> int:
    """The pid of the sandcell backend in ``dbname`` waiting for the standby to confirm its
    commit, once there is one."""
    for _ in range(2400):
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = "
            "'sandcell' AND wait_event = 'SyncRep'",
            (dbname,),
        ).fetchone()
        if row is not None:
            return int(str(row[0]))
        admin.execute("SELECT pg_sleep(0.05)")
    raise AssertionError("no append ever waited for its commit to be confirmed")
