"""The export walk: the workspace searched one directory descriptor at a time, and each
matching file checked and copied into the store (:class:`_Collector`).

:mod:`sandcell.artifacts` states the rules this applies and is the way in
(:func:`~sandcell.artifacts.collect_exports`); :mod:`sandcell.artifacts.globs` says which names
match and where the walk may prune, :mod:`sandcell.artifacts.export_names` which names may leave and
how they are shown, and :class:`~sandcell.artifacts.ArtifactStore` keeps the content."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandcell.artifacts.export_names import _display, _media_type, _name_problem, _type_reason
from sandcell.artifacts.fd_io import OPEN_DIR_FLAGS
from sandcell.artifacts.globs import _Matcher, _State
from sandcell.artifacts.store import ArtifactStore, ArtifactTooLarge
from sandcell.spec import Artifact, RejectedExport

if TYPE_CHECKING:
    # Only a type here: the limits live with the rules, in the module that imports this one.
    from sandcell.artifacts import ExportLimits

# Opening a workspace file: never follow a final symlink, never block (a FIFO swapped in after
# the listing would otherwise hang the open), never let a terminal become our controlling tty.
_OPEN_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


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
            child = os.open(name, OPEN_DIR_FLAGS, dir_fd=dir_fd)
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
