"""The runtime's own packages: what it provides, and its pins (a lock file and drift checks).

The default runtime is the environment sandcell runs in; its site-packages are read-only while
sandcell runs, so what they provide is read once per process.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from sandcell.errors import ConfigError
from sandcell.packages.wheel_cache import sha256_file
from sandcell.packages.wheels import dist_imports, module_of, normalize_name, read_metadata

__all__ = [
    "check_runtime_lock",
    "runtime_distributions",
    "runtime_distributions_once",
    "runtime_imports",
    "write_runtime_lock",
]

_SITE_DIRS = ("site-packages", "dist-packages")  # the latter: Debian's system Python


def _runtime_site_dirs() -> list[Path]:
    """The default runtime's site-packages: those of the environment sandcell runs in."""
    prefix = os.path.realpath(sys.prefix).rstrip("/") + "/"
    dirs = [p for p in sys.path if p.startswith(prefix) and p.endswith(_SITE_DIRS)]
    return [Path(p) for p in dict.fromkeys(dirs) if os.path.isdir(p)]


def runtime_distributions() -> dict[str, tuple[str, Path]]:
    """Normalized name -> (version, ``.dist-info`` directory) of every runtime distribution."""
    found: dict[str, tuple[str, Path]] = {}
    for site in _runtime_site_dirs():
        for dist_info in sorted(site.glob("*.dist-info")):
            if (dist_info / "METADATA").is_file():
                name, version, _, _ = read_metadata(dist_info)
                found.setdefault(normalize_name(name), (version, dist_info))
    return found


@functools.cache
def runtime_distributions_once() -> Mapping[str, tuple[str, Path]]:
    """:func:`runtime_distributions`, read once per process: the runtime is read-only while
    sandcell runs (the lock's writer and checker read it afresh)."""
    return MappingProxyType(runtime_distributions())


@functools.cache
def runtime_imports() -> frozenset[str]:
    """Top-level names importable in the default runtime: the standard library, what each
    distribution declares (top_level.txt or RECORD) and the modules in site-packages. Computed
    once per process: the runtime's site-packages are read-only while sandcell runs."""
    names = set(sys.stdlib_module_names)
    for _, dist_info in runtime_distributions_once().values():
        names |= dist_imports(dist_info)
    for site in _runtime_site_dirs():
        for entry in site.iterdir():
            is_package = entry.is_dir() and entry.name.isidentifier()
            if is_package and not entry.name.startswith("__"):
                names.add(entry.name)
            elif entry.is_file() and (module := module_of(entry.name)):
                names.add(module)
    return frozenset(names)


def write_runtime_lock(path: Path) -> None:
    """Write the runtime's distributions as ``name==version  # record-sha256:<hex>`` lines: a
    pip requirements file (the comments are ignored) that also pins each install's RECORD."""
    lines = [f"# sandcell runtime lock: Python {sys.version.split()[0]}, {sys.prefix}"]
    for name, (version, dist_info) in sorted(runtime_distributions().items()):
        lines.append(f"{name}=={version}  # record-sha256:{_record_sha(dist_info)}")
    tmp = path.with_name(path.name + ".part")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _record_sha(dist_info: Path) -> str:
    record = dist_info / "RECORD"
    return sha256_file(record) if record.is_file() else "-"


def check_runtime_lock(path: Path) -> list[str]:
    """How the runtime drifted from the lock at ``path``: one sentence per difference."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the runtime lock {path}: {exc.strerror}") from exc
    locked: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(\S+)==(\S+)\s+# record-sha256:(\S+)", line.strip())
        if m:
            locked[m.group(1)] = (m.group(2), m.group(3))
    now = runtime_distributions()
    extra = sorted(set(now) - set(locked))
    problems = [f"{name} is in the runtime but not in the lock" for name in extra]
    for name, (version, sha) in sorted(locked.items()):
        if name not in now:
            problems.append(f"{name}=={version} is in the lock but not in the runtime")
        elif now[name][0] != version:
            problems.append(f"{name} is {now[name][0]} in the runtime, {version} in the lock")
        elif _record_sha(now[name][1]) != sha:
            problems.append(f"{name} {version}: its installed files (RECORD) changed")
    return problems
