"""The runtime's neutral view as bubblewrap arguments, and the host files behind its synthetic ones.

:attr:`Runtime.mounts <sandcell.runtimes.Runtime.mounts>` are bound read-only at their sandbox
paths; :attr:`Runtime.files <sandcell.runtimes.Runtime.files>` (the neutral venv's ``pyvenv.cfg``,
empty files over editable-install hooks) are written once beside the synthetic ``/etc`` files
shared by all runs (``etc/runtime-<hash>`` under the runs root, which the sweep keeps), and bound
read-only after the mounts. Cold runs, sessions and the warm-start template all take their
arguments from :func:`bind_args`, so every start mode shows the sandbox the same runtime at the
same paths.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
from pathlib import Path

from sandcell.backends.host.neutral_sources import NeutralSources
from sandcell.runtimes import Runtime

__all__ = ["bind_args", "support_files"]

_lock = threading.Lock()
_written: dict[tuple[str, str], tuple[tuple[Path, str], ...]] = {}


def _key(runtime: Runtime) -> str:
    h = hashlib.sha256()
    for path, text in runtime.files:
        h.update(f"{len(path)}:{path}{len(text)}:{text}".encode())
    return h.hexdigest()[:24]


def support_files(root: Path, runtime: Runtime) -> tuple[tuple[Path, str], ...]:
    """(host file, sandbox path) for each of the runtime's synthetic files, written under
    ``root`` the first time (idempotent, safe between processes: written aside, then renamed)."""
    if not runtime.files:
        return ()
    key = _key(runtime)
    with _lock:
        cached = _written.get((str(root), key))
        # One stat per start: a runs root removed and made again (tests do) needs the files anew.
        if cached is not None and cached[0][0].parent.is_dir():
            return cached
        final = root / "etc" / f"runtime-{key}"
        names = [hashlib.sha256(text.encode()).hexdigest()[:16] for _, text in runtime.files]
        if not final.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".new-"))
            # Named by content: several covered files share one (the empty file).
            for name, text in dict(zip(names, (t for _, t in runtime.files), strict=True)).items():
                (tmp / name).write_text(text)
                (tmp / name).chmod(0o444)
            tmp.chmod(0o755)
            try:
                tmp.rename(final)
            except OSError:
                # Another supervisor wrote the same files first: theirs are identical.
                shutil.rmtree(tmp, ignore_errors=True)
        out = tuple(
            (final / name, path) for name, (path, _) in zip(names, runtime.files, strict=True)
        )
        _written[(str(root), key)] = out
        return out


def bind_args(
    runtime: Runtime,
    files: tuple[tuple[Path, str], ...],
    sources: NeutralSources | None = None,
) -> list[str]:
    """bwrap arguments for the runtime: its mounts, its synthetic ``files`` (from
    :func:`support_files`), then the top-level symlinks (pure). ``sources``: where each host
    path is bound from (``neutral_sources``)."""
    src = sources or NeutralSources()
    a: list[str] = []
    for host, dest in runtime.mounts:
        a += ["--ro-bind", src.of(host), dest]
    for host_file, dest in files:
        a += ["--ro-bind", src.of(host_file), dest]
    for link, target in runtime.symlinks:
        a += ["--symlink", target, link]
    return a
