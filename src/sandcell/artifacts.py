"""Export of files from a finished sandbox, and the content-addressed store they land in.

The threat
----------
After a run, the sandbox's writable working directory (the *workspace*) is an ordinary host
directory, and everything in it was written by untrusted code. No sandbox process is alive any
more, but the code had the whole run to prepare the ground. A hostile workspace can contain:

* symbolic links, to host files (``out.png -> /etc/shadow``) or to host directories
  (``out -> /home/user``), hoping the exporter follows them and copies host data out;
* hard links to files outside the workspace (same trick, no symlink to spot), where the
  filesystem allows it;
* FIFOs, which block a reader forever; unix sockets; device nodes, whose mere ``open`` can have
  effects;
* huge files, including sparse ones that claim terabytes while using no disk, and files that
  grow while they are read;
* thousands of files, or deeply nested directories, to exhaust time, memory or descriptors;
* names built to confuse whoever reads them later: newlines, terminal escape sequences, bytes
  that are not UTF-8;
* setuid, setgid and executable bits, hoping they survive the trip to the host.

The rules
---------
Only what the caller asked for leaves, only as plain bytes, and only up to the limits:

* The caller's export globs are checked before the run (:func:`validate_globs`): relative, no
  ``..``, no control characters, no backslashes.
* The workspace is walked here, one directory descriptor at a time, never following a symbolic
  link, neither for directories nor for files. The walk is bounded in entries and depth.
* Only regular files are exported. Every file is opened with ``O_NOFOLLOW | O_NONBLOCK`` relative
  to its directory's descriptor and checked with ``fstat`` on the opened descriptor, so a file
  swapped after the listing is caught, and a FIFO never blocks. Non-regular entries are never
  opened at all.
* A file with more than one hard link is refused: it may be a host file linked in.
* Every path component must be valid UTF-8 without control characters.
* A file over the per-file cap is refused from its size alone, never read (sparse files);
  reading stops at the cap even if the file grows. The number of files and the total size are
  capped too; which files are over a cap is deterministic (paths are walked in sorted order).
* Content is copied into an :class:`ArtifactStore` under its SHA-256, with mode ``0o644``: no
  permission bit of the original is carried over.

Every file that matched a glob but was refused is reported as a
:class:`~sandcell.spec.RejectedExport` with the reason, so the caller (often a model) can see
why a file it wrote did not come out.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import mimetypes
import os
import re
import secrets
import stat
import tempfile
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath

from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.spec import Artifact, RejectedExport

__all__ = [
    "ArtifactStore",
    "ArtifactTooLarge",
    "ExportLimits",
    "collect_exports",
    "validate_globs",
]

MiB = 1024 * 1024

_CHUNK = 1 * MiB
"""Read and write size when streaming file content."""

_MAX_GLOBS = 256
_MAX_GLOB_CHARS = 4096
"""Bounds on the globs themselves: they are matched against every name in the workspace."""

_SHA256_RE = re.compile(r"[0-9a-f]{64}")

# Opening a workspace file: never follow a final symlink, never block (a FIFO swapped in after
# the listing would otherwise hang the open), never let a terminal become our controlling tty.
_OPEN_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# A compressed file's media type is the compression's, not the content's (``.tar.gz``).
_ENCODING_MEDIA_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}
_DEFAULT_MEDIA_TYPE = "application/octet-stream"


class ArtifactTooLarge(SandcellError):
    """More content could be read than the cap given to :meth:`ArtifactStore.put_fd`.

    Nothing is stored in that case.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportLimits:
    """Caps on what one run may export. Files beyond a cap are rejected, never truncated."""

    max_files: int = 100
    """Most files exported; further matching files are rejected, in sorted path order."""
    max_file_bytes: int = 64 * MiB
    """Largest single file exported; a larger one is rejected from its size, without reading it."""
    max_total_bytes: int = 256 * MiB
    """Most bytes exported over all files; a file that would go past it is rejected."""
    max_walk_entries: int = 100_000
    """Most directory entries looked at while searching the workspace; the walk stops there and
    a rejection says so. Bounds the time a workspace full of files can cost."""
    max_depth: int = 64
    """Deepest directory nesting searched; deeper directories are reported and skipped. Bounds
    the directory descriptors held open during the walk."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"export limit {f.name} must be an integer, got {value!r}")
            if value <= 0:
                raise ConfigError(f"export limit {f.name} must be positive, got {value!r}")


# --------------------------------------------------------------------------------------------
# Globs


def _is_control(ch: str) -> bool:
    """C0 controls, DEL and C1 controls (Unicode category Cc): newlines, escapes, CSI."""
    return unicodedata.category(ch) == "Cc"


def validate_globs(globs: Sequence[str]) -> tuple[str, ...]:
    """Check export globs before any run and return them normalised.

    A glob is a ``/``-separated path relative to the working directory. Within a component,
    ``*`` matches any run of characters (a leading dot included), ``?`` one character and
    ``[...]`` a set; a component that is exactly ``**`` matches any number of directories,
    none included. ``./`` components are dropped; duplicates are removed, order kept.

    Raises:
        ConfigError: for a glob that is empty, absolute, contains a ``..`` component, an empty
            component (``a//b``, a trailing ``/``), a NUL or control character, or a backslash.
    """
    if isinstance(globs, str):
        # A bare string is a sequence of one-character globs: surely a mistake.
        raise ConfigError(f"export globs must be a list of strings, got the string {globs!r}")
    if len(globs) > _MAX_GLOBS:
        raise ConfigError(f"{len(globs)} export globs given; at most {_MAX_GLOBS} are allowed")
    out: list[str] = []
    for glob in globs:
        if not isinstance(glob, str):
            raise ConfigError(f"export glob {glob!r} is not a string")
        if not glob:
            raise ConfigError("an export glob is empty; use a pattern such as 'out/*.png'")
        if len(glob) > _MAX_GLOB_CHARS:
            raise ConfigError(
                f"export glob of {len(glob)} characters is too long (at most {_MAX_GLOB_CHARS})"
            )
        if "\x00" in glob or any(_is_control(ch) for ch in glob):
            raise ConfigError(
                f"export glob {glob!r} contains a NUL or control character; remove it"
            )
        if "\\" in glob:
            raise ConfigError(
                f"export glob {glob!r} contains a backslash; separate directories with '/' "
                "(escaping wildcards is not supported, use '[*]' to match a literal '*')"
            )
        if glob.startswith("/"):
            raise ConfigError(
                f"export glob {glob!r} is absolute; globs are relative to the working "
                f"directory, e.g. {glob.lstrip('/') or 'out/*.png'!r}"
            )
        parts = glob.split("/")
        if ".." in parts:
            raise ConfigError(
                f"export glob {glob!r} has a '..' component; only files inside the working "
                "directory can be exported"
            )
        if parts[-1] == "":
            raise ConfigError(
                f"export glob {glob!r} ends with '/'; directories are not exported, use "
                f"{glob + '**'!r} to export every file under it"
            )
        if "" in parts:
            raise ConfigError(f"export glob {glob!r} has an empty component ('//'); remove it")
        kept = [p for p in parts if p != "."]
        if not kept:
            raise ConfigError(
                f"export glob {glob!r} names the working directory itself; use '**' to "
                "export every file in it"
            )
        normalised = "/".join(kept)
        if normalised not in out:
            out.append(normalised)
    return tuple(out)


_State = tuple[int, int]
"""(glob index, number of components of that glob matched so far)."""


class _Matcher:
    """Matches relative paths, one component at a time, against several globs at once.

    A small NFA: the state after a path prefix is the set of (glob, position) pairs still
    alive. This lets the walk prune a directory as soon as no glob can match below it, and a
    ``**`` never makes ``*`` cross a ``/`` (which ``fnmatch`` on whole paths would).
    """

    def __init__(self, globs: Sequence[str]) -> None:
        self._globs: tuple[tuple[re.Pattern[str] | None, ...], ...] = tuple(
            tuple(
                None if part == "**" else re.compile(fnmatch.translate(part))
                for part in glob.split("/")
            )
            for glob in globs
        )

    def _closure(self, states: set[_State]) -> frozenset[_State]:
        # A '**' may match zero directories: a state before one is also a state after it.
        closed: set[_State] = set()
        for g, start in states:
            segs = self._globs[g]
            i = start
            closed.add((g, i))
            while i < len(segs) and segs[i] is None:
                i += 1
                closed.add((g, i))
        return frozenset(closed)

    def start(self) -> frozenset[_State]:
        """The states before any component."""
        return self._closure({(g, 0) for g in range(len(self._globs))})

    def step(self, states: frozenset[_State], name: str) -> tuple[frozenset[_State], bool]:
        """States after one more component ``name``, and whether a non-``**`` component matched.

        The second value tells an entry some glob names specifically (``out`` in ``out/*.png``)
        from one only a ``**`` passes over.
        """
        nxt: set[_State] = set()
        progress = False
        for g, i in states:
            segs = self._globs[g]
            if i >= len(segs):
                continue
            pattern = segs[i]
            if pattern is None:
                nxt.add((g, i))
            elif pattern.match(name):
                nxt.add((g, i + 1))
                progress = True
        return self._closure(nxt), progress

    def full(self, states: frozenset[_State]) -> bool:
        """Whether the path so far is matched by some glob."""
        return any(i == len(self._globs[g]) for g, i in states)

    def names_directory(self, states: frozenset[_State]) -> bool:
        """Whether some glob matches this path other than through a trailing ``**``.

        ``out/**`` matches the directory ``out`` itself (``**`` matches zero directories), but
        it asks for the files under it; a directory is only worth a rejection when a glob
        really names it (``out``, ``*.d``).
        """
        return any(i == len(self._globs[g]) and self._globs[g][-1] is not None for g, i in states)

    def can_descend(self, states: frozenset[_State]) -> bool:
        """Whether some glob could match a path below this one."""
        return any(i < len(self._globs[g]) for g, i in states)


# --------------------------------------------------------------------------------------------
# Names


def _name_problem(raw: bytes) -> str | None:
    """Why a path component cannot be exported, or None if it can."""
    if raw in (b".", b".."):
        return "is '.' or '..'"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "is not valid UTF-8"
    if any(_is_control(ch) for ch in text):
        return "contains a control character"
    return None


def _display(raw: bytes) -> str:
    """A component made safe to print: invalid bytes and control characters as ``\\xNN``."""
    text = raw.decode("utf-8", "backslashreplace")
    # Every Cc character is below U+0100, so two hex digits always suffice.
    return "".join(f"\\x{ord(ch):02x}" if _is_control(ch) else ch for ch in text)


def _media_type(name: str) -> str:
    """Media type from the extension only.

    Only the suffixes are given to ``mimetypes``, behind a fixed stem: it reads a path starting
    with ``data:`` as a data URL and would take the media type from the name itself.
    """
    suffixes = "".join(PurePosixPath(name).suffixes)
    media_type, encoding = mimetypes.guess_type("file" + suffixes, strict=False)
    if encoding is not None:
        return _ENCODING_MEDIA_TYPES.get(encoding, _DEFAULT_MEDIA_TYPE)
    return media_type or _DEFAULT_MEDIA_TYPE


def _type_reason(mode: int) -> str:
    """Why a non-regular file is refused, from its ``st_mode``."""
    if stat.S_ISLNK(mode):
        return "symbolic link: not exported (links are never followed)"
    if stat.S_ISDIR(mode):
        return "directory: not exported"
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO): not exported"
    if stat.S_ISSOCK(mode):
        return "socket: not exported"
    if stat.S_ISCHR(mode):
        return "character device: not exported"
    if stat.S_ISBLK(mode):
        return "block device: not exported"
    return f"not a regular file (mode {mode:#o}): not exported"


# --------------------------------------------------------------------------------------------
# The store


class ArtifactStore:
    """Content-addressed file store on the host: each content is kept once, under its SHA-256.

    Layout: ``root/ab/cdef...`` (the first two hex digits as a directory), files mode ``0o644``.
    Content in flight is written to ``root/.incoming`` and renamed into place, so a stored path
    is either absent or complete.
    """

    def __init__(self, root: Path) -> None:
        self._root = Path(root)
        self._incoming = self._root / ".incoming"
        try:
            self._incoming.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"artifact store {str(self._root)!r} cannot be created: {exc.strerror}; "
                "choose a writable directory"
            ) from exc

    @property
    def root(self) -> Path:
        """The store directory."""
        return self._root

    def path_for(self, sha256: str) -> Path:
        """Where the content with this digest is (or would be) stored.

        Raises:
            ConfigError: if ``sha256`` is not 64 lower-case hex digits.
        """
        if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
            raise ConfigError(
                f"{sha256!r} is not a SHA-256 digest; expected 64 lower-case hex digits"
            )
        return self._root / sha256[:2] / sha256[2:]

    def has(self, sha256: str) -> bool:
        """Whether content with this digest is stored."""
        return self.path_for(sha256).is_file()

    def put_fd(self, fd: int, max_bytes: int) -> tuple[str, int]:
        """Store what can be read from ``fd`` (from its current offset to end of file).

        The content is streamed into a temporary file and hashed on the way, so it is read
        once and never held in memory; at most ``max_bytes + 1`` bytes are read whatever the
        file claims its size is. The temporary file is then renamed to its content address; if
        that content is already stored, it is just dropped.

        Returns:
            The hex SHA-256 and the size in bytes.

        Raises:
            ArtifactTooLarge: if more than ``max_bytes`` bytes could be read; nothing is stored.
            OSError: if reading ``fd`` fails; nothing is stored.
            InfraError: if the store itself cannot be written.
        """
        if max_bytes < 0:
            raise ConfigError(f"max_bytes must not be negative, got {max_bytes}")
        try:
            tmp_fd, tmp_name = tempfile.mkstemp(dir=self._incoming, prefix="put-")
        except OSError as exc:
            raise InfraError(f"artifact store cannot create a file: {exc}") from exc
        tmp_path = Path(tmp_name)
        try:
            try:
                sha, size = _stream(fd, tmp_fd, max_bytes)
            finally:
                os.close(tmp_fd)
            final = self.path_for(sha)
            try:
                if final.exists():
                    tmp_path.unlink()
                else:
                    final.parent.mkdir(exist_ok=True)
                    # Atomic: a concurrent put of the same content renames identical bytes.
                    tmp_path.replace(final)
            except OSError as exc:
                raise InfraError(f"artifact store cannot be written: {exc}") from exc
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise
        return sha, size

    def copy_out(self, artifacts: Sequence[Artifact], dest: Path) -> list[Path]:
        """Copy artifacts to ``dest/<artifact.path>``, creating directories as needed.

        ``dest`` itself is created if missing (and may be a symbolic link the caller made);
        below it nothing is followed: a symbolic link in the way, as a directory or as the file
        itself, is refused, so nothing is written outside ``dest``. An existing regular file is
        replaced by rename, never written into (it may be a hard link). Files are mode
        ``0o644``.

        Returns:
            The paths written, in the order of ``artifacts``.

        Raises:
            ConfigError: for an artifact path that is absolute, has ``..``, ``.`` or empty
                components or control characters; for a symbolic link or non-directory in the
                way; for content missing from the store.
        """
        dest = Path(dest)
        plans = [(art, _split_artifact_path(art.path)) for art in artifacts]
        try:
            dest.mkdir(parents=True, exist_ok=True)
            root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(
                f"cannot copy artifacts to {str(dest)!r}: {exc.strerror}; pass a writable directory"
            ) from exc
        written: list[Path] = []
        try:
            for art, parts in plans:
                source = self.path_for(art.sha256)
                try:
                    src_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError as exc:
                    raise ConfigError(
                        f"artifact {art.path!r} ({art.sha256}) is not in the store at "
                        f"{str(self._root)!r}"
                    ) from exc
                try:
                    _copy_into(src_fd, root_fd, parts, art.path, dest)
                finally:
                    os.close(src_fd)
                written.append(dest.joinpath(*parts))
        finally:
            os.close(root_fd)
        return written


def _stream(src_fd: int, out_fd: int, max_bytes: int) -> tuple[str, int]:
    """Copy ``src_fd`` to ``out_fd`` hashing it, reading at most ``max_bytes + 1`` bytes.

    A failed read raises the ``OSError`` as is (the source's fault); a failed write or sync
    raises :class:`InfraError` (the store's fault).
    """
    digest = hashlib.sha256()
    size = 0
    while True:
        # One byte more than allowed tells "exactly at the cap" from "over it".
        chunk = os.read(src_fd, min(_CHUNK, max_bytes + 1 - size))
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise ArtifactTooLarge(f"content exceeds {max_bytes} bytes")
        digest.update(chunk)
        _write_all(out_fd, chunk)
    try:
        # No permission bit of the source survives: every stored file is 0o644.
        os.fchmod(out_fd, 0o644)
        os.fsync(out_fd)
    except OSError as exc:
        raise InfraError(f"artifact store cannot be written: {exc}") from exc
    return digest.hexdigest(), size


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; a failure is the destination's, so an :class:`InfraError`."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        raise InfraError(f"cannot write: {exc}") from exc


def _split_artifact_path(path: str) -> list[str]:
    """The components of an artifact path, refusing anything that could leave the destination."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"artifact path {path!r} is empty or not a string")
    if path.startswith("/"):
        raise ConfigError(f"artifact path {path!r} is absolute; refusing to copy it")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ConfigError(
                f"artifact path {path!r} has an empty, '.' or '..' component; refusing to copy it"
            )
        if "\x00" in part or any(_is_control(ch) for ch in part):
            raise ConfigError(f"artifact path {path!r} has a control character; refusing it")
    return parts


def _copy_into(src_fd: int, root_fd: int, parts: list[str], shown: str, dest: Path) -> None:
    """Write the content of ``src_fd`` to ``parts`` below the directory ``root_fd``."""
    dir_fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=dir_fd)
            try:
                child = os.open(part, _OPEN_DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                where = "/".join(parts[: i + 1])
                raise ConfigError(
                    f"cannot copy artifact {shown!r}: {str(dest / where)!r} is a symbolic link "
                    f"or not a directory ({exc.strerror}); refusing to write through it"
                ) from exc
            os.close(dir_fd)
            dir_fd = child
        name = parts[-1]
        try:
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(existing.st_mode):
                raise ConfigError(
                    f"cannot copy artifact {shown!r}: {str(dest / shown)!r} exists and is not a "
                    f"regular file ({_type_reason(existing.st_mode).split(':')[0]}); remove it"
                )
        # Write a new file and rename it over the name: never write into an existing inode.
        tmp = f".sandcell-{secrets.token_hex(8)}.tmp"
        out_fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dir_fd,
        )
        try:
            try:
                os.fchmod(out_fd, 0o644)  # the umask may have taken bits away
                while chunk := os.read(src_fd, _CHUNK):
                    _write_all(out_fd, chunk)
            finally:
                os.close(out_fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------------------------
# The walk


@dataclass(slots=True)
class _Collector:
    """State of one export: what was kept, what was refused, how far the walk went."""

    store: ArtifactStore
    limits: ExportLimits
    matcher: _Matcher
    artifacts: list[Artifact] = field(default_factory=list)
    rejected: list[RejectedExport] = field(default_factory=list)
    total_bytes: int = 0
    visited: int = 0
    stopped_at: str | None = None

    def reject(self, path: str, reason: str) -> None:
        self.rejected.append(RejectedExport(path=path, reason=reason))

    def walk(
        self,
        dir_fd: int,
        shown: tuple[str, ...],
        bad: str | None,
        states: frozenset[_State],
        depth: int,
    ) -> None:
        """Export what matches below the open directory ``dir_fd``.

        ``shown`` is the directory's path with components made printable; ``bad`` says why a
        component of it cannot be exported, if one cannot.
        """
        if self.stopped_at is not None:
            return
        entries: list[os.DirEntry[str]] = []
        with os.scandir(dir_fd) as it:
            for entry in it:
                self.visited += 1
                if self.visited > self.limits.max_walk_entries:
                    self.stopped_at = "/".join(shown) or "."
                    break
                entries.append(entry)
        # Sorted by the raw bytes of the name: the same workspace always gives the same
        # artifacts and the same files over the caps.
        entries.sort(key=lambda e: os.fsencode(e.name))
        for entry in entries:
            self._visit(
                dir_fd,
                entry,
                parent_shown=shown,
                parent_bad=bad,
                parent_states=states,
                depth=depth,
            )

    def _visit(
        self,
        dir_fd: int,
        entry: os.DirEntry[str],
        *,
        parent_shown: tuple[str, ...],
        parent_bad: str | None,
        parent_states: frozenset[_State],
        depth: int,
    ) -> None:
        name = entry.name
        states, progress = self.matcher.step(parent_states, name)
        full = self.matcher.full(states)
        below = self.matcher.can_descend(states)
        if not full and not below:
            return  # no glob can match this entry or anything under it
        raw = os.fsencode(name)  # the exact bytes on disk (surrogateescape round-trips)
        shown = (*parent_shown, _display(raw))
        path = "/".join(shown)
        bad = parent_bad
        if bad is None:
            problem = _name_problem(raw)
            if problem is not None:
                bad = f"name component {_display(raw)!r} {problem}: not exported"
        try:
            # d_type from the listing where the filesystem gives it; lstat otherwise.
            is_dir = entry.is_dir(follow_symlinks=False)
            is_symlink = entry.is_symlink()
        except OSError as exc:
            if full:
                self.reject(path, f"could not be examined ({exc.strerror}): not exported")
            return

        if is_dir:
            if self.matcher.names_directory(states):
                self.reject(
                    path,
                    f"directory: not exported; to export the files in it use {path + '/**'!r}",
                )
            if below:
                self._descend(dir_fd, name, shown=shown, bad=bad, states=states, depth=depth + 1)
            return

        if is_symlink and not full:
            # A link some glob names specifically (``out`` in ``out/*.png``) is worth telling
            # about: the caller probably expected files through it. One that only a ``**``
            # passes over is not (a virtualenv is full of those).
            if progress and below:
                self.reject(path, "symbolic link: not followed, so nothing under it is exported")
            return
        if not full:
            return
        if bad is not None:
            self.reject(path, bad)
            return
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError as exc:
            self.reject(path, f"could not be examined ({exc.strerror}): not exported")
            return
        if not stat.S_ISREG(mode):
            # Never opened: opening a device can have effects, and a FIFO could block.
            self.reject(path, _type_reason(mode))
            return
        self._export(dir_fd, name, path)

    def _descend(
        self,
        dir_fd: int,
        name: str,
        *,
        shown: tuple[str, ...],
        bad: str | None,
        states: frozenset[_State],
        depth: int,
    ) -> None:
        path = "/".join(shown)
        if depth > self.limits.max_depth:
            self.reject(
                path,
                f"directory nested deeper than {self.limits.max_depth} levels: not searched",
            )
            return
        try:
            # O_NOFOLLOW: if the directory was swapped for a link since the listing, ELOOP.
            child = os.open(name, _OPEN_DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.reject(path, f"directory could not be opened ({exc.strerror}): not searched")
            return
        try:
            self.walk(child, shown, bad, states, depth)
        except OSError as exc:
            self.reject(path, f"directory could not be listed ({exc.strerror}): not searched")
        finally:
            os.close(child)

    def _export(self, dir_fd: int, name: str, path: str) -> None:
        limits = self.limits
        if len(self.artifacts) >= limits.max_files:
            self.reject(
                path,
                f"over the file count cap: {limits.max_files} files already exported (max_files)",
            )
            return
        try:
            fd = os.open(name, _OPEN_FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.reject(path, f"could not be opened ({exc.strerror}): not exported")
            return
        try:
            # Trust only the opened descriptor: the listing may be stale.
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.reject(path, _type_reason(st.st_mode))
                return
            if st.st_nlink > 1:
                self.reject(
                    path,
                    f"hard link ({st.st_nlink} names for one file): not exported, it may be a "
                    "file from outside the working directory",
                )
                return
            if st.st_size > limits.max_file_bytes:
                self.reject(
                    path,
                    f"file is {st.st_size} bytes, over the per-file cap of "
                    f"{limits.max_file_bytes} bytes (max_file_bytes)",
                )
                return
            budget = limits.max_total_bytes - self.total_bytes
            if st.st_size > budget:
                self.reject(path, self._total_reason(st.st_size))
                return
            try:
                sha, size = self.store.put_fd(fd, min(limits.max_file_bytes, budget))
            except ArtifactTooLarge:
                self.reject(
                    path,
                    "file grew past the size cap while it was read (max_file_bytes or "
                    "max_total_bytes): not exported",
                )
                return
            except OSError as exc:
                self.reject(path, f"could not be read ({exc.strerror}): not exported")
                return
        finally:
            os.close(fd)
        self.total_bytes += size
        self.artifacts.append(
            Artifact(path=path, sha256=sha, size=size, media_type=_media_type(name))
        )

    def _total_reason(self, size: int) -> str:
        return (
            f"over the total size cap: {self.total_bytes} bytes already exported, this file "
            f"has {size}, the cap is {self.limits.max_total_bytes} bytes (max_total_bytes)"
        )


def collect_exports(
    workspace: Path,
    globs: Sequence[str],
    store: ArtifactStore,
    limits: ExportLimits,
) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
    """Copy the workspace files matching ``globs`` into ``store``, following the module's rules.

    Call it only once nothing of the run is alive any more. Paths are relative POSIX paths
    from the workspace; artifacts come in sorted path order (byte order of each component).
    A rejected path whose name has invalid UTF-8 or control characters is shown with those
    bytes as ``\\xNN``.

    Returns:
        The artifacts stored, and the matching entries refused, each with its reason.

    Raises:
        ConfigError: for invalid globs (see :func:`validate_globs`).
        InfraError: if the workspace cannot be opened or the store cannot be written.
    """
    patterns = validate_globs(globs)
    if not patterns:
        return (), ()
    matcher = _Matcher(patterns)
    collector = _Collector(store=store, limits=limits, matcher=matcher)
    try:
        # The workspace path itself is sandcell's own, chosen on the host: following links in
        # it is fine. Everything below is the untrusted part.
        root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise InfraError(f"workspace {str(workspace)!r} cannot be opened: {exc}") from exc
    try:
        collector.walk(root_fd, (), None, matcher.start(), 0)
    except OSError as exc:
        raise InfraError(f"workspace {str(workspace)!r} cannot be listed: {exc}") from exc
    finally:
        os.close(root_fd)
    if collector.stopped_at is not None:
        collector.reject(
            collector.stopped_at,
            f"the working directory has more than {limits.max_walk_entries} entries; the "
            "search stopped here and later files were not examined (max_walk_entries)",
        )
    return tuple(collector.artifacts), tuple(collector.rejected)
