"""The cold sandbox's native pid 1 (``inside/_init.c``), built with the host's C compiler.

:func:`build` compiles it once per source and compiler into the user's cache (statically linked:
the sandbox's runtime need not have the dynamic loader), checks that it runs, and copies it
into the runs root, on the same filesystem as the run directories, whose control directories
then hard-link it (a link per run instead of a copy). It returns None, and the boot's own
Python supervisor stays in use, when there is no compiler, the build fails, or
``SANDCELL_NATIVE_INIT=0`` asks for the Python path.

Security limitations: the binary runs inside every cold sandbox as its pid 1, outside the
program's Landlock domain; it is built from sandcell's own source into directories only this
uid can write (the cache as :func:`neutral_bytecode.cache_dir` checks it, the private runs root),
and bound read-only there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from sandcell.backends import inside
from sandcell.backends.host import neutral_bytecode

__all__ = ["SOURCE", "STATUS_ENV", "build"]

SOURCE = Path(inside.__file__).resolve().parent / "_init.c"
STATUS_ENV = "SANDCELL_STATUS_FD"
"""The variable that gives the init the status descriptor (it removes it from the program's
environment); without it the init becomes its program (see ``_init.c``)."""
_FLAGS = ("-O2", "-static", "-Wall")
_NOT_STARTED = 125  # the init's exit status without a program to run

_lock = threading.Lock()
_built: dict[tuple[str, str], Path | None] = {}


def _key(source: bytes, compiler: str) -> str:
    h = hashlib.sha256(source)
    h.update(f"\0{os.path.realpath(compiler)}\0{' '.join(_FLAGS)}".encode())
    return h.hexdigest()[:20]


def _compile(source: Path, compiler: str, out_dir: Path, name: str) -> Path | None:
    """Compile into ``out_dir/name`` (aside, then renamed), check it runs; None if it cannot."""
    final = out_dir / name
    if final.is_file() and os.access(final, os.X_OK):
        return final
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".init-"))
    try:
        exe = tmp / "init"
        done = subprocess.run(
            [compiler, *_FLAGS, "-o", str(exe), str(source)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0 or not exe.is_file():
            return None
        # Without a program it must refuse with its own status: a binary that runs at all.
        probe = subprocess.run([str(exe)], capture_output=True, timeout=10, env={}, check=False)
        if probe.returncode != _NOT_STARTED or b"sandcell-init:" not in probe.stderr:
            return None
        exe.chmod(0o555)
        exe.rename(final)
        return final
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build(runs_root: Path, *, compiler: str | None = None) -> Path | None:
    """The init for runs under ``runs_root`` (a file in ``runs_root/etc``), built the first
    time; None when it cannot be, or ``SANDCELL_NATIVE_INIT=0``. ``compiler``: the C compiler
    (default ``$CC``, else ``cc`` on the PATH)."""
    if os.environ.get("SANDCELL_NATIVE_INIT", "1") == "0":
        return None
    cc = compiler or os.environ.get("CC") or "cc"
    found = shutil.which(cc)
    if found is None:
        return None
    try:
        source = SOURCE.read_bytes()
    except OSError:
        return None
    name = f"init-{_key(source, found)}"
    memo = (str(runs_root), name)
    with _lock:
        if memo in _built:
            cached = _built[memo]
            if cached is None or cached.is_file():
                return cached
        cache = neutral_bytecode.cache_dir(runs_root / "etc")
        built = _compile(SOURCE, found, cache, name)
        etc = runs_root / "etc"
        result: Path | None = None
        if built is not None:
            result = built if built.parent == etc else _place(built, etc)
        _built[memo] = result
        return result


def _place(built: Path, etc: Path) -> Path | None:
    """A copy of ``built`` in ``etc`` (the runs root's), where the run directories can link it."""
    final = etc / built.name
    if final.is_file():
        return final
    try:
        fd, tmp = tempfile.mkstemp(dir=etc, prefix=".init-")
        os.close(fd)
        shutil.copyfile(built, tmp)
        # Executable by the sandbox's user (another uid inside), writable by nobody.
        os.chmod(tmp, 0o555)  # noqa: S103
        os.replace(tmp, final)
    except OSError:
        return None
    return final
