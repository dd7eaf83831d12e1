"""Bytecode of a runtime directory with neutral source paths, as an overlay layer above it.

Python records the source path a module was compiled from in its bytecode (``co_filename`` of
every code object in ``__pycache__/*.pyc``). The interpreter replaces it with the path it really
loaded from when it imports the module, but the files stay readable: a program that unmarshals
``numpy/__pycache__/__init__.cpython-311.pyc`` from a venv compiled on the host learns
``/home/alice/proj/.venv/...``. The host's venv is not ours to rewrite.

:func:`tree_for` builds, once per runtime directory and state, a tree that mirrors its
``__pycache__`` directories with each ``.pyc`` rewritten: same header (so it stays valid for the
same source), code objects naming the source at its sandbox path. ``neutral_sources`` stacks the
tree above the host directory in the overlay it mounts, so the sandbox reads these files instead.
Each mirrored ``__pycache__`` is marked opaque (``user.overlay.opaque``): a ``.pyc`` the tree does
not hold (written on the host after the tree was built, or of another Python) is absent in the
sandbox, where the interpreter compiles the source instead.

The tree lives in the user's cache (``$XDG_CACHE_HOME/sandcell/bytecode``, by default
``~/.cache/sandcell/bytecode``, private to the uid), so every runs directory and data directory of
the user shares it; where there is no usable cache directory, beside the runs root's shared
synthetic ``/etc`` files (kept by the sweep). It is named ``.bytecode-<key>``; the key
covers the directory, its sandbox path, the interpreter's magic number and the names and times of
the directory's entries (an install or removal changes them), so a changed runtime gets a new
tree. It is written aside and renamed into place, so concurrent supervisors agree.

Security limitations: bytecode outside ``__pycache__`` (sourceless ``.pyc`` beside a module) is
not rewritten. On a filesystem without user extended attributes the ``__pycache__`` directories
cannot be marked opaque: a ``.pyc`` written on the host after the tree was built shows through.
The first run after a change waits for the tree (seconds for a large venv: about 6 s for 10,000
files here).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import shutil
import tempfile
import threading
import types
from pathlib import Path

__all__ = ["cache_dir", "rewrite", "tree_for"]

_PREFIX = ".bytecode-"
_OPAQUE = "user.overlay.opaque"
_lock = threading.Lock()
_trees: dict[tuple[str, str, str], str | None] = {}


def _fingerprint(source: str) -> str:
    h = hashlib.sha256()
    with os.scandir(source) as it:
        for entry in sorted(it, key=lambda e: e.name):
            with contextlib.suppress(OSError):
                h.update(
                    f"{entry.name}\0{entry.stat(follow_symlinks=False).st_mtime_ns}\0".encode()
                )
    return h.hexdigest()


def _key(source: str, sandbox: str) -> str:
    h = hashlib.sha256()
    h.update(f"{source}\0{sandbox}\0".encode() + importlib.util.MAGIC_NUMBER)
    h.update(_fingerprint(source).encode())
    return h.hexdigest()[:24]


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(
        _renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def rewrite(data: bytes, filename: str) -> bytes | None:
    """A ``.pyc``'s bytes with every code object naming ``filename``; None if it is not this
    interpreter's bytecode (another version's, or damaged)."""
    if data[:4] != importlib.util.MAGIC_NUMBER or len(data) < 16:
        return None
    try:
        # The runtime's own bytecode: what this interpreter imports anyway.
        code = marshal.loads(memoryview(data)[16:])  # noqa: S302
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(code, types.CodeType):
        return None
    return data[:16] + marshal.dumps(_renamed(code, filename))


def _source_name(pyc: str) -> str:
    """``mod.cpython-311.opt-1.pyc`` -> ``mod.py``."""
    return pyc.split(".", 1)[0] + ".py"


def build(source: str, sandbox: str, dest: Path) -> None:
    """Write the neutral bytecode tree of ``source`` (seen at ``sandbox``) into ``dest``."""
    for dirpath, dirs, files in os.walk(source):
        dirs.sort()
        if os.path.basename(dirpath) != "__pycache__":
            continue
        rel = os.path.relpath(dirpath, source)
        out = dest / rel
        out.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.setxattr(out, _OPAQUE, b"y")
        pkg = os.path.dirname(rel)
        for name in files:
            if not name.endswith(".pyc"):
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            filename = os.path.normpath(os.path.join(sandbox, pkg, _source_name(name)))
            new = rewrite(data, filename)
            if new is not None:
                (out / name).write_bytes(new)
    dest.chmod(0o755)


def _retire_others(final: Path, owner: str) -> None:
    """Record whose tree ``final`` is (beside it: inside, it would show in the sandbox) and
    remove the trees a changed or removed runtime left behind: older trees of the same
    directory, and trees of directories that are gone. A tree still stacked in a live overlay
    stays readable there until that overlay is unmounted."""
    label = final.with_name(final.name + ".source")
    label.write_text(owner)
    for other in final.parent.glob(f"{_PREFIX}*.source"):
        if other == label:
            continue
        with contextlib.suppress(OSError):
            text = other.read_text()
            if text == owner or not os.path.isdir(text.partition("\0")[0]):
                shutil.rmtree(other.with_suffix(""), ignore_errors=True)
                other.unlink()


def cache_dir(fallback: Path) -> Path:
    """The user's bytecode cache, made private to this uid if new; ``fallback`` when there is
    none that only this uid can write (no home, a shared or foreign directory)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return fallback
    home = Path(base) if os.path.isdir(base) else Path(base).parent
    d = Path(base) / "sandcell" / "bytecode"
    try:
        # Not in another user's home (root started with that user's HOME, say).
        if home.stat().st_uid != os.geteuid():
            return fallback
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
    except OSError:
        return fallback
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return fallback
    return d


def tree_for(source: str, sandbox: str, cache_root: Path) -> str | None:
    """The neutral bytecode tree of host directory ``source`` (bound at ``sandbox``), built
    under ``cache_root`` the first time; None when ``source`` holds no bytecode or the tree
    cannot be written (then the overlay has no bytecode layer, see the module)."""
    mem_key = (str(cache_root), source, sandbox)
    with _lock:
        if mem_key in _trees:
            found = _trees[mem_key]
            if found is None or os.path.isdir(found):
                return found
        try:
            final = cache_root / f"{_PREFIX}{_key(source, sandbox)}"
            if not final.is_dir():
                tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=f"{_PREFIX}new-"))
                try:
                    build(source, sandbox, tmp)
                    tmp.rename(final)
                except OSError:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if not final.is_dir():
                        raise
                _retire_others(final, f"{source}\0{sandbox}")
            result: str | None = str(final) if any(final.iterdir()) else None
        except OSError:
            result = None
        _trees[mem_key] = result
        return result
