"""Descriptor-level reads and writes for trees that untrusted code wrote or may have touched.

Paths are opened one component at a time relative to a directory descriptor, never through a
symbolic link (:data:`OPEN_DIR_FLAGS`), and content is streamed in bounded chunks. The export
walk, the artifact store and the copy out of it share these.
"""

from __future__ import annotations

import os

from sandcell.errors import InfraError
from sandcell.spec import MiB

__all__ = ["CHUNK", "OPEN_DIR_FLAGS", "write_all"]

CHUNK = 1 * MiB
"""Read and write size when streaming file content."""

OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Opening a directory, one component at a time: never through a symbolic link."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; a failure is the destination's, so an :class:`InfraError`."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        raise InfraError(f"cannot write: {exc}") from exc
