"""Runtimes: what a sandbox may execute, and the read-only host directories that requires.

A runtime is an interpreter plus a read-only set of packages. The default Python runtime is the
environment sandcell itself is installed in (its interpreter, resolved past shims such as pyenv's,
and its site-packages with the pinned analysis basics). The bash runtime is ``/usr``'s bash and
tools. Both are mounted read-only at their host paths, so shebangs and shared-library paths keep
working; nothing else of the host is mounted.

The record of every run names the runtime and a hash of it, so a result can be tied to exactly the
packages that produced it.
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
from sandcell.spec import Language

# Top-level directories that merged-/usr systems turn into symlinks; recreated as symlinks inside
# the sandbox, or bound read-only where they are real directories.
_ROOT_LINK_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """One runtime: how to start the interpreter and which host paths it needs."""

    name: str
    language: Language
    interpreter: str
    """Absolute path of the interpreter inside the sandbox (the same path as on the host)."""
    python: str
    """The Python interpreter inside the sandbox, used for the boot step of every language."""
    ro_dirs: tuple[str, ...]
    """Host directories bound read-only at the same path."""
    symlinks: tuple[tuple[str, str], ...]
    """(link path, target) pairs created in the sandbox root, e.g. ``("/bin", "usr/bin")``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The base environment of every program in this runtime."""
    identity: str
    """A human-readable description: interpreter, version, location."""
    sha256: str
    """Hash over the interpreter identity and the exact packages available."""


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


@functools.cache
def python_runtime() -> Runtime:
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
    wanted = ["/usr", base_prefix, prefix, os.path.dirname(real_python)]
    # Font configuration, so matplotlib and Pillow find fonts without complaining; no secrets.
    if os.path.isdir("/etc/fonts"):
        wanted.append("/etc/fonts")
    if in_venv:
        wanted.append(os.path.abspath(sys.prefix))
    ro_dirs = _minimal_roots([*dirs, *wanted])

    # The installed distributions' metadata directories name each one and its version
    # ("numpy-2.4.6.dist-info"): listing them is enough to tell two runtimes apart, and costs
    # a directory read instead of parsing every METADATA file.
    packages = sorted(
        name
        for sp in _site_packages(prefix)
        if os.path.isdir(sp)
        for name in os.listdir(sp)
        if name.endswith((".dist-info", ".egg-info"))
    )
    identity = (
        f"{platform.python_implementation()} {platform.python_version()} at {real_python}"
        + (f", packages of {prefix}" if in_venv else "")
    )
    digest = hashlib.sha256("\n".join([identity, *packages]).encode()).hexdigest()
    path_dirs = [os.path.dirname(interpreter), "/usr/local/bin", "/usr/bin", "/bin"]
    return Runtime(
        name=f"python-{sys.version_info.major}.{sys.version_info.minor}",
        language="python",
        interpreter=interpreter,
        python=interpreter,
        ro_dirs=ro_dirs,
        symlinks=links,
        env={
            "PATH": ":".join(dict.fromkeys(path_dirs)),
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": "/tmp/.matplotlib",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        },
        identity=identity,
        sha256=digest,
    )


@functools.cache
def bash_runtime() -> Runtime:
    """The bash runtime: the host's ``/usr`` (bash and the usual tools), read-only."""
    bash = next((p for p in ("/usr/bin/bash", "/bin/bash") if os.path.exists(p)), None)
    if bash is None:
        raise ConfigError("bash is not installed on this host; install it (apt-get install bash)")
    real_bash = os.path.realpath(bash)
    py = python_runtime()
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
    )


def runtime_for(language: Language) -> Runtime:
    """The runtime for a language."""
    if language == "python":
        return python_runtime()
    return bash_runtime()


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


def code_path(language: Language) -> Path:
    """Where the program text sits inside the sandbox."""
    return Path("/sandcell/main.py" if language == "python" else "/sandcell/main.sh")
