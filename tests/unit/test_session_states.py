"""The store of saved session states (sandcell/sessions/states.py), on real files: a state is
committed whole or not at all, loads only as it was written (every byte and the manifest), only
for its owner, once per resume, and is swept when it expires.

Each test of the store runs twice (``store_backend``): with the manifests beside the bytes, and
with them in PostgreSQL (``$SANDCELL_DATABASE_URL``, :mod:`sandcell.sessions.state_index`); a
test that edits a manifest or moves a state behind the store's back does it where that backend
keeps it (:func:`_edit_manifest`, :func:`_move`)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.store_backend import StoreBackend

from sandcell.backends.cell.state import PauseMode, SavedState
from sandcell.errors import InfraError
from sandcell.sessions.states import (
    SessionSettings,
    StateNotFound,
    StateStore,
    StateTampered,
    StoredState,
    check_snapshot_name,
)

SETTINGS = SessionSettings(
    profile="analysis",
    limits={"wall_time_s": 30.0},
    inputs=(),
    mode="strict",
    landlock=None,
    runtime=None,
    idle_timeout_s=600.0,
    max_lifetime_s=3600.0,
    on_idle="end",
    paused_ttl_s=60.0,
)
SAVED = SavedState(backend="gvisor", mode=PauseMode.MEMORY, detail={"runsc": "x"})
SID = "0123456789abcdef0123456789abcdef"
SCHEMA = "sandcell_states"


Opener = Callable[[Path], StateStore]


@pytest.fixture
def open_store(store_backend: StoreBackend) -> Iterator[Opener]:
    """Opens stores on the test's backend; closes them (their database connections) after."""
    opened: list[StateStore] = []

    def open_(root: Path) -> StateStore:
        opened.append(StateStore(root))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


def _edit_manifest(
    backend: StoreBackend, root: Path, state_id: str, edit: Callable[[dict[str, Any]], None]
) -> None:
    """Change a committed state's manifest where it is kept, as someone with write access to
    the shared directory (or the database) would, without re-signing it."""
    if not backend.is_postgres:
        manifest = root / state_id / "manifest.json"
        raw = json.loads(manifest.read_text())
        edit(raw)
        manifest.write_text(json.dumps(raw))
        return
    assert not (root / state_id / "manifest.json").exists()  # the row holds it, not a file
    with backend.raw(root, SCHEMA) as db:
        row = db.execute("SELECT manifest FROM states WHERE id = ?", (state_id,)).fetchone()
        raw = json.loads(row[0])
        edit(raw)
        db.execute("UPDATE states SET manifest = ? WHERE id = ?", (json.dumps(raw), state_id))


def _move(backend: StoreBackend, root: Path, old: str, new: str) -> None:
    """Put a whole state under another id."""
    os.rename(root / old, root / new)
    if backend.is_postgres:
        with backend.raw(root, SCHEMA) as db:
            db.execute("UPDATE states SET id = ? WHERE id = ?", (new, old))


def _save(
    store: StateStore, *, state_id: str = SID, owner: str | None = "t1", **kw: object
) -> StoredState:
    staging = store.staging()
    data = staging / "data"
    (data / "img").mkdir()
    (data / "img" / "pages").write_bytes(b"p" * 10_000)
    (data / "meta.json").write_text("{}")
    options: dict[str, object] = {
        "kind": "paused",
        "name": None,
        "ttl_s": 60.0,
        **kw,
    }
    return store.commit(
        staging,
        state_id=state_id,
        owner=owner,
        session_id=state_id,
        cells=3,
        settings=SETTINGS,
        saved=SAVED,
        **options,  # type: ignore[arg-type]
    )


def test_a_committed_state_loads_as_it_was_written(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    state = _save(store)
    assert set(state.files) == {"img/pages", "meta.json"}
    assert state.stored_bytes >= 10_000
    loaded = store.load(SID, owner="t1")
    assert loaded.digest == state.digest
    assert loaded.settings == SETTINGS and loaded.saved == SAVED and loaded.cells == 3
    assert loaded.restore_point.state_dir == tmp_path / "states" / SID / "data"
    assert [s.id for s in store.list(owner="t1")] == [SID]
    assert store.stored_bytes(owner="t1") == state.stored_bytes
    assert (tmp_path / "states").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "states" / ".key").stat().st_mode & 0o777 == 0o600
    if store_backend.is_postgres:  # the manifest is the row's, the bytes stay in the directory
        assert not (tmp_path / "states" / SID / "manifest.json").exists()
        with store_backend.raw(tmp_path, SCHEMA) as db:
            row = db.execute(
                "SELECT kind, owner, session_id, stored_bytes, claim FROM states WHERE id = ?",
                (SID,),
            ).fetchone()
        assert tuple(row) == ("paused", "t1", SID, state.stored_bytes, None)


@pytest.mark.parametrize(
    "tamper",
    ["change a byte", "truncate", "add a file", "remove a file", "replace with a link"],
)
def test_a_state_whose_files_changed_is_refused(
    tmp_path: Path, tamper: str, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    _save(store)
    data = tmp_path / "states" / SID / "data"
    pages = data / "img" / "pages"
    if tamper == "change a byte":
        with pages.open("r+b") as f:
            f.seek(5000)
            f.write(b"X")
    elif tamper == "truncate":
        pages.write_bytes(b"p" * 9_999)
    elif tamper == "add a file":
        (data / "img" / "extra").write_bytes(b"")
    elif tamper == "remove a file":
        pages.unlink()
    else:
        pages.unlink()
        pages.symlink_to("/etc/passwd")
    with pytest.raises(StateTampered, match="will not be loaded"):
        store.load(SID, owner="t1")
    with pytest.raises(StateTampered):
        store.claim(SID, owner="t1")
    assert (tmp_path / "states" / SID).is_dir()  # refused, and kept for inspection


def test_an_edited_or_moved_manifest_is_refused(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    _save(store)

    def give_away(raw: dict[str, Any]) -> None:
        raw["manifest"]["owner"] = "t2"  # someone gives the state to another tenant

    _edit_manifest(store_backend, tmp_path / "states", SID, give_away)
    with pytest.raises(StateTampered, match="changed after it was saved"):
        store.load(SID, owner="t2")
    with pytest.raises(StateNotFound):  # to anyone the manifest does not name, it is not there
        store.load(SID, owner="t1")
    assert store.list(owner="t2") == []
    # A whole, correctly signed state copied under another id is refused too.
    other = open_store(tmp_path / "states")
    _save(other, state_id="a" * 32)
    _move(store_backend, tmp_path / "states", "a" * 32, "b" * 32)
    with pytest.raises(StateTampered, match="holds the manifest of"):
        other.load("b" * 32, owner="t1")


def test_labels_are_kept_signed_and_not_listed(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    state = _save(store, labels={"e2b.token": "secret", "e2b.template": "base"})
    loaded = store.load(SID, owner="t1")
    assert loaded.labels == {"e2b.token": "secret", "e2b.template": "base"}
    assert store.set_record(loaded, "r1").labels == loaded.labels
    assert "secret" not in json.dumps(state.summary())

    def steal(raw: dict[str, Any]) -> None:
        raw["manifest"]["labels"]["e2b.token"] = "mine now"

    _edit_manifest(store_backend, tmp_path / "states", SID, steal)
    with pytest.raises(StateTampered, match="changed after it was saved"):
        store.load(SID, owner="t1")


def test_another_owner_sees_nothing(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    _save(store)
    _save(store, state_id="c" * 32, kind="snapshot", name="base", ttl_s=None)
    calls: tuple[Callable[[], object], ...] = (
        lambda: store.load(SID, owner="t2"),
        lambda: store.get(SID, owner=None),
        lambda: store.delete(SID, owner="t2"),
        lambda: store.claim(SID, owner="t2"),
        lambda: store.find_snapshot("base", owner="t2"),
    )
    for call in calls:
        with pytest.raises(StateNotFound):
            call()
    assert store.list(owner="t2") == []
    assert store.find_snapshot("base", owner="t1").id == "c" * 32
    assert store.load(SID, owner="t1").id == SID


def test_one_resume_claims_a_state(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    _save(store)
    got: list[object] = []
    barrier = threading.Barrier(4)

    def claim() -> None:
        barrier.wait()
        try:
            got.append(store.claim(SID, owner="t1"))
        except StateNotFound as exc:
            got.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [g for g in got if not isinstance(g, StateNotFound)]
    assert len(claimed) == 1
    assert store.list(owner="t1") == []
    state = claimed[0]
    store.release(state)  # type: ignore[arg-type]
    assert [s.id for s in store.list(owner="t1")] == [SID]
    again = store.claim(SID, owner="t1")
    store.drop_claimed(again)
    with pytest.raises(StateNotFound):
        store.get(SID, owner="t1")


def test_expired_states_and_dead_saves_are_swept(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    _save(store, ttl_s=0.001)
    kept = _save(store, state_id="d" * 32, ttl_s=None)
    dead = store.staging()
    old = time.time() - 7200
    os.utime(dead, (old, old))
    time.sleep(0.01)
    assert [s.id for s in store.list(owner="t1")] == [kept.id]
    assert not (tmp_path / "states" / SID).exists()
    assert not dead.exists()
    with pytest.raises(StateNotFound):
        store.load(SID, owner="t1")


def test_an_abandoned_claim_is_given_back_not_lost(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    _save(store)
    claimed = store.claim(SID, owner="t1")  # the resuming process dies here
    old = time.time() - 7200
    os.utime(claimed.directory, (old, old))
    assert [s.id for s in store.list(owner="t1")] == [SID]


def test_a_state_holding_a_link_is_not_committed(
    tmp_path: Path, store_backend: StoreBackend, open_store: Opener
) -> None:
    store = open_store(tmp_path / "states")
    staging = store.staging()
    (staging / "data" / "link").symlink_to("/etc/passwd")
    with pytest.raises(InfraError, match="not a regular file"):
        store.commit(
            staging,
            kind="paused",
            state_id=SID,
            name=None,
            owner=None,
            session_id=SID,
            cells=0,
            settings=SETTINGS,
            saved=SAVED,
            ttl_s=None,
        )


def test_snapshot_names_are_checked() -> None:
    assert check_snapshot_name("base-1.2_x") == "base-1.2_x"
    for bad in ("", "../x", "a/b", "-x", "x" * 65, "a b"):
        with pytest.raises(Exception, match="not a snapshot name"):
            check_snapshot_name(bad)


def test_a_sparse_file_is_hashed_for_its_bytes_not_how_it_is_stored(tmp_path: Path) -> None:
    """A microVM's RAM file is mostly holes: its blocks of holes are not read, yet the digest is
    the bytes' (a dense copy hashes the same) and a byte written into a hole changes it."""
    from sandcell.sessions.states import HASH_BLOCK, _hash_file

    sparse = tmp_path / "ram"
    with sparse.open("wb") as f:
        f.truncate(20 * HASH_BLOCK + 123)
        f.seek(3 * HASH_BLOCK + 5)
        f.write(b"data" * 1000)
        f.seek(17 * HASH_BLOCK)
        f.write(b"more")
    dense = tmp_path / "dense"
    dense.write_bytes(sparse.read_bytes())
    assert sparse.stat().st_blocks < dense.stat().st_blocks
    assert _hash_file(sparse) == _hash_file(dense)
    with sparse.open("r+b") as f:
        f.seek(11 * HASH_BLOCK + 77)  # inside a hole
        f.write(b"\x01")
    assert _hash_file(sparse) != _hash_file(dense)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert _hash_file(empty) != _hash_file(tmp_path / "ram")
