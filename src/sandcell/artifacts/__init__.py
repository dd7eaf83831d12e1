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

The parts live in their own modules: :mod:`sandcell.artifacts.globs` checks and matches the globs,
:mod:`sandcell.artifacts.export_names` judges and prints names,
:mod:`sandcell.artifacts.export_walk` walks the workspace and applies the limits to each file,
:mod:`sandcell.artifacts.store` is the store and :mod:`sandcell.artifacts.copy` the copy out of it;
this module holds the limits and starts an export."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from sandcell.artifacts.export_walk import _Collector
from sandcell.artifacts.globs import _Matcher, validate_globs
from sandcell.artifacts.store import ArtifactStore, ArtifactTooLarge
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
