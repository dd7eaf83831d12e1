"""The content-addressed store exported files land in (:class:`ArtifactStore`).

The threat: what is stored was read from files untrusted code wrote. Content is streamed and
hashed, never held in memory, and reading stops one byte past the cap whatever size the file
claims (:class:`ArtifactTooLarge`); no permission bit of the original survives (every stored file
is ``0o644``); a stored path is either absent or complete. The copy of artifacts out of the store
into a directory the caller chooses is :mod:`sandcell.artifacts.copy`.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandcell.artifacts.copy import copy_out
from sandcell.artifacts.fd_io import CHUNK, write_all
from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.spec import Artifact

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class ArtifactTooLarge(SandcellError):
    """More content could be read than the cap given to :meth:`ArtifactStore.put_fd`.

    Nothing is stored in that case.
    """


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

    def put_arrived(self, blobs: Mapping[str, bytes], *, what: str, fix: str = "") -> None:
        """Store content that came from elsewhere (a node of a cluster) keyed by the SHA-256
        its sender gave: each one is checked against its key before it is kept. ``what``
        names whose it is in the InfraError of a damaged one, ``fix`` is added to it."""
        for sha, data in blobs.items():
            if hashlib.sha256(data).hexdigest() != sha:
                raise InfraError(
                    f"artifact {sha} of {what} arrived damaged from its node (its content "
                    f"does not match its SHA-256){fix}"
                )
            if self.has(sha):
                continue
            fd = os.memfd_create("sandcell-artifact", os.MFD_CLOEXEC)
            try:
                write_all(fd, data)
                os.lseek(fd, 0, os.SEEK_SET)
                stored, _ = self.put_fd(fd, len(data))
            finally:
                os.close(fd)
            if stored != sha:
                raise InfraError(f"artifact {sha} was stored as {stored}; {self._root} is damaged")

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
        return copy_out(artifacts, dest, path_for=self.path_for, store_root=self._root)


def _stream(src_fd: int, out_fd: int, max_bytes: int) -> tuple[str, int]:
    """Copy ``src_fd`` to ``out_fd`` hashing it, reading at most ``max_bytes + 1`` bytes.

    A failed read raises the ``OSError`` as is (the source's fault); a failed write or sync
    raises :class:`InfraError` (the store's fault).
    """
    digest = hashlib.sha256()
    size = 0
    while True:
        # One byte more than allowed tells "exactly at the cap" from "over it".
        chunk = os.read(src_fd, min(CHUNK, max_bytes + 1 - size))
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise ArtifactTooLarge(f"content exceeds {max_bytes} bytes")
        digest.update(chunk)
        write_all(out_fd, chunk)
    try:
        # No permission bit of the source survives: every stored file is 0o644.
        os.fchmod(out_fd, 0o644)
        os.fsync(out_fd)
    except OSError as exc:
        raise InfraError(f"artifact store cannot be written: {exc}") from exc
    return digest.hexdigest(), size
