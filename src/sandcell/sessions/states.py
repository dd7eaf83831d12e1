"""Saved session states under the home: paused sessions, named snapshots, and fork points.

Layout, one directory per state::

    <home>/states/
        .key                 32 random bytes (0600): signs every manifest
        .staging/UUID/       a state being written (a rung's ``save`` fills ``data/``)
        ID/manifest.json     what the state is (:class:`StoredState`), signed
        ID/data/...          what the rung wrote (:mod:`sandcell.backends.cell.state`)

With ``$SANDCELL_DATABASE_URL`` set, ``ID/manifest.json`` is instead a row of PostgreSQL
(``sandcell_states.states``), signed the same way, and a claim is taken there: the replicas that
share the directory (``$SANDCELL_SHARED_DIR``) and the database share the states
(:mod:`sandcell.sessions.state_index` keeps either).

A state is committed by hashing every file under ``data/`` (SHA-256, regular files only: a link
or a device in it is refused) into the manifest, signing the manifest with HMAC-SHA256 under the
home's key, and renaming the staging directory into place, so a listing never sees half a state.
:meth:`StateStore.load` checks the signature and every file's size and hash before a rung reads
any of it: a state whose bytes changed on disk, or whose manifest was edited (its owner, its
profile, its limits), is refused with :class:`StateTampered` and never loaded. Someone who can
read the key can forge a state; the key lives in the home, as the audit log and the artifacts
do, so this guards against changes to the state files (shared storage, a copy from elsewhere),
not against the home's owner.

Kinds: ``paused`` (a session's, under the session's id; a resume consumes it), ``snapshot`` (a
name chosen by its owner, kept until deleted or expired; sessions start from it), ``fork`` (the
point a fork restores its copies from, removed once they started). Each state has an owner (the
tenant's id in the service, None for a local user); another owner's state is "not found".
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import stat
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandcell.backends.cell.state import RestorePoint, SavedState
from sandcell.errors import ConfigError, InfraError
from sandcell.sessions.state_index import (
    CLAIM_STALE_S,
    Entry,
    NotIndexed,
    StateIndex,
    claim_dir,
    open_index,
)

StateKind = Literal["paused", "snapshot", "fork"]

_ID = re.compile(r"^[0-9a-f]{8,32}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class StateNotFound(ConfigError):
    """No such state for this owner (or it expired)."""


class StateTampered(ConfigError):
    """A state's files or manifest changed on disk after it was saved; it is never loaded."""


def check_snapshot_name(name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(
            f"{name!r} is not a snapshot name: use 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSettings:
    """What a session was opened with, so that it comes back the same: its profile's name and
    the parts of its request a resume admits again under that profile."""

    profile: str
    limits: Mapping[str, Any]
    inputs: tuple[tuple[str, str], ...]
    """(host path, name) of each input."""
    mode: str
    landlock: bool | None
    runtime: str | None
    idle_timeout_s: float
    max_lifetime_s: float
    on_idle: str
    paused_ttl_s: float
    language: str = "python"
    """The kernel's language (a state saved before sessions had one: ``python``)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "limits": dict(self.limits),
            "inputs": [list(i) for i in self.inputs],
            "mode": self.mode,
            "landlock": self.landlock,
            "runtime": self.runtime,
            "idle_timeout_s": self.idle_timeout_s,
            "max_lifetime_s": self.max_lifetime_s,
            "on_idle": self.on_idle,
            "paused_ttl_s": self.paused_ttl_s,
            "language": self.language,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SessionSettings:
        landlock = d.get("landlock")
        runtime = d.get("runtime")
        return cls(
            profile=str(d["profile"]),
            limits=dict(d["limits"]),
            inputs=tuple((str(p), str(n)) for p, n in d["inputs"]),
            mode=str(d["mode"]),
            landlock=None if landlock is None else bool(landlock),
            runtime=None if runtime is None else str(runtime),
            idle_timeout_s=float(d["idle_timeout_s"]),
            max_lifetime_s=float(d["max_lifetime_s"]),
            on_idle=str(d["on_idle"]),
            paused_ttl_s=float(d["paused_ttl_s"]),
            language=str(d.get("language", "python")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredState:
    """One committed state, as its manifest says."""

    id: str
    kind: StateKind
    name: str | None
    """A snapshot's name; None for the other kinds."""
    owner: str | None
    session_id: str
    """The session it was saved from."""
    created_at: str
    expires_at: float | None
    """Unix time after which it is swept; None: kept until deleted."""
    cells: int
    """Cells the session had run when it was saved."""
    settings: SessionSettings
    saved: SavedState
    files: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """Path under ``data/`` -> (size, SHA-256)."""
    stored_bytes: int = 0
    """Disk blocks the state holds (sparse files count what they use)."""
    record: str | None = None
    """The run id of the record that saved it (its event in the audit chain)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """What the surface that opened the session keeps with it (:attr:`Session.labels
    <sandcell.sessions.Session.labels>`; the E2B API's sandbox, for one), signed with the rest.
    Never listed: a surface may keep a secret of its own here."""
    directory: Path = Path()

    @property
    def digest(self) -> str:
        """One SHA-256 over every file's path, size and hash: the state's identity in records."""
        h = hashlib.sha256()
        for path in sorted(self.files):
            size, sha = self.files[path]
            h.update(f"{path}\0{size}\0{sha}\n".encode())
        return h.hexdigest()

    @property
    def restore_point(self) -> RestorePoint:
        return RestorePoint(state_dir=self.directory / "data", saved=self.saved)

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def summary(self) -> dict[str, object]:
        """What a listing shows (no host paths)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "session_id": self.session_id,
            "profile": self.settings.profile,
            "backend": self.saved.backend,
            "mode": self.saved.mode.value,
            "created_at": self.created_at,
            "expires_at": None
            if self.expires_at is None
            else dt.datetime.fromtimestamp(self.expires_at, dt.UTC).isoformat(),
            "cells": self.cells,
            "stored_bytes": self.stored_bytes,
            "sha256": self.digest,
        }


def _manifest_body(state: StoredState) -> dict[str, object]:
    return {
        "id": state.id,
        "kind": state.kind,
        "name": state.name,
        "owner": state.owner,
        "session_id": state.session_id,
        "created_at": state.created_at,
        "expires_at": state.expires_at,
        "cells": state.cells,
        "settings": state.settings.to_dict(),
        "saved": state.saved.to_dict(),
        "files": {p: [s, h] for p, (s, h) in sorted(state.files.items())},
        "stored_bytes": state.stored_bytes,
        "record": state.record,
        "labels": dict(state.labels),
    }


def _canonical(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


HASH_BLOCK = 1 << 20
_ZERO_BLOCK = hashlib.sha256(bytes(HASH_BLOCK)).digest()


def _hash_file(path: Path) -> str:
    """A file's content hash: SHA-256 over the SHA-256 of each :data:`HASH_BLOCK` bytes, then
    the size. A block in a hole of a sparse file is a block of zeros and is not read (its
    digest is known), so a microVM's RAM file, mostly holes, is hashed for what it holds, not
    for its size; the digest depends only on the bytes, never on how the file is stored."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        extents = _data_extents(fd, size)
        i = 0
        for start in range(0, size, HASH_BLOCK):
            end = min(start + HASH_BLOCK, size)
            while i < len(extents) and extents[i][1] <= start:
                i += 1
            if i < len(extents) and extents[i][0] < end:
                f.seek(start)
                h.update(hashlib.sha256(f.read(end - start)).digest())
            elif end - start == HASH_BLOCK:
                h.update(_ZERO_BLOCK)
            else:
                h.update(hashlib.sha256(bytes(end - start)).digest())
    h.update(size.to_bytes(8, "big"))
    return h.hexdigest()


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) ranges of ``fd`` that hold data (``SEEK_DATA``/``SEEK_HOLE``); the whole
    file where the file system does not say."""
    extents: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # nothing but a hole after pos
                    break
                raise
            end = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, end))
            pos = end
    except OSError:
        return [(0, size)]
    return extents


def _walk(data: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Every entry under ``data`` (relative path, path, lstat), directories included."""
    for dirpath, dirnames, filenames in os.walk(data, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            p = base / name
            yield str(p.relative_to(data)), p, p.lstat()


class StateStore:
    """The saved states of one home (see the module). Safe to share between threads
    and processes: a state is written once, put in place in one step, and only deleted after.

    Where the manifests live is ``index``'s business (:mod:`sandcell.sessions.state_index`):
    beside the bytes by default, rows of PostgreSQL with ``$SANDCELL_DATABASE_URL`` set, so the
    replicas sharing the directory and the database list, resume and sweep the same states."""

    def __init__(self, root: Path, index: StateIndex | None = None) -> None:
        self.root = root
        self._index = index if index is not None else open_index(root)

    def close(self) -> None:
        """Let go of the index's connection (a later call opens it again)."""
        self._index.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the directory ---------------------------------------------------------------------

    def _dir(self) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.root.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise InfraError(
                f"the state directory {self.root} is not a directory private to uid "
                f"{os.geteuid()}; remove it, or point SANDCELL_HOME at a directory only you "
                "can write"
            )
        return self.root

    def _key(self) -> bytes:
        path = self._dir() / ".key"
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            tmp = self.root / f".key.{uuid.uuid4().hex}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            try:
                os.link(tmp, path)  # the first writer wins; the others read its key
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            key = path.read_bytes()
        if len(key) != 32:
            raise InfraError(f"the state key {path} is damaged; remove the states directory")
        return key

    def staging(self) -> Path:
        """A new empty directory for a rung's ``save`` (its ``data/``); commit or discard it."""
        d = self._dir() / ".staging" / uuid.uuid4().hex
        (d / "data").mkdir(mode=0o700, parents=True)
        return d

    @staticmethod
    def discard(staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    # -- writing ---------------------------------------------------------------------------

    def commit(
        self,
        staging: Path,
        *,
        kind: StateKind,
        state_id: str,
        name: str | None,
        owner: str | None,
        session_id: str,
        cells: int,
        settings: SessionSettings,
        saved: SavedState,
        ttl_s: float | None,
        record: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> StoredState:
        """Hash what the rung wrote under ``staging/data``, sign the manifest and put the state
        in place as ``state_id`` (an existing state of that id is replaced: a session paused
        again). Raises InfraError for anything in it but directories and regular files, and
        StoreUnavailable (nothing committed) when the database cannot be reached."""
        data = staging / "data"
        files: dict[str, tuple[int, str]] = {}
        blocks = 0
        for rel, path, st in _walk(data):
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise InfraError(f"the saved state holds {rel}, which is not a regular file")
            files[rel] = (st.st_size, _hash_file(path))
            blocks += st.st_blocks * 512
        state = StoredState(
            id=state_id,
            kind=kind,
            name=name,
            owner=owner,
            session_id=session_id,
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
            expires_at=None if ttl_s is None else time.time() + ttl_s,
            cells=cells,
            settings=settings,
            saved=saved,
            files=files,
            stored_bytes=blocks,
            record=record,
            labels=dict(labels or {}),
        )
        final = self._dir() / state_id
        old = None
        if final.exists():
            old = self._dir() / ".staging" / f"old-{uuid.uuid4().hex}"
            final.rename(old)
        try:
            self._index.put(self._entry(state), staging, final)
        except BaseException:
            if old is not None:
                with contextlib.suppress(OSError):
                    old.rename(final)  # the state it was to replace stays
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return _with_dir(state, final)

    def _entry(self, state: StoredState) -> Entry:
        """The state's index entry: its manifest, signed with the home's key."""
        body = _manifest_body(state)
        sig = hmac.new(self._key(), _canonical(body), hashlib.sha256).hexdigest()
        return Entry(
            id=state.id,
            kind=state.kind,
            name=state.name,
            owner=state.owner,
            session_id=state.session_id,
            created_at=state.created_at,
            expires_at=state.expires_at,
            stored_bytes=state.stored_bytes,
            document=json.dumps({"manifest": body, "hmac": sig}, indent=1),
        )

    def set_record(self, state: StoredState, record: str) -> StoredState:
        """The state with the run id of the record that saved it (re-signed)."""
        updated = StoredState(**{**_fields(state), "record": record})
        self._index.rewrite(self._entry(updated), state.directory)
        return updated

    # -- reading ---------------------------------------------------------------------------

    def _document(self, state_id: str, claim: str | None = None) -> str:
        """The state's manifest document as the index holds it, unverified."""
        try:
            return self._index.document(state_id, claim)
        except NotIndexed:
            raise StateNotFound(f"no saved state {state_id}") from None
        except OSError as exc:
            raise StateTampered(
                f"the manifest of saved state {state_id} is unreadable ({exc})"
            ) from None

    def _parse(self, document: str, state_id: str, directory: Path) -> StoredState:
        """The manifest ``document``, signature checked, and naming ``state_id``: a state copied
        under another id is refused too."""
        try:
            raw = json.loads(document)
            body, sig = raw["manifest"], raw["hmac"]
        except (ValueError, KeyError, TypeError) as exc:
            raise StateTampered(
                f"the manifest of saved state {state_id} is unreadable ({exc})"
            ) from None
        want = hmac.new(self._key(), _canonical(body), hashlib.sha256).hexdigest()
        if not isinstance(sig, str) or not hmac.compare_digest(sig, want):
            raise StateTampered(
                f"the manifest of saved state {state_id} was changed after it was saved; "
                "it will not be loaded (delete it)"
            )
        try:
            state = StoredState(
                id=str(body["id"]),
                kind=body["kind"],
                name=body["name"],
                owner=body["owner"],
                session_id=str(body["session_id"]),
                created_at=str(body["created_at"]),
                expires_at=body["expires_at"],
                cells=int(body["cells"]),
                settings=SessionSettings.from_dict(body["settings"]),
                saved=SavedState.from_dict(body["saved"]),
                files={str(p): (int(s), str(h)) for p, (s, h) in body["files"].items()},
                stored_bytes=int(body["stored_bytes"]),
                record=body.get("record"),
                # States saved before labels existed have none (their signature covers that).
                labels={str(k): str(v) for k, v in (body.get("labels") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateTampered(f"the manifest of saved state {state_id}: {exc}") from None
        if state.id != state_id:
            raise StateTampered(
                f"saved state {state_id} holds the manifest of {state.id}; "
                "it will not be loaded (delete it)"
            )
        return _with_dir(state, directory)

    def _visible(self, state_id: str, owner: str | None) -> StoredState:
        if not _ID.match(state_id):
            raise StateNotFound(f"{state_id!r} is not a state id (8-32 hex digits)")
        directory = self._dir() / state_id
        document = self._document(state_id)
        try:
            state = self._parse(document, state_id, directory)
        except StateTampered:
            # Tampering is said only to the owner the manifest names; to anyone else the
            # state does not exist, as an intact one of another owner does not.
            if _claimed_owner(document) != owner:
                raise StateNotFound(f"no saved state {state_id}") from None
            raise
        if state.owner != owner or state.expired():
            raise StateNotFound(f"no saved state {state_id}")
        return state

    def get(self, state_id: str, *, owner: str | None) -> StoredState:
        """The state's manifest (signature checked), without hashing its files."""
        return self._visible(state_id, owner)

    def load(self, state_id: str, *, owner: str | None) -> StoredState:
        """The state, checked whole: signature, then every file's size and hash, and nothing
        more in ``data/`` than the manifest names. Raises StateNotFound, StateTampered."""
        state = self._visible(state_id, owner)
        return self._checked(state.directory, state_id, None)

    def _checked(self, directory: Path, state_id: str, claim: str | None) -> StoredState:
        state = self._parse(self._document(state_id, claim), state_id, directory)
        data = directory / "data"
        seen: set[str] = set()
        for rel, path, st in _walk(data):
            if stat.S_ISDIR(st.st_mode):
                continue
            expected = state.files.get(rel)
            if (
                expected is None
                or not stat.S_ISREG(st.st_mode)
                or st.st_size != expected[0]
                or _hash_file(path) != expected[1]
            ):
                raise StateTampered(
                    f"saved state {state_id}: {rel} changed after it was saved; the state will "
                    "not be loaded (delete it)"
                )
            seen.add(rel)
        missing = set(state.files) - seen
        if missing:
            raise StateTampered(
                f"saved state {state_id}: {sorted(missing)[0]} is missing; the state will not be "
                "loaded (delete it)"
            )
        return state

    def find_snapshot(self, name: str, *, owner: str | None) -> StoredState:
        check_snapshot_name(name)
        for state in self._listed(owner=owner, kind="snapshot", name=name, any_owner=False):
            return state
        raise StateNotFound(f"no snapshot named {name!r}; see the snapshot listing")

    def list(
        self, *, owner: str | None, kind: StateKind | None = None, any_owner: bool = False
    ) -> builtins.list[StoredState]:
        """The owner's states (every owner's with ``any_owner``), oldest first; expired ones and
        leftovers of dead saves are swept on the way. A state whose manifest is damaged is
        listed nowhere (and kept for inspection)."""
        return self._listed(owner=owner, kind=kind, name=None, any_owner=any_owner)

    def _listed(
        self, *, owner: str | None, kind: StateKind | None, name: str | None, any_owner: bool
    ) -> builtins.list[StoredState]:
        self.sweep()
        root = self._dir()
        found: list[StoredState] = []
        now = time.time()
        candidates = self._index.entries(
            owner=owner, any_owner=any_owner, kind=kind, name=name, expired_before=None
        )
        for state_id, document in candidates:
            if not _ID.match(state_id):
                continue
            try:
                state = self._parse(document, state_id, root / state_id)
            except ConfigError:
                continue
            # The manifest decides, never the index's columns (they are not signed).
            if (
                (any_owner or state.owner == owner)
                and (kind is None or state.kind == kind)
                and (name is None or state.name == name)
                and not state.expired(now)
            ):
                found.append(state)
        return sorted(found, key=lambda s: s.created_at)

    def stored_bytes(self, *, owner: str | None) -> int:
        return sum(s.stored_bytes for s in self.list(owner=owner))

    # -- claiming (a resume takes a paused state out of the listing) --------------------------

    def claim(self, state_id: str, *, owner: str | None) -> StoredState:
        """Take the state out of the listing for one resume, checked whole (as :meth:`load`):
        a second resume of the same state, in this process or another replica, finds nothing.
        :meth:`release` puts it back when the resume fails; :meth:`drop_claimed` removes it once
        the resume succeeded."""
        self._visible(state_id, owner)
        token = uuid.uuid4().hex
        claimed = claim_dir(self._dir(), state_id, token)
        claimed.parent.mkdir(mode=0o700, exist_ok=True)
        if not self._index.claim(state_id, token, claimed):
            raise StateNotFound(f"no saved state {state_id} (another resume took it)")
        try:
            os.utime(claimed)  # a claim is young: the sweep gives it back only if it is abandoned
            return self._checked(claimed, state_id, token)
        except BaseException:
            self._index.release(state_id, token, claimed)
            raise

    def release(self, state: StoredState) -> None:
        """Put a claimed state back (its resume failed: nothing is lost)."""
        token = _claim_token(state)
        if token is not None:
            self._index.release(state.id, token, state.directory)

    def drop_claimed(self, state: StoredState) -> None:
        token = _claim_token(state)
        if token is not None:
            self._index.drop(state.id, token, state.directory)

    # -- removing --------------------------------------------------------------------------

    def delete(self, state_id: str, *, owner: str | None) -> StoredState:
        state = self._visible(state_id, owner)
        self._index.delete(state_id)
        return state

    def sweep(self) -> builtins.list[str]:
        """Remove expired states and the staging leftovers of saves that died; give back the
        states of resumes that died holding them. Returns the ids of the states removed."""
        removed: builtins.list[str] = []
        root = self._dir()
        now = time.time()
        for state_id, document in self._index.strays():
            # Saved before this home used the database: taken in, never lost (a manifest that
            # does not verify stays a file, listed nowhere, as a damaged one always was).
            if _ID.match(state_id):
                with contextlib.suppress(ConfigError):
                    self._index.adopt(self._entry(self._parse(document, state_id, root)))
        expired = self._index.entries(
            owner=None, any_owner=True, kind=None, name=None, expired_before=now
        )
        for state_id, document in expired:
            if not _ID.match(state_id):
                continue
            with contextlib.suppress(ConfigError):
                state = self._parse(document, state_id, root / state_id)
                if state.expired(now) and self._index.delete(state_id):
                    removed.append(state_id)
        staging = root / ".staging"
        if staging.is_dir():
            for d in staging.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    gone = d.name.startswith(("gone-", "old-"))
                    stale = now - d.lstat().st_mtime > CLAIM_STALE_S
                    if d.name.startswith("claim-"):
                        # A resume that died with the state claimed: give it back, never lose it.
                        state_id, _, token = d.name.removeprefix("claim-").partition("-")
                        if stale and _ID.match(state_id) and not (root / state_id).exists():
                            d.rename(root / state_id)
                            self._index.unclaim(state_id, token)
                    elif gone or stale:
                        shutil.rmtree(d, ignore_errors=True)
        for state_id, token in self._index.stale_claims():
            self._index.unclaim(state_id, token)
        return removed


def _claim_token(state: StoredState) -> str | None:
    """The claim a claimed state's directory was taken under; None for a state not claimed."""
    prefix = f"claim-{state.id}-"
    name = state.directory.name
    if state.directory.parent.name != ".staging" or not name.startswith(prefix):
        return None
    return name[len(prefix) :]


def _claimed_owner(document: str) -> object:
    """The owner an unverified manifest names (a sentinel when it names none)."""
    try:
        return json.loads(document)["manifest"]["owner"]
    except (ValueError, KeyError, TypeError):
        return _NOBODY


_NOBODY = object()


def _fields(state: StoredState) -> dict[str, Any]:
    return {f: getattr(state, f) for f in StoredState.__dataclass_fields__}


def _with_dir(state: StoredState, directory: Path) -> StoredState:
    return StoredState(**{**_fields(state), "directory": directory})


__all__ = [
    "SessionSettings",
    "StateKind",
    "StateNotFound",
    "StateStore",
    "StateTampered",
    "StoredState",
    "check_snapshot_name",
]
