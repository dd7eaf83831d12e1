"""What a run record keeps so that the run can be replayed exactly.

Every run record has these fields (:mod:`sandcell.audit.record`, ``record_version`` 2); one without
``record_version`` was written before them, and a replay of it says which of them it lacks
(:mod:`sandcell.replay.plan`).

- ``stdin_kept``: the program's stdin bytes are kept in the artifact store under their sha256
  (``stdin_sha256``, always recorded), so a replay feeds the same bytes; empty stdin is not stored.
- ``packages``: the wheel-cache packages mounted into the run, by name, version and the sha256 of
  the wheel (a replay refuses when the cache now holds something else under that name); a
  package directory from outside the cache is kept by path only.
- ``landlock``: the request's Landlock setting (True required, False off, None where available).
- ``declared``: the result the caller declared (JSON Schema, textual invariants, result file);
  a pydantic model or a callable invariant cannot be written down: its name is kept so a replay
  can say it does not check it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandcell.artifacts.store import ArtifactStore
from sandcell.packages.wheel_cache import WheelCache

RECORD_VERSION = 2
"""``record_version`` of records that hold everything a replay needs; absent before."""


def keep_stdin(store: ArtifactStore, data: bytes) -> bool:
    """Store ``data`` (a run's stdin) under its sha256; False when there is nothing to keep."""
    if not data:
        return False
    fd = os.memfd_create("sandcell-stdin", os.MFD_CLOEXEC)
    try:
        _write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        store.put_fd(fd, len(data))
    finally:
        os.close(fd)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def packages_record(paths: Sequence[Path], cache: WheelCache) -> list[dict[str, object]]:
    """The packages of a run as its record keeps them (see the module docstring)."""
    by_path = {p.path: p for p in cache.packages()} if paths else {}
    out: list[dict[str, object]] = []
    for path in paths:
        pkg = by_path.get(path)
        if pkg is None:
            out.append({"path": str(path), "name": None, "version": None, "sha256": None})
        else:
            out.append(
                {"path": str(path), "name": pkg.name, "version": pkg.version, "sha256": pkg.sha256}
            )
    return out


def declared_record(
    *,
    schema: Mapping[str, object] | None,
    model: object | None,
    invariants: Sequence[object],
    result_file: str | None,
) -> dict[str, object]:
    """The declared result as the record keeps it (see the module docstring)."""
    sources = [getattr(i, "source", None) for i in invariants]
    return {
        "schema": dict(schema) if schema else None,
        "invariants": [s for s in sources if isinstance(s, str)],
        "unrecorded_invariants": sum(1 for s in sources if not isinstance(s, str)),
        "result_file": result_file,
        "model": None if model is None else getattr(model, "__qualname__", repr(model)),
    }
