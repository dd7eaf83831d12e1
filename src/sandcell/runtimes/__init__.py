"""Runtimes: what a sandbox may execute, and the read-only host directories that requires.

A runtime is an interpreter plus a read-only set of packages. The default Python runtime is the
environment sandcell itself is installed in (its interpreter, resolved past shims such as pyenv's,
and its site-packages with the pinned analysis basics). The bash runtime is ``/usr``'s bash and
tools. Nothing else of the host is mounted.

Inside the sandbox the runtime sits at fixed neutral paths, so a program learns nothing of the
host's users or layout from where its interpreter lives: ``/usr`` stays ``/usr``, a base
interpreter installed elsewhere (pyenv, uv, conda, all under some home directory) appears at
``/opt/sandcell/python``, and a virtual environment at ``/opt/sandcell/venv``: its site-packages
bound read-only, a synthetic ``pyvenv.cfg`` naming the neutral base, and the interpreter itself
bound as ``bin/python`` (the console scripts of the host venv are left out: their shebangs name
the host path). An editable install's ``.pth`` and finder files point at the host's source tree,
which is not mounted: they are covered by empty files. :attr:`Runtime.mounts`,
:attr:`Runtime.files`, :attr:`Runtime.sandbox_python` and :attr:`Runtime.sandbox_env` describe
that view; the older fields (``ro_dirs``, ``python``, ``env``) keep describing the host layout,
which the host side needs (the workspace helper runs ``python`` on the host).

The run record keeps the host paths in the runtime's identity: it is the host's record.

The record of every run names the runtime and a hash of it, so a result can be tied to exactly the
packages that produced it.

A *named* runtime (``minimal``, ``analysis``, ``datascience`` or a user's lock) is a separate
environment built by ``sandcell runtime build`` (:mod:`sandcell.runtimes.store`): the same base
interpreter, with the locked packages as the neutral venv's site-packages instead of sandcell's
own. ``default`` (and ``None``) is the environment sandcell runs in. A named runtime is verified
before its first use in a process; a missing or tampered one is refused with the command that
builds it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.errors import ConfigError
from sandcell.runtimes.view import SANDBOX_RUNTIME_DIR, HostPython, host_hooks, neutral_view
from sandcell.spec import DEFAULT_RUNTIME, NODE_LANGUAGES, Language

# Top-level directories that merged-/usr systems turn into symlinks; recreated as symlinks inside
# the sandbox, or bound read-only where they are real directories.
_ROOT_LINK_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """One runtime: how to start the interpreter and which host paths it needs."""

    name: str
    language: Language
    interpreter: str
    """Absolute path of the interpreter on the host (see :attr:`sandbox_interpreter`)."""
    python: str
    """The Python interpreter on the host (see :attr:`sandbox_python` for the sandbox's)."""
    ro_dirs: tuple[str, ...]
    """The host directories the runtime needs (the host layout: :attr:`mounts` says where each
    appears in the sandbox)."""
    symlinks: tuple[tuple[str, str], ...]
    """(link path, target) pairs created in the sandbox root, e.g. ``("/bin", "usr/bin")``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The base environment of every program in this runtime."""
    identity: str
    """A human-readable description: interpreter, version, location."""
    sha256: str
    """Hash over the interpreter identity and the exact packages available."""
    mounts: tuple[tuple[str, str], ...] = ()
    """(host path, sandbox path) pairs bound read-only: the whole runtime as the sandbox sees it,
    at neutral paths (``/usr`` at ``/usr``, a venv's site-packages under ``/opt/sandcell/venv``).
    A path may be a file (the interpreter bound as the venv's ``bin/python``)."""
    files: tuple[tuple[str, str], ...] = ()
    """(sandbox path, text) pairs: synthetic read-only files bound after :attr:`mounts` (the
    neutral venv's ``pyvenv.cfg``; empty files over editable-install hooks)."""
    sandbox_python: str = ""
    """The Python interpreter's path inside the sandbox (boot step of every language)."""
    sandbox_interpreter: str = ""
    """The language's interpreter path inside the sandbox."""
    interpreter_args: tuple[str, ...] = ()
    """Arguments between the interpreter and the program's path (Node.js's permission flags);
    every rung starts a non-Python program as ``sandbox_interpreter *interpreter_args path``."""
    sandbox_env: Mapping[str, str] = field(default_factory=dict)
    """:attr:`env` for the neutral layout: what programs get in the sandbox."""
    tree_sha256: str = ""
    """A named runtime's content hash (its store name); empty for ``default``."""
    lock_sha256: str = ""
    """The lock a named runtime was built from; empty for ``default``."""
    prebuilt_bytecode: tuple[str, ...] = ()
    """Host directories whose bytecode already names the sandbox paths (a named runtime's
    site-packages, compiled at build time): nothing to rewrite for them."""

    @property
    def sandbox_paths(self) -> tuple[str, ...]:
        """Every path of the runtime inside the sandbox (mount points and links), e.g. for the
        read-and-execute rules of Landlock."""
        paths = [dest for _, dest in self.mounts] + [path for path, _ in self.files]
        # The neutral directory as a whole: its synthetic files sit beside the mounts.
        kept = [p for p in paths if not _covered(p, [SANDBOX_RUNTIME_DIR])]
        neutral = [SANDBOX_RUNTIME_DIR] if len(kept) < len(paths) else []
        return (*_minimal_roots([*neutral, *kept]), *(link for link, _ in self.symlinks))


def _root_layout() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    for path in _ROOT_LINK_DIRS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    return tuple(dirs), tuple(links)


def _covered(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _minimal_roots(paths: list[str]) -> tuple[str, ...]:
    """Drop paths already covered by another path in the list (fewer mounts, same view)."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not _covered(p, out):
            out.append(p)
    return tuple(sorted(out))


def _site_packages(prefix: str) -> list[str]:
    return [p for p in sys.path if p.startswith(prefix.rstrip("/") + "/") and "site-packages" in p]


def _shared_libpython(executable: str, base_prefix: str) -> bool:
    """Whether the interpreter was linked against a ``libpython`` in its own prefix (pyenv's
    default build): its RUNPATH names the host prefix, so a moved prefix needs the loader told."""
    lib = os.path.join(base_prefix, "lib")
    try:
        names = os.listdir(lib)
        with open(executable, "rb") as f:
            head = f.read(1 << 22)
    except OSError:
        return False
    return any(n.startswith("libpython") and ".so" in n for n in names) and lib.encode() in head


def python_runtime(name: str | None = None) -> Runtime:
    """The Python runtime ``name`` (``None`` or ``default``: this environment's own)."""
    if name is None or name == DEFAULT_RUNTIME:
        return _own_python_runtime()
    return _named_python_runtime(name)


@functools.cache
def _own_python_runtime() -> Runtime:
    """The default Python runtime: this environment's interpreter and packages."""
    real_python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.prefix)
    base_prefix = os.path.realpath(sys.base_prefix)
    in_venv = prefix != base_prefix
    # A venv's bin/python is a symlink to the base interpreter; starting it through the venv path
    # makes the interpreter read pyvenv.cfg, so site-packages comes from the venv.
    interpreter = os.path.join(sys.prefix, "bin", "python") if in_venv else real_python
    interpreter = os.path.abspath(interpreter)
    dirs, links = _root_layout()
    same_path = ["/usr"]
    # Font configuration, so matplotlib and Pillow find fonts without complaining; no secrets.
    if os.path.isdir("/etc/fonts"):
        same_path.append("/etc/fonts")
    wanted = [*same_path, base_prefix, prefix, os.path.dirname(real_python)]
    if in_venv:
        wanted.append(os.path.abspath(sys.prefix))
    ro_dirs = _minimal_roots([*dirs, *wanted])

    site_packages = _site_packages(prefix)
    # The installed distributions' metadata directories name each one and its version
    # ("numpy-2.4.6.dist-info"): listing them is enough to tell two runtimes apart, and costs
    # a directory read instead of parsing every METADATA file.
    packages = sorted(
        name
        for sp in site_packages
        if os.path.isdir(sp)
        for name in os.listdir(sp)
        if name.endswith((".dist-info", ".egg-info"))
    )
    identity = (
        f"{platform.python_implementation()} {platform.python_version()} at {real_python}"
        + (f", packages of {prefix}" if in_venv else "")
    )
    digest = hashlib.sha256("\n".join([identity, *packages]).encode()).hexdigest()
    venv_sp = tuple(os.path.realpath(sp) for sp in site_packages if os.path.isdir(sp))
    view = neutral_view(
        HostPython(
            executable=real_python,
            base_prefix=base_prefix,
            venv=prefix if in_venv else None,
            site_packages=venv_sp if in_venv else (),
            version=platform.python_version(),
            include_system_site_packages=in_venv and _venv_includes_system_site(prefix),
            shared_libpython=_shared_libpython(real_python, base_prefix),
            masked=host_hooks(venv_sp, [*same_path, base_prefix, *venv_sp]) if in_venv else (),
        ),
        same_path=_minimal_roots([*dirs, *same_path]),
    )
    path_dirs = [os.path.dirname(interpreter), "/usr/local/bin", "/usr/bin", "/bin"]
    sandbox_path = [view.bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]
    base_env = {
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/.matplotlib",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return Runtime(
        name=f"python-{sys.version_info.major}.{sys.version_info.minor}",
        language="python",
        interpreter=interpreter,
        python=interpreter,
        ro_dirs=ro_dirs,
        symlinks=links,
        env={"PATH": ":".join(dict.fromkeys(path_dirs)), **base_env},
        identity=identity,
        sha256=digest,
        mounts=view.mounts,
        files=view.files,
        sandbox_python=view.python,
        sandbox_interpreter=view.python,
        sandbox_env={"PATH": ":".join(dict.fromkeys(sandbox_path)), **base_env, **dict(view.env)},
    )


def _venv_includes_system_site(prefix: str) -> bool:
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip() == "include-system-site-packages":
                    return value.strip().lower() == "true"
    except OSError:
        pass
    return False


def _named_python_runtime(ref: str) -> Runtime:
    from sandcell.runtimes.store import find, verify

    stored = find(ref)
    m = stored.manifest
    if m.kind != "python":
        raise ConfigError(
            f"runtime {m.name!r} is the {m.implementation} runtime, for JavaScript and TypeScript "
            "programs; name a Python runtime for Python and Bash (sandcell runtime list)"
        )
    verify(stored)
    return _stored_python_runtime(
        m.name, m.tree_sha256, str(stored.tree), m.site_packages, m.lock_sha256, m.lock_source
    )


@functools.cache
def _stored_python_runtime(  # noqa: PLR0917 - positional: the cache key is these six strings
    name: str,
    tree_sha256: str,
    tree: str,
    site_packages: str,
    lock_sha256: str,
    lock_source: str,
) -> Runtime:
    """A named runtime as the sandbox sees it: the base interpreter of this environment, and
    the stored tree's site-packages as the neutral venv's."""
    own = _own_python_runtime()
    real_python = os.path.realpath(sys.executable)
    base_prefix = os.path.realpath(sys.base_prefix)
    dirs, links = _root_layout()
    same_path = ["/usr"] + (["/etc/fonts"] if os.path.isdir("/etc/fonts") else [])
    site = os.path.join(tree, site_packages)
    view = neutral_view(
        HostPython(
            executable=real_python,
            base_prefix=base_prefix,
            venv=tree,
            site_packages=(site,),
            version=platform.python_version(),
            include_system_site_packages=False,
            shared_libpython=_shared_libpython(real_python, base_prefix),
        ),
        same_path=_minimal_roots([*dirs, *same_path]),
    )
    identity = (
        f"{platform.python_implementation()} {platform.python_version()} at {real_python}, "
        f"runtime {name} {tree_sha256[:12]} (lock {lock_source})"
    )
    sandbox_path = [view.bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]
    base_env = {k: v for k, v in own.env.items() if k != "PATH"}
    return Runtime(
        name=name,
        language="python",
        interpreter=own.interpreter,
        python=own.python,
        ro_dirs=_minimal_roots([*own.ro_dirs, tree]),
        symlinks=links,
        env=dict(own.env),
        identity=identity,
        sha256=hashlib.sha256(f"{identity}\n{tree_sha256}".encode()).hexdigest(),
        mounts=view.mounts,
        files=view.files,
        sandbox_python=view.python,
        sandbox_interpreter=view.python,
        sandbox_env={"PATH": ":".join(dict.fromkeys(sandbox_path)), **base_env, **dict(view.env)},
        tree_sha256=tree_sha256,
        lock_sha256=lock_sha256,
        prebuilt_bytecode=(os.path.realpath(site),),
    )


def bash_runtime(name: str | None = None) -> Runtime:
    """The bash runtime: the host's ``/usr`` (bash and the usual tools), read-only, beside the
    Python runtime ``name`` (the boot step is Python)."""
    py = python_runtime(name)
    return _bash_runtime(name or DEFAULT_RUNTIME, py.sha256)


@functools.cache
def _bash_runtime(name: str, py_sha256: str) -> Runtime:
    py = python_runtime(name)
    bash = next((p for p in ("/usr/bin/bash", "/bin/bash") if os.path.exists(p)), None)
    if bash is None:
        raise ConfigError("bash is not installed on this host; install it (apt-get install bash)")
    real_bash = os.path.realpath(bash)
    h = hashlib.sha256()
    with open(real_bash, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(py.sha256.encode())
    return Runtime(
        name="bash",
        language="bash",
        interpreter=real_bash,
        python=py.python,
        ro_dirs=py.ro_dirs,
        symlinks=py.symlinks,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        identity=f"bash at {real_bash}",
        sha256=h.hexdigest(),
        mounts=py.mounts,
        files=py.files,
        sandbox_python=py.sandbox_python,
        sandbox_interpreter=real_bash,
        # The boot step is python: a moved shared libpython must still be found.
        sandbox_env={
            # A built runtime's interpreter comes first, so that `python` in a script is the
            # runtime's (with its packages); `python3` stays the system's, as on the host.
            "PATH": ("/opt/sandcell/venv/bin:" if py.tree_sha256 else "")
            + "/usr/local/bin:/usr/bin:/bin",
            **{k: v for k, v in py.sandbox_env.items() if k == "LD_LIBRARY_PATH"},
        },
        tree_sha256=py.tree_sha256,
        lock_sha256=py.lock_sha256,
        prebuilt_bytecode=py.prebuilt_bytecode,
    )


def runtime_for(language: Language, name: str | None = None) -> Runtime:
    """The runtime for a language, over the Python runtime ``name`` (None: ``default``); for
    JavaScript and TypeScript, the Node runtime ``name`` (None or ``default``: ``node``)."""
    if language == "python":
        return python_runtime(name)
    if language in NODE_LANGUAGES:
        from sandcell.runtimes.node import node_runtime

        return node_runtime(name)
    return bash_runtime(name)


def common_env() -> dict[str, str]:
    """Environment every sandboxed program gets, whatever the runtime. No host values."""
    return {
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/sh",
        "TERM": "dumb",
    }


_CODE_FILES: dict[str, str] = {
    "python": "main.py",
    "bash": "main.sh",
    # Node.js tells CommonJS from an ES module by the program's syntax (``require`` or
    # ``import``/top-level ``await``), and TypeScript by the extension: its types are stripped.
    "javascript": "main.js",
    "typescript": "main.ts",
}


def code_path(language: Language) -> Path:
    """Where the program text sits inside the sandbox."""
    return Path("/sandcell") / _CODE_FILES[language]
