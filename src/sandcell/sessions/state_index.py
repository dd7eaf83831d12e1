"""Where the saved states' manifests live and who holds a claim on one: the manifest files in
the state directory, or rows of a PostgreSQL table (``$SANDCELL_DATABASE_URL``).

:class:`~sandcell.sessions.states.StateStore` hashes, signs and checks; an index keeps the signed
manifest document (``{"manifest": body, "hmac": sig}`` as JSON text) of every committed state
and moves the state's directory at the same step, so the two never disagree for long:

* :class:`FileIndex` (no database): ``ID/manifest.json`` beside the bytes. A state is committed
  by renaming its staging directory (manifest written first) into place and claimed by renaming
  it out of the listing: the rename is the atomic step.
* :class:`PgIndex`: one row per state in ``sandcell_states.states`` (migration 0003), holding
  the manifest and the columns listings filter on; the bytes stay under the shared directory.
  A commit renames the bytes into place, then writes the row (a failed write puts the bytes
  back); a claim is one ``UPDATE ... WHERE claim IS NULL`` (of two replicas resuming the same
  paused session, exactly one gets the row), then the rename; a delete removes the row, then
  the bytes.

An index returns manifests unverified: the store checks every signature, and reads a row by its
manifest, never by its columns.
"""

from __future__ import annotations

import builtins
import contextlib
import shutil
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.db.url import database_url
from sandcell.errors import SandcellError, StoreUnavailable

if TYPE_CHECKING:
    from sandcell.db.postgres import PgConnection

__all__ = [
    "CLAIM_STALE_S",
    "Entry",
    "FileIndex",
    "NotIndexed",
    "PgIndex",
    "StateIndex",
    "claim_dir",
    "open_index",
]

CLAIM_STALE_S = 3600.0
"""A claim (or a staging directory) older than this belongs to a process that died."""

SCHEMA = "sandcell_states"
MANIFEST = "manifest.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One committed state as an index keeps it: the signed manifest document and the fields of
    the manifest that listings filter and order on."""

    id: str
    kind: str
    name: str | None
    owner: str | None
    session_id: str
    created_at: str
    """ISO 8601, as the manifest says."""
    expires_at: float | None
    stored_bytes: int
    document: str


class NotIndexed(SandcellError, LookupError):
    """The index holds no such state (or not under that claim)."""


class StateIndex(ABC):
    """The manifests of one state directory ``root`` (see the module). Every method that moves a
    directory does it here, in the order its index needs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @abstractmethod
    def put(self, entry: Entry, staging: Path, final: Path) -> None:
        """Commit: the state's bytes from ``staging`` to ``final`` (absent) and its manifest
        indexed (a state of that id before is replaced). Nothing is committed when it raises."""

    @abstractmethod
    def rewrite(self, entry: Entry, directory: Path) -> None:
        """Replace a committed (or claimed) state's manifest."""

    @abstractmethod
    def document(self, state_id: str, claim: str | None) -> str:
        """The manifest of the state, unclaimed (``claim`` None) or held under ``claim``.
        Raises NotIndexed; OSError where a manifest file cannot be read."""

    @abstractmethod
    def entries(
        self,
        *,
        owner: str | None,
        any_owner: bool,
        kind: str | None,
        name: str | None,
        expired_before: float | None,
    ) -> builtins.list[tuple[str, str]]:
        """(id, manifest) of the unclaimed states that may match, oldest first; the caller checks
        each manifest and filters again. ``expired_before``: only those expired at that time."""

    @abstractmethod
    def claim(self, state_id: str, token: str, claimed: Path) -> bool:
        """Take the state for one resume under ``token`` and move its directory to ``claimed``;
        False when it is not there (another resume took it, or it was deleted)."""

    @abstractmethod
    def release(self, state_id: str, token: str, claimed: Path) -> None:
        """Give a claimed state back: its directory from ``claimed`` to its place."""

    @abstractmethod
    def drop(self, state_id: str, token: str, claimed: Path) -> None:
        """Remove a claimed state for good (its resume succeeded)."""

    @abstractmethod
    def delete(self, state_id: str) -> bool:
        """Remove an unclaimed state; False when it was not there (claimed or gone)."""

    @abstractmethod
    def unclaim(self, state_id: str, token: str) -> None:
        """Forget the claim ``token`` holds (its directory was moved back already)."""

    @abstractmethod
    def stale_claims(self) -> builtins.list[tuple[str, str]]:
        """(id, token) of claims older than :data:`CLAIM_STALE_S` whose directory is not in the
        staging area (a resume that died between taking the claim and moving the bytes)."""

    @abstractmethod
    def strays(self) -> builtins.list[tuple[str, str]]:
        """(id, manifest) of states committed with their manifest beside the bytes that this
        index does not hold (saved before the home used the database): to :meth:`adopt`."""

    @abstractmethod
    def adopt(self, entry: Entry) -> None:
        """Hold a stray state (its manifest checked by the caller) as if committed here."""

    @abstractmethod
    def close(self) -> None:
        """Let go of what the index holds open (a later call opens it again)."""

    # -- directories, alike for both ---------------------------------------------------------------

    def directory(self, state_id: str) -> Path:
        return self.root / state_id

    def remove_dir(self, directory: Path) -> bool:
        """Rename ``directory`` out of the listing, then remove it (a concurrent listing never
        reads half a state); False when it was not there."""
        gone = self.root / ".staging" / f"gone-{uuid.uuid4().hex}"
        gone.parent.mkdir(mode=0o700, exist_ok=True)
        try:
            directory.rename(gone)
        except FileNotFoundError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True


class FileIndex(StateIndex):
    """Each state's manifest in ``ID/manifest.json`` (see the module)."""

    def close(self) -> None:
        pass  # nothing held open between calls

    def strays(self) -> builtins.list[tuple[str, str]]:
        return []  # every manifest beside its bytes is this index's own

    def adopt(self, entry: Entry) -> None:
        _write(self.directory(entry.id), entry.document)  # where it already is: kept as it is

    def put(self, entry: Entry, staging: Path, final: Path) -> None:
        _write(staging, entry.document)
        staging.rename(final)

    def rewrite(self, entry: Entry, directory: Path) -> None:
        _write(directory, entry.document)

    def document(self, state_id: str, claim: str | None) -> str:
        directory = (
            self.directory(state_id) if claim is None else claim_dir(self.root, state_id, claim)
        )
        try:
            return (directory / MANIFEST).read_text()
        except FileNotFoundError:
            raise NotIndexed(state_id) from None

    def entries(
        self,
        *,
        owner: str | None,
        any_owner: bool,
        kind: str | None,
        name: str | None,
        expired_before: float | None,
    ) -> builtins.list[tuple[str, str]]:
        # A file holds no column to filter on before its manifest is read: the caller filters.
        found: builtins.list[tuple[str, str]] = []
        for d in self.root.iterdir():
            with contextlib.suppress(OSError):
                found.append((d.name, (d / MANIFEST).read_text()))
        return found

    def claim(self, state_id: str, token: str, claimed: Path) -> bool:
        try:
            self.directory(state_id).rename(claimed)
        except FileNotFoundError:
            return False
        return True

    def release(self, state_id: str, token: str, claimed: Path) -> None:
        with contextlib.suppress(OSError):
            claimed.rename(self.directory(state_id))

    def drop(self, state_id: str, token: str, claimed: Path) -> None:
        shutil.rmtree(claimed, ignore_errors=True)

    def delete(self, state_id: str) -> bool:
        return self.remove_dir(self.directory(state_id))

    def unclaim(self, state_id: str, token: str) -> None:
        pass  # the claim was the directory's place, and it is back

    def stale_claims(self) -> builtins.list[tuple[str, str]]:
        return []  # a claim is its directory in the staging area, given back by the store's sweep


class PgIndex(StateIndex):
    """Each state's manifest in a row of ``sandcell_states.states`` (see the module). Connects
    on first use; thread-safe."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root)
        self.url = url
        self._lock = threading.Lock()
        self._conn: PgConnection | None = None

    @contextlib.contextmanager
    def _db(self) -> Iterator[PgConnection]:
        """The connection, one statement (or an explicit transaction) at a time."""
        from sandcell.db.migrate import ensure_current
        from sandcell.db.postgres import DatabaseUnavailable, PgConnection

        with self._lock:
            try:
                if self._conn is None:
                    ensure_current(self.url)
                    self._conn = PgConnection(self.url, schema=SCHEMA)
                yield self._conn
            except DatabaseUnavailable as e:
                raise StoreUnavailable(f"saved states: {e}; try again once it is back") from e

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def strays(self) -> builtins.list[tuple[str, str]]:
        found: builtins.list[tuple[str, str]] = []
        for d in self.root.iterdir():
            with contextlib.suppress(OSError):
                found.append((d.name, (d / MANIFEST).read_text()))
        return found

    def adopt(self, entry: Entry) -> None:
        with self._db() as db:
            # A row of that id already there is newer than the file: the file just goes.
            db.execute(
                "INSERT INTO states (id, kind, name, owner, session_id, manifest, stored_bytes, "
                "created_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?::timestamptz, to_timestamp(?)) "
                "ON CONFLICT (id) DO NOTHING",
                _row(entry),
            )
        with contextlib.suppress(FileNotFoundError):
            (self.directory(entry.id) / MANIFEST).unlink()

    def put(self, entry: Entry, staging: Path, final: Path) -> None:
        staging.rename(final)  # the bytes first: a row never names bytes not yet in place
        try:
            with self._db() as db:
                db.execute(
                    "INSERT INTO states (id, kind, name, owner, session_id, manifest, "
                    "stored_bytes, created_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?::timestamptz, to_timestamp(?)) "
                    "ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, name = excluded.name, "
                    "owner = excluded.owner, session_id = excluded.session_id, "
                    "manifest = excluded.manifest, stored_bytes = excluded.stored_bytes, "
                    "created_at = excluded.created_at, expires_at = excluded.expires_at, "
                    "claim = NULL, claimed_at = NULL",
                    _row(entry),
                )
        except BaseException:
            with contextlib.suppress(OSError):
                final.rename(staging)  # not committed: the caller discards or retries it
            raise

    def rewrite(self, entry: Entry, directory: Path) -> None:
        with self._db() as db:
            db.execute("UPDATE states SET manifest = ? WHERE id = ?", (entry.document, entry.id))

    def document(self, state_id: str, claim: str | None) -> str:
        with self._db() as db:
            row = db.execute(
                "SELECT manifest FROM states WHERE id = ? AND claim IS NOT DISTINCT FROM ?::text",
                (state_id, claim),
            ).fetchone()
        if row is None:
            raise NotIndexed(state_id)
        return str(row[0])

    def entries(
        self,
        *,
        owner: str | None,
        any_owner: bool,
        kind: str | None,
        name: str | None,
        expired_before: float | None,
    ) -> builtins.list[tuple[str, str]]:
        where = ["claim IS NULL"]
        params: list[object] = []
        if not any_owner:
            where.append("owner IS NOT DISTINCT FROM ?::text")
            params.append(owner)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if expired_before is not None:
            where.append("expires_at <= to_timestamp(?)")
            params.append(expired_before)
        else:
            where.append("(expires_at IS NULL OR expires_at > to_timestamp(?))")
            params.append(time.time())
        sql = f"SELECT id, manifest FROM states WHERE {' AND '.join(where)} ORDER BY created_at, id"  # noqa: S608 (only fixed clauses)
        with self._db() as db:
            rows = db.execute(sql, tuple(params)).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def claim(self, state_id: str, token: str, claimed: Path) -> bool:
        with self._db() as db:
            row = db.execute(
                "UPDATE states SET claim = ?, claimed_at = now() "
                "WHERE id = ? AND claim IS NULL RETURNING id",
                (token, state_id),
            ).fetchone()
        if row is None:
            return False
        try:
            self.directory(state_id).rename(claimed)
        except FileNotFoundError:
            # The row names bytes that are gone: give the row back, for the caller to report.
            self.unclaim(state_id, token)
            return False
        except BaseException:
            self.unclaim(state_id, token)
            raise
        return True

    def release(self, state_id: str, token: str, claimed: Path) -> None:
        with contextlib.suppress(OSError):
            claimed.rename(self.directory(state_id))
        self.unclaim(state_id, token)

    def unclaim(self, state_id: str, token: str) -> None:
        with self._db() as db:
            db.execute(
                "UPDATE states SET claim = NULL, claimed_at = NULL WHERE id = ? AND claim = ?",
                (state_id, token),
            )

    def drop(self, state_id: str, token: str, claimed: Path) -> None:
        with self._db() as db:
            db.execute("DELETE FROM states WHERE id = ? AND claim = ?", (state_id, token))
        shutil.rmtree(claimed, ignore_errors=True)

    def delete(self, state_id: str) -> bool:
        with self._db() as db:
            row = db.execute(
                "DELETE FROM states WHERE id = ? AND claim IS NULL RETURNING id", (state_id,)
            ).fetchone()
        if row is None:
            return False
        self.remove_dir(self.directory(state_id))
        return True

    def stale_claims(self) -> builtins.list[tuple[str, str]]:
        with self._db() as db:
            rows = db.execute(
                "SELECT id, claim FROM states WHERE claim IS NOT NULL "
                "AND claimed_at < now() - make_interval(secs => ?)",
                (CLAIM_STALE_S,),
            ).fetchall()
        return [
            (str(i), str(t)) for i, t in rows if not claim_dir(self.root, str(i), str(t)).exists()
        ]


def claim_dir(root: Path, state_id: str, token: str) -> Path:
    """Where a claimed state's directory waits for its resume (the store's sweep gives back
    one left there by a resume that died)."""
    return root / ".staging" / f"claim-{state_id}-{token}"


def _row(entry: Entry) -> tuple[object, ...]:
    """The values of a row of ``states``, in the order its INSERTs name them."""
    return (
        entry.id,
        entry.kind,
        entry.name,
        entry.owner,
        entry.session_id,
        entry.document,
        entry.stored_bytes,
        entry.created_at,
        entry.expires_at,
    )


def _write(directory: Path, document: str) -> None:
    tmp = directory / f"{MANIFEST}.tmp"
    tmp.write_text(document)
    tmp.chmod(0o600)
    tmp.replace(directory / MANIFEST)


def open_index(root: Path) -> StateIndex:
    """The index for ``root``: PostgreSQL's when ``$SANDCELL_DATABASE_URL`` is set."""
    url = database_url()
    return FileIndex(root) if url is None else PgIndex(root, url)
