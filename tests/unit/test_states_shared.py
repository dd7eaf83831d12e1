"""Saved states shared by replicas (issue 24): with ``$SANDCELL_DATABASE_URL`` set, the states'
manifests are rows of PostgreSQL (``sandcell_states``) while their bytes stay in the shared
directory (``$SANDCELL_SHARED_DIR``), so a state saved through one replica is listed and resumed
through another, and of several processes resuming the same paused session exactly one gets it.
The store's contract on either backend is tests/unit/test_session_states.py's."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tests import state_workers
from tests.pg_server import PostgresServer
from tests.unit.test_session_states import SAVED, SETTINGS, SID

from sandcell.errors import StoreUnavailable
from sandcell.home import SHARED_DIR_ENV, bulk_dir
from sandcell.sessions.states import StateNotFound, StateStore, StoredState

pytestmark = pytest.mark.timeout(600)

URL_ENV = "SANDCELL_DATABASE_URL"


@pytest.fixture
def shared(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[StateStore, StateStore]]:
    """Replica A's and replica B's state stores: homes of their own, one database (fresh, as a
    first start finds it: the store migrates it), one shared directory."""
    monkeypatch.setenv(URL_ENV, postgres_url)
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path / "shared"))
    with (
        StateStore(bulk_dir(tmp_path / "home-a") / "states") as a,
        StateStore(bulk_dir(tmp_path / "home-b") / "states") as b,
    ):
        yield a, b


def _save(
    store: StateStore,
    *,
    state_id: str = SID,
    kind: str = "paused",
    name: str | None = None,
    owner: str = "t1",
) -> StoredState:
    staging = store.staging()
    (staging / "data" / "pages").write_bytes(b"p" * 5000)
    return store.commit(
        staging,
        kind=kind,  # type: ignore[arg-type]
        state_id=state_id,
        name=name,
        owner=owner,
        session_id=state_id,
        cells=1,
        settings=SETTINGS,
        saved=SAVED,
        ttl_s=None if kind == "snapshot" else 600.0,
    )


def _rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [
            tuple(r)
            for r in conn.execute(
                "SELECT id, kind, name, owner, claim IS NOT NULL FROM sandcell_states.states "
                "ORDER BY id"
            )
        ]


def test_a_state_saved_through_one_replica_is_listed_and_resumed_through_another(
    shared: tuple[StateStore, StateStore], postgres_url: str
) -> None:
    a, b = shared
    assert a.root == b.root  # one shared directory; the homes differ
    paused = _save(a)
    snap = _save(a, state_id="c" * 32, kind="snapshot", name="base")
    assert not (paused.directory / "manifest.json").exists()  # the manifest is the row's
    assert _rows(postgres_url) == [
        (SID, "paused", None, "t1", False),
        ("c" * 32, "snapshot", "base", "t1", False),
    ]
    assert [s.id for s in b.list(owner="t1", kind="paused")] == [SID]
    assert b.find_snapshot("base", owner="t1").digest == snap.digest
    assert b.list(owner="t2") == []
    assert b.stored_bytes(owner="t1") == paused.stored_bytes + snap.stored_bytes

    claimed = b.claim(SID, owner="t1")  # B resumes what A paused, its bytes checked whole
    assert claimed.digest == paused.digest
    assert claimed.restore_point.state_dir.is_dir()
    assert [s.id for s in a.list(owner="t1", kind="paused")] == []
    with pytest.raises(StateNotFound):
        a.claim(SID, owner="t1")
    b.release(claimed)  # B's restore failed: the state is back, for A too
    assert [s.id for s in a.list(owner="t1", kind="paused")] == [SID]

    again = a.claim(SID, owner="t1")
    a.drop_claimed(again)  # the resume succeeded: gone everywhere, row and bytes
    with pytest.raises(StateNotFound):
        b.get(SID, owner="t1")
    assert not again.directory.exists() and not paused.directory.exists()
    b.delete("c" * 32, owner="t1")
    assert _rows(postgres_url) == []
    assert a.list(owner="t1") == []


def test_of_two_replicas_resuming_one_paused_state_exactly_one_gets_it(
    shared: tuple[StateStore, StateStore], postgres_url: str, tmp_path: Path
) -> None:
    a, _ = shared
    _save(a)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [tmp_path / f"claim-{w}.txt" for w in range(2)]
    procs = [
        ctx.Process(
            target=state_workers.claim_once,
            args=(str(tmp_path / f"home-{'ab'[w]}"), SID, "t1", str(outs[w]), barrier),
        )
        for w in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():  # wedged: ended here, and reported by its missing exit code below
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(o.read_text() for o in outs) == ["lost", "won"]
    assert _rows(postgres_url) == [(SID, "paused", None, "t1", True)]
    assert a.list(owner="t1") == []  # held by the winner, who died holding it


def test_a_claim_left_by_a_resume_that_died_is_given_back(
    shared: tuple[StateStore, StateStore], postgres_url: str
) -> None:
    """A resume that took the row and died before moving the bytes: the claim holds while it
    is young, and is given back once it is older than any resume takes."""
    a, b = shared
    _save(a)
    with psycopg.connect(postgres_url) as conn:
        conn.execute("UPDATE sandcell_states.states SET claim = 'dead', claimed_at = now()")
    assert b.list(owner="t1") == []
    with pytest.raises(StateNotFound):
        b.claim(SID, owner="t1")
    with psycopg.connect(postgres_url) as conn:
        conn.execute("UPDATE sandcell_states.states SET claimed_at = now() - interval '2 hours'")
    assert [s.id for s in b.list(owner="t1")] == [SID]
    b.drop_claimed(b.claim(SID, owner="t1"))
    assert _rows(postgres_url) == []


def test_states_saved_before_the_database_was_set_are_taken_in(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home that starts using the database keeps its paused sessions and snapshots: their
    manifests move into rows; one that does not verify stays a file, listed nowhere."""
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path / "shared"))
    root = bulk_dir(tmp_path / "home") / "states"
    with StateStore(root) as files:
        paused = _save(files)
        _save(files, state_id="d" * 32)
    damaged = root / ("d" * 32) / "manifest.json"
    damaged.write_text(damaged.read_text().replace('"t1"', '"t2"'))
    monkeypatch.setenv(URL_ENV, postgres_url)
    with StateStore(root) as db:
        assert [s.id for s in db.list(owner="t1")] == [SID]
        assert not (paused.directory / "manifest.json").exists()
        assert damaged.exists()
        assert db.load(SID, owner="t1").digest == paused.digest
    assert _rows(postgres_url) == [(SID, "paused", None, "t1", False)]


def test_a_state_is_not_committed_while_the_database_is_down(
    own_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: the bytes are not left in place without their row, the state a commit was
    to replace stays, and the store works again once the database is back."""
    url = own_server.create_database("states_outage")
    monkeypatch.setenv(URL_ENV, url)
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path / "shared"))
    with StateStore(bulk_dir(tmp_path / "home") / "states") as store:
        first = _save(store, state_id="e" * 32, kind="snapshot", name="base")
        staging = store.staging()
        (staging / "data" / "pages").write_bytes(b"q" * 10)
        own_server.stop()
        try:
            with pytest.raises(StoreUnavailable):
                store.commit(
                    staging,
                    kind="snapshot",
                    state_id=first.id,
                    name="base",
                    owner="t1",
                    session_id=first.id,
                    cells=2,
                    settings=SETTINGS,
                    saved=SAVED,
                    ttl_s=None,
                )
            assert (staging / "data" / "pages").read_bytes() == b"q" * 10
            assert (first.directory / "data" / "pages").read_bytes() == b"p" * 5000
        finally:
            own_server.start()
        assert store.load(first.id, owner="t1").digest == first.digest
