"""Where the Python runtime appears inside a sandbox: fixed neutral paths, whatever the host's.

A runtime installed under a home or project directory (pyenv, uv, conda, a venv in a checkout)
would show that directory's path components to the program if it were mounted at its host path.
:func:`neutral_view` maps the host layout onto a fixed one, as pure data:

* ``/usr`` (and the merged-``/usr`` top-level directories, ``/etc/fonts``) stay where they are:
  they name nothing of the host's users;
* a base interpreter prefix outside ``/usr`` is bound at ``/opt/sandcell/python``; CPython finds
  its prefix from its executable's location, and a shared ``libpython`` (whose RUNPATH names the
  host prefix) is found through ``LD_LIBRARY_PATH``;
* a virtual environment becomes ``/opt/sandcell/venv``: a synthetic ``pyvenv.cfg`` whose ``home``
  is the neutral base, the base interpreter bound as ``bin/python``, and each site-packages
  directory bound at its place relative to the venv. Nothing else of the venv is bound: its
  console scripts and ``activate`` files name the host path;
* files that only point back into the host (an editable install's ``.pth`` hook and finder) are
  covered by empty files: the path they name is not mounted, and their text would name it;
* the install records that name a host path (a local install's ``direct_url.json``, a
  ``RECORD`` listing absolute paths outside the runtime) are covered by empty files too.

Where the view's host sources are bound from (overlays, so that ``/proc/self/mountinfo`` names
none of them) and the bytecode that would name them (rewritten copies stacked above) are the
namespaces backend's: ``backends/namespaces/neutral_sources.py`` and ``neutral_bytecode.py``.

Security limitations: other file *contents* of the runtime may still name host paths:
``sysconfig`` data records the build prefix of an interpreter outside ``/usr``, and a package may
keep a path it was built or installed at in its own data files. The gVisor backend binds the same
view; its mountinfo is the sentry's (no host path), and its bytecode comes from the same overlays.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

SANDBOX_RUNTIME_DIR = "/opt/sandcell"
"""Parent of every neutral runtime path inside the sandbox."""
SANDBOX_VENV = f"{SANDBOX_RUNTIME_DIR}/venv"
SANDBOX_BASE = f"{SANDBOX_RUNTIME_DIR}/python"
"""Where a base interpreter prefix outside ``/usr`` appears."""
_SANDBOX_EXTRA_BIN = f"{SANDBOX_RUNTIME_DIR}/bin"
_KEPT_ROOTS = ("/usr",)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPython:
    """The host facts the view is made from (gathered by ``runtimes.python_runtime``)."""

    executable: str
    """The interpreter binary, symlinks resolved."""
    base_prefix: str
    """``sys.base_prefix``, symlinks resolved."""
    venv: str | None
    """The virtual environment's directory (``sys.prefix``), or None outside one."""
    site_packages: tuple[str, ...]
    """The venv's site-packages directories (host paths, under :attr:`venv`)."""
    version: str
    include_system_site_packages: bool
    shared_libpython: bool
    """Whether the interpreter loads ``libpython`` from ``<base_prefix>/lib``."""
    masked: tuple[str, ...] = ()
    """Host files inside the site-packages to cover with empty files."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NeutralView:
    mounts: tuple[tuple[str, str], ...]
    """(host path, sandbox path), bound read-only in this order."""
    files: tuple[tuple[str, str], ...]
    """(sandbox path, text): synthetic files, bound after the mounts."""
    python: str
    """The interpreter's path inside the sandbox."""
    bin_dir: str
    """The directory to put first on PATH."""
    env: tuple[tuple[str, str], ...]
    """Environment the layout needs (``LD_LIBRARY_PATH`` for a moved shared ``libpython``)."""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _moved(path: str, host_root: str, sandbox_root: str) -> str:
    return sandbox_root + path[len(host_root.rstrip("/")) :] if path != host_root else sandbox_root


def neutral_view(host: HostPython, *, same_path: Sequence[str]) -> NeutralView:
    """The runtime's neutral layout. ``same_path``: host directories bound at their own path
    (``/usr``, real top-level ``/lib64`` and the like, ``/etc/fonts``); each must name nothing
    of the host's users."""
    mounts: list[tuple[str, str]] = [(d, d) for d in same_path]
    env: list[tuple[str, str]] = []
    base = host.base_prefix
    if any(_under(base, r) for r in _KEPT_ROOTS):
        base_in_sandbox = base
    else:
        base_in_sandbox = SANDBOX_BASE
        mounts.append((base, SANDBOX_BASE))
        if host.shared_libpython:
            env.append(("LD_LIBRARY_PATH", f"{SANDBOX_BASE}/lib"))
    exe = host.executable
    if any(_under(exe, r) for r in _KEPT_ROOTS):
        exe_in_sandbox = exe
    elif _under(exe, base):
        exe_in_sandbox = _moved(exe, base, base_in_sandbox)
    else:
        # An interpreter outside its own prefix (unusual): its directory gets a neutral place.
        mounts.append((os.path.dirname(exe), _SANDBOX_EXTRA_BIN))
        exe_in_sandbox = f"{_SANDBOX_EXTRA_BIN}/{os.path.basename(exe)}"
    if host.venv is None:
        return NeutralView(
            mounts=tuple(mounts),
            files=(),
            python=exe_in_sandbox,
            bin_dir=os.path.dirname(exe_in_sandbox),
            env=tuple(env),
        )
    venv_python = f"{SANDBOX_VENV}/bin/python"
    # The binary itself, not a symlink to it: a symlink would need a directory of links, and
    # CPython finds pyvenv.cfg from the path it was started as either way.
    mounts.append((exe, venv_python))
    for sp in host.site_packages:
        mounts.append((sp, _moved(sp, host.venv, SANDBOX_VENV)))
    cfg = (
        f"home = {os.path.dirname(exe_in_sandbox)}\n"
        f"include-system-site-packages = {str(host.include_system_site_packages).lower()}\n"
        f"version = {host.version}\n"
    )
    files = [(f"{SANDBOX_VENV}/pyvenv.cfg", cfg)]
    for path in host.masked:
        files += [(_moved(path, host.venv, SANDBOX_VENV), "")]
    return NeutralView(
        mounts=tuple(mounts),
        files=tuple(files),
        python=venv_python,
        bin_dir=f"{SANDBOX_VENV}/bin",
        env=tuple(env),
    )


def host_hooks(site_packages: Sequence[str], host_roots: Sequence[str]) -> tuple[str, ...]:
    """Files of the site-packages that only point back into the host: an editable install's
    ``__editable__`` hooks (a legacy one's ``.egg-link``), ``.pth`` files naming a directory
    outside ``host_roots`` (which the sandbox cannot see; the text would tell it where the host
    keeps its sources), and the install records that name the host: a ``direct_url.json`` of a
    local source (``file:`` URL: an editable or a local directory or archive install), a
    ``RECORD`` or ``installed-files.txt`` listing files by an absolute path outside
    ``host_roots``."""
    found: list[str] = []
    for sp in site_packages:
        try:
            names = sorted(os.listdir(sp))
        except OSError:
            continue
        for name in names:
            path = os.path.join(sp, name)
            hook = name.startswith("__editable__") or name.endswith(".egg-link")
            hook = hook and os.path.isfile(path)
            if hook or (name.endswith(".pth") and _names_outside(path, host_roots)):
                found.append(path)
            elif name.endswith((".dist-info", ".egg-info")):
                found += _naming_records(path, host_roots)
    return tuple(found)


def _naming_records(meta: str, roots: Sequence[str]) -> list[str]:
    found: list[str] = []
    direct = os.path.join(meta, "direct_url.json")
    try:
        with open(direct, encoding="utf-8", errors="replace") as f:
            if '"file:' in f.read():
                found.append(direct)
    except OSError:
        pass
    for name in ("RECORD", "installed-files.txt"):
        path = os.path.join(meta, name)
        if os.path.isfile(path) and _names_outside(path, roots):
            found.append(path)
    return found


def _names_outside(pth: str, roots: Sequence[str]) -> bool:
    try:
        with open(pth, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        text = line.strip()
        if text.startswith("/") and not any(_under(text, r) for r in roots):
            return True
    return False
