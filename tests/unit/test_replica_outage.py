"""A replica's shared rows (:class:`~sandcell.db.replicas.ReplicaState`) across a database outage,
on a real PostgreSQL of this module's own that the tests stop and start: what a replica gives
back while the database is down (a run answered, a quota hold) is not lost but given back once
it is back, and the replica knows meanwhile that it is unreachable (what ``/healthz`` says)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.pg_server import PostgresServer

from sandcell.db.replicas import ReplicaState
from sandcell.errors import StoreUnavailable
from sandcell.service.quotas import Quotas
from sandcell.service.tenants import TenantStore


@pytest.fixture
def state(own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReplicaState]:
    if not own_server.is_running():
        own_server.start()  # an earlier test stopped it and failed before starting it again
    name = f"test_{uuid.uuid4().hex[:16]}"
    url = own_server.create_database(name)
    monkeypatch.setenv("SANDCELL_DATABASE_URL", url)
    replica = ReplicaState(url)
    replica.register()
    yield replica
    if not own_server.is_running():
        own_server.start()
    replica.close()
    own_server.drop_database(name)


def test_a_run_answered_while_the_database_is_down_leaves_at_the_next_heartbeat(
    state: ReplicaState, own_server: PostgresServer
) -> None:
    state.run_started("r1", "tenant", code="print(1)", language="python")
    assert state.unreachable is None
    own_server.stop()
    with pytest.raises(StoreUnavailable):
        state.run_finished("r1")
    assert state.unreachable is not None and "lost the connection" in state.unreachable
    with pytest.raises(StoreUnavailable):
        state.heartbeat()
    own_server.start()
    state.heartbeat()
    assert state.unreachable is None
    assert state.runs_in_flight() == []


def test_a_hold_released_while_the_database_is_down_is_given_back_once_it_is_back(
    state: ReplicaState, own_server: PostgresServer, tmp_path: Path
) -> None:
    with TenantStore.in_home(tmp_path) as store:
        quotas = Quotas(store, shared=state)
        for _ in range(2):
            assert state.admit("t", max_concurrent=2, runs_per_minute=60, sandbox=True).admitted
        assert quotas.holding("t") == 2
        own_server.stop()
        # The end of a run must not fail for it: the release is kept here until the database
        # is back (and given back before the next count).
        quotas.release("t")
        quotas.release("t")
        with pytest.raises(StoreUnavailable):
            quotas.holding("t")
        own_server.start()
        assert quotas.holding("t") == 0
        assert state.admit("t", max_concurrent=2, runs_per_minute=60, sandbox=True).admitted
        quotas.release("t")
        assert quotas.holding("t") == 0
