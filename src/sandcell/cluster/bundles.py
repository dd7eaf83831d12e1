"""Host paths of a run that travel to another node as bytes: its inputs and package directories.

A request names inputs and package directories by paths of the replica's host. A node sees them
only when they are under the shared directory (``$SANDCELL_SHARED_DIR``, mounted at the same path
on every node); every other one is read here, without following links, and written again on the
node under a directory of that run, which goes when the run ends. The pipeline has already
refused an input holding a socket, FIFO or device (:mod:`sandcell.inputs`) and hashed it for the
record, so only files, directories and links are met here.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import ConfigError, InfraError

MAX_BUNDLE_BYTES = 512 * 1024 * 1024
"""Most bytes one run's paths may carry to another node: beyond it, put them in the shared
directory instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One entry under a bundled path: ``rel`` is ``""`` for the path itself."""

    rel: str
    kind: str
    """``file``, ``dir`` or ``link``."""
    data: bytes = b""
    """A file's content, or a link's target."""
    executable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PathBundle:
    """The contents of one host path of the replica."""

    path: str
    entries: tuple[Entry, ...]


def visible(path: Path, shared: Path | None) -> bool:
    """Whether every node sees ``path`` at the same place: it is under the shared directory."""
    if shared is None:
        return False
    try:
        return path.resolve().is_relative_to(shared.resolve())
    except OSError:
        return False


def pack(paths: Iterable[Path]) -> tuple[PathBundle, ...]:
    """The contents of ``paths``, walked without following links (ConfigError past the cap)."""
    total = 0
    bundles = []
    for path in dict.fromkeys(paths):
        entries: list[Entry] = []
        for entry in _walk(path, ""):
            total += len(entry.data)
            if total > MAX_BUNDLE_BYTES:
                raise ConfigError(
                    f"the inputs of this run are over {MAX_BUNDLE_BYTES >> 20} MiB, too much to "
                    "send to another node; put them under $SANDCELL_SHARED_DIR, which every node "
                    "mounts"
                )
            entries.append(entry)
        bundles.append(PathBundle(path=str(path), entries=tuple(entries)))
    return tuple(bundles)


def _walk(path: Path, rel: str) -> Iterable[Entry]:
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            yield Entry(rel=rel, kind="link", data=os.fsencode(os.readlink(path)))
        elif stat.S_ISDIR(st.st_mode):
            yield Entry(rel=rel, kind="dir")
            for child in sorted(os.listdir(path)):
                yield from _walk(path / child, f"{rel}/{child}" if rel else child)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
            yield Entry(rel=rel, kind="file", data=data, executable=bool(st.st_mode & 0o100))
        # Anything else was refused by the pipeline's input check before the run.
    except OSError as exc:
        raise ConfigError(f"input {str(path)!r} cannot be read: {exc.strerror}") from None


def staging_dir(home: Path, kind: str, ident: str) -> Path:
    """Where the bundles of run or session ``ident`` are written on a node: named by a hash of
    the id, which a replica chose (and a caller may have given)."""
    digest = hashlib.sha256(ident.encode()).hexdigest()[:32]
    return home / "cluster-inputs" / f"{kind}-{digest}"


def unpack(bundle: PathBundle, dest: Path) -> Path:
    """Write ``bundle`` at ``dest`` (which must not exist); returns ``dest``."""
    for entry in bundle.entries:
        parts = [p for p in entry.rel.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise InfraError(f"a bundled path of {bundle.path!r} names {entry.rel!r}")
        target = dest.joinpath(*parts)
        try:
            if entry.kind == "dir":
                target.mkdir(mode=0o755)
            elif entry.kind == "link":
                os.symlink(os.fsdecode(entry.data), target)
            else:
                fd = os.open(
                    target,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o755 if entry.executable else 0o644,
                )
                with os.fdopen(fd, "wb") as f:
                    f.write(entry.data)
        except OSError as exc:
            raise InfraError(
                f"cannot write the input {bundle.path!r} on this node at {target}: {exc.strerror}"
            ) from None
    return dest


__all__ = ["MAX_BUNDLE_BYTES", "Entry", "PathBundle", "pack", "staging_dir", "unpack", "visible"]
