"""The state of a working directory: every entry's kind, mode, content hash and link target.

The walk goes through directory descriptors opened ``O_NOFOLLOW``, so a symbolic link anywhere in
the tree is recorded as a link (its target text), never followed out of the directory. A socket,
FIFO or device node is refused with its path: copied into a sandbox it would be a channel to the
host, and applied back it would be one into the target. ``.git`` is walked for the copy (so that
``git diff`` and tests work inside) but left out of the state that diffs and target checks compare:
a change set never touches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sandcell.errors import ConfigError

GIT_DIR = ".git"
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HAZARDS = {
    stat.S_IFSOCK: "a unix socket",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
MAX_DEPTH = 64


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of the tree. ``mode`` is the permission bits (0 for a link)."""

    kind: str
    """``file``, ``dir`` or ``symlink``."""
    mode: int
    sha256: str | None = None
    size: int = 0
    target: str | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "mode": self.mode}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
            out["size"] = self.size
        if self.target is not None:
            out["target"] = self.target
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Entry:
        kind = d.get("kind")
        if kind not in ("file", "dir", "symlink"):
            raise ConfigError(f"a manifest entry of unknown kind {kind!r}")
        sha = d.get("sha256")
        target = d.get("target")
        return cls(
            kind=str(kind),
            mode=int(d.get("mode", 0)),  # type: ignore[call-overload]
            sha256=None if sha is None else str(sha),
            size=int(d.get("size", 0)),  # type: ignore[call-overload]
            target=None if target is None else str(target),
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """A tree's entries by relative path (``/``-separated, sorted), ``.git`` and all under it
    excluded; ``git_entries`` counts what ``.git`` holds (it is copied, never compared)."""

    entries: Mapping[str, Entry]
    git_entries: int = 0
    total_bytes: int = 0
    left_out: tuple[str, ...] = ()
    """Paths of ``entries`` the sandbox was not given (credentials the profile keeps on the
    host, :mod:`sandcell.changes.credentials`): a change set never writes them."""

    def to_json(self) -> bytes:
        body = {
            "version": 1,
            "entries": {p: e.to_dict() for p, e in sorted(self.entries.items())},
            "git_entries": self.git_entries,
            "total_bytes": self.total_bytes,
            "left_out": list(self.left_out),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @property
    def sha256(self) -> str:
        """A hash of the state (the canonical JSON of the entries): two trees with the same
        hash hold the same paths, kinds, modes, contents and link targets."""
        body = {p: e.to_dict() for p, e in sorted(self.entries.items())}
        return hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            body = json.loads(data)
            raw = body["entries"]
            entries = {str(p): Entry.from_dict(e) for p, e in raw.items()}
            return cls(
                entries=entries,
                git_entries=int(body.get("git_entries", 0)),
                total_bytes=int(body.get("total_bytes", 0)),
                left_out=tuple(str(p) for p in body.get("left_out", [])),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"a workdir manifest that does not parse: {exc}") from None


@dataclass(frozen=True, slots=True)
class Walked:
    """One entry met by :func:`walk`: its relative path, lstat, and a descriptor of its parent
    directory (valid only during the iteration step)."""

    rel: str
    st: os.stat_result
    parent_fd: int
    name: str


def open_root(path: os.PathLike[str] | str) -> int:
    """A descriptor of the directory ``path`` (itself may be named through a link; nothing
    inside is followed). ConfigError when it is not a readable directory."""
    try:
        return os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(
            f"{os.fspath(path)!r} is not a readable directory: {exc.strerror}; pass a directory"
        ) from None


def walk(root_fd: int, *, max_entries: int, what: str) -> Iterator[Walked]:
    """Every entry under ``root_fd`` in sorted order, depth first, without following links;
    ConfigError for a hazard (socket, FIFO, device), for more than ``max_entries`` entries and
    for nesting deeper than :data:`MAX_DEPTH`."""
    count = 0

    def rec(dir_fd: int, prefix: str, depth: int) -> Iterator[Walked]:
        nonlocal count
        if depth > MAX_DEPTH:
            raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} directories at {prefix!r}")
        for name in sorted(os.listdir(dir_fd)):
            count += 1
            if count > max_entries:
                raise ConfigError(
                    f"{what} has more than {max_entries} entries (the workspace's inode limit); "
                    "pass a smaller directory or raise the limit"
                )
            rel = prefix + name
            st = os.lstat(name, dir_fd=dir_fd)
            hazard = _HAZARDS.get(stat.S_IFMT(st.st_mode))
            if hazard:
                raise ConfigError(
                    f"{what} contains {hazard} at {rel!r}; only files, directories and symbolic "
                    "links can be copied; remove it or pass a copy of the directory without it"
                )
            yield Walked(rel, st, dir_fd, name)
            if stat.S_ISDIR(st.st_mode):
                fd = os.open(name, _O_DIR, dir_fd=dir_fd)
                try:
                    yield from rec(fd, rel + "/", depth + 1)
                finally:
                    os.close(fd)

    yield from rec(root_fd, "", 0)


def is_git(rel: str) -> bool:
    return rel == GIT_DIR or rel.startswith(GIT_DIR + "/")


def hash_fd(fd: int) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def entry_of(w: Walked) -> Entry:
    """The :class:`Entry` of a walked path (reads a file's content to hash it)."""
    mode = stat.S_IMODE(w.st.st_mode)
    if stat.S_ISLNK(w.st.st_mode):
        return Entry("symlink", 0, target=os.readlink(w.name, dir_fd=w.parent_fd))
    if stat.S_ISDIR(w.st.st_mode):
        return Entry("dir", mode)
    fd = os.open(w.name, _O_FILE, dir_fd=w.parent_fd)
    try:
        digest, size = hash_fd(fd)
    finally:
        os.close(fd)
    return Entry("file", mode, sha256=digest, size=size)


def tree_state(path: os.PathLike[str] | str, *, max_entries: int = 200_000) -> Manifest:
    """The :class:`Manifest` of the directory at ``path`` as it is now (``.git`` excluded)."""
    root = open_root(path)
    try:
        entries: dict[str, Entry] = {}
        git = 0
        total = 0
        for w in walk(root, max_entries=max_entries, what=f"directory {os.fspath(path)!r}"):
            if is_git(w.rel):
                git += 1
                continue
            e = entries[w.rel] = entry_of(w)
            total += e.size
        return Manifest(entries=entries, git_entries=git, total_bytes=total)
    finally:
        os.close(root)


def differences(expected: Manifest, actual: Manifest, *, limit: int = 20) -> list[str]:
    """What differs between two states, one line per path (at most ``limit`` lines)."""
    out: list[str] = []
    for rel in sorted(set(expected.entries) | set(actual.entries)):
        a, b = expected.entries.get(rel), actual.entries.get(rel)
        if a == b:
            continue
        if b is None:
            out.append(f"{rel}: missing (was a {a.kind if a else '?'})")
        elif a is None:
            out.append(f"{rel}: not in the run's starting state (a {b.kind} now)")
        elif a.kind != b.kind:
            out.append(f"{rel}: a {b.kind} now, was a {a.kind}")
        elif a.sha256 != b.sha256 or a.target != b.target:
            out.append(f"{rel}: content changed")
        else:
            out.append(f"{rel}: mode {b.mode:o}, was {a.mode:o}")
        if len(out) >= limit:
            out.append("...")
            break
    return out
