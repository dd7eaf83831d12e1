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
  that are not UTF-8; or whoever runs ``rm *`` or ``tar czf x.tgz *`` in the export directory:
  ``-rf``, names with leading or trailing whitespace, names made only of dots;
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
* Every path component must be valid UTF-8 without control characters, must not start with
  ``-``, start or end with whitespace, or be made only of dots.
* A file over the per-file cap is refused from its size alone, never read (sparse files);
  reading stops at the cap even if the file grows. The number of files and the total size are
  capped too; which files are over a cap is deterministic (paths are walked in sorted order).
* Content is copied into an :class:`ArtifactStore` under its SHA-256, with mode ``0o644``: no
  permission bit of the original is carried over.

Every file that matched a glob but was refused is reported as a
:class:`~sandcell.spec.RejectedExport` with the reason, so the caller (often a model) can see
why a file it wrote did not come out.

The parts live in their own modules: :mod:`sandcell._globs` checks and matches the globs,
:mod:`sandcell._export_names` judges and prints names, :mod:`sandcell._artifact_store` is the
store; this module walks the workspace and applies the limits.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from sandcell._artifact_store import _OPEN_DIR_FLAGS, ArtifactStore, ArtifactTooLarge
from sandcell._export_names import _display, _media_type, _name_problem, _type_reason
from sandcell._globs import _Matcher, _State, validate_globs
from sandcell.errors import ConfigError, InfraError
from sandcell.spec import Artifact, RejectedExport

__all__ = [
    "ArtifactStore",
    "ArtifactTooLarge",
    "ExportLimits",
    "collect_exports",
    "validate_globs",
]

MiB = 1024 * 1024

# Opening a workspace file: never follow a final symlink, never block (a FIFO swapped in after
# the listing would otherwise hang the open), never let a terminal become our controlling tty.
_OPEN_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


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
