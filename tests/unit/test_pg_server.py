"""The PostgreSQL test harness itself (tests/pg_server.py and the conftest fixtures): a real
server starts, each test gets an empty database of its own, and stops, crashes and restarts
behave as the store's failure tests rely on (same address, data kept, clients refused while
it is down)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tests.pg_server import PostgresServer

pytestmark = pytest.mark.timeout(600)


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', "
            "'information_schema') ORDER BY tablename"
        ).fetchall()
    return [row[0] for row in rows]


@pytest.fixture(scope="module")
def own_server(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """A second cluster for the tests that stop and crash it, so the session's shared one is
    never down (``postgres_server`` is asked for first: it skips or fails where PostgreSQL is
    not usable)."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("turn", [1, 2])
def test_each_test_gets_an_empty_database_of_its_own(postgres_url: str, turn: int) -> None:
    # Both turns find their database empty and leave a table in it: whichever runs second would
    # see the first one's table if databases were shared or not fresh.
    assert _tables(postgres_url) == []
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE marker (turn int)")
        conn.execute("INSERT INTO marker VALUES (%s)", (turn,))
    assert _tables(postgres_url) == ["marker"]


def test_databases_are_isolated_and_dropped(postgres_server: PostgresServer) -> None:
    first = postgres_server.create_database("harness_first")
    second = postgres_server.create_database("harness_second")
    try:
        with psycopg.connect(first) as conn:
            conn.execute("CREATE TABLE only_here (x int)")
        assert _tables(first) == ["only_here"]
        assert _tables(second) == []
        open_conn = psycopg.connect(second)  # a client still connected does not block the drop
        postgres_server.drop_database("harness_second")
        open_conn.close()
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            psycopg.connect(second).close()
    finally:
        postgres_server.drop_database("harness_first")
        postgres_server.drop_database("harness_second")


def test_urls_are_loopback_and_the_socket_answers_too(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql://postgres@127.0.0.1:")
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT inet_server_addr()::text, current_database()").fetchone()
    assert row is not None
    assert row[0].split("/")[0] == "127.0.0.1"
    assert postgres_url.endswith("/" + row[1])


def test_socket_url_reaches_the_same_server(postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.socket_url()) as conn:
        row = conn.execute("SELECT inet_server_addr(), current_setting('port')").fetchone()
    assert row == (None, str(postgres_server.port))  # no address: it came over the socket


def test_the_server_does_not_run_as_root(postgres_server: PostgresServer) -> None:
    pid = int((postgres_server.data / "postmaster.pid").read_text().split("\n", 1)[0])
    status = Path(f"/proc/{pid}/status").read_text()
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert int(uid) != 0
    if os.geteuid() != 0:
        assert int(uid) == os.geteuid()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_keeps_the_port_and_the_data(own_server: PostgresServer, mode: str) -> None:
    name = f"restart_{mode}"
    url = own_server.create_database(name)
    port = own_server.port
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    # immediate is a crash: no shutdown checkpoint, the start recovers the commit from the WAL.
    own_server.restart(mode)  # type: ignore[arg-type]
    assert own_server.port == port
    assert own_server.url(name) == url
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]
    own_server.drop_database(name)


def test_stop_refuses_clients_and_start_brings_it_back(own_server: PostgresServer) -> None:
    url = own_server.create_database("stop_start")
    held = psycopg.connect(url)
    try:
        own_server.stop()
        assert not own_server.is_running()
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")  # the server closed it
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=10).close()
    finally:
        held.close()
        own_server.start()
    assert own_server.is_running()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    own_server.drop_database("stop_start")


def test_close_stops_the_server_and_removes_its_directory(
    postgres_server: PostgresServer,
) -> None:
    server = PostgresServer()
    server.start()
    url = server.url()
    pid = int((server.data / "postmaster.pid").read_text().split("\n", 1)[0])
    server.close()
    assert not server.base.exists()
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=10).close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
