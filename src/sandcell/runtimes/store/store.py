"""Where built runtimes live, content-addressed, and how one is found and verified before use.

::

    $SANDCELL_RUNTIMES_DIR, else /var/lib/sandcell/runtimes when it exists (root's builds, read
    by every user of the host), else ~/.local/share/sandcell/runtimes (a user's own)
        sha256/<tree>/lib/python3.X/site-packages/...    the packages, read-only, never changed
        sha256/<tree>.json                               its manifest (RuntimeManifest)
        names/<name>.json                                which tree a name means now

A user without a system-wide runtime of a name looks in their own directory too, so that
``sandcell runtime build`` works without root. A tree is verified (:func:`verify`) before a
process first uses it: its content hash must be the one it is stored under, else it is refused
as tampered, with the command that rebuilds it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import platformdirs

from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.runtimes.store.locks import check_name
from sandcell.runtimes.store.tree import fingerprint, summarize

__all__ = [
    "FORMAT",
    "RuntimeManifest",
    "StoredRuntime",
    "find",
    "list_runtimes",
    "runtimes_dir",
    "search_dirs",
    "verify",
]

FORMAT = 1
SYSTEM_DIR = Path("/var/lib/sandcell/runtimes")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeManifest:
    format: int
    name: str
    lock_source: str
    lock_sha256: str
    python: str
    """``major.minor`` of the interpreter the runtime was built for."""
    implementation: str
    platform: str
    tree_sha256: str
    files: int
    size_bytes: int
    site_packages: str
    """Relative to the tree: ``lib/python3.X/site-packages``."""
    distributions: dict[str, str] = field(default_factory=dict)
    """Normalized name -> version."""
    imports: tuple[str, ...] = ()
    """Top-level names the packages provide (the standard library is not listed)."""
    built_at: str = ""
    kind: str = "python"
    """``python`` (a venv's site-packages, for the base interpreter ``python``) or ``node`` (the
    Node.js binary under ``node/`` and the npm packages under ``node_modules/``: ``python`` is
    then empty, ``implementation`` names Node's version, ``site_packages`` is ``node_modules``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: Path) -> RuntimeManifest:
        try:
            data = json.loads(text)
            data["imports"] = tuple(data.get("imports", ()))
            manifest = cls(**data)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"runtime manifest {where} is damaged ({exc}); rebuild it") from None
        if manifest.format != FORMAT:
            raise ConfigError(
                f"runtime manifest {where} is format {manifest.format}, this sandcell reads "
                f"{FORMAT}; rebuild it with: sandcell runtime build {manifest.name}"
            )
        return manifest


@dataclass(frozen=True, slots=True)
class StoredRuntime:
    manifest: RuntimeManifest
    tree: Path
    """The content-addressed directory (``sha256/<tree>``)."""

    @property
    def site_packages(self) -> Path:
        return self.tree / self.manifest.site_packages


def runtimes_dir() -> Path:
    """Where ``sandcell runtime build`` writes (see the module docstring)."""
    explicit = os.environ.get("SANDCELL_RUNTIMES_DIR")
    if explicit:
        return Path(explicit)
    if SYSTEM_DIR.is_dir() or os.geteuid() == 0:
        return SYSTEM_DIR
    return platformdirs.user_data_path("sandcell") / "runtimes"


def search_dirs() -> tuple[Path, ...]:
    """Where runtimes are looked up, first match wins."""
    explicit = os.environ.get("SANDCELL_RUNTIMES_DIR")
    if explicit:
        return (Path(explicit),)
    own = platformdirs.user_data_path("sandcell") / "runtimes"
    return (SYSTEM_DIR,) if os.geteuid() == 0 else (SYSTEM_DIR, own)


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _build_hint(name: str) -> str:
    from sandcell.runtimes.node.locked import NODE_RUNTIME
    from sandcell.runtimes.store.locks import SHIPPED

    lock = "" if name in SHIPPED or name == NODE_RUNTIME else " --lock YOUR_LOCK.txt"
    return f"sandcell runtime build {name}{lock}"


def _read_pointer(base: Path, name: str) -> str | None:
    try:
        data = json.loads((base / "names" / f"{name}.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"the runtime name {base / 'names' / name}.json cannot be read ({exc}); rebuild it "
            f"with: {_build_hint(name)}"
        ) from None
    tree = data.get("tree_sha256") if isinstance(data, dict) else None
    if not isinstance(tree, str) or len(tree) != 64:
        raise ConfigError(f"the runtime name {name!r} in {base} is damaged; {_build_hint(name)}")
    return tree


def load(base: Path, tree_sha: str) -> StoredRuntime:
    where = base / "sha256" / f"{tree_sha}.json"
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"runtime manifest {where} cannot be read: {exc.strerror}") from None
    manifest = RuntimeManifest.from_json(text, where)
    if manifest.tree_sha256 != tree_sha:
        raise IsolationUnavailable(
            f"runtime {manifest.name}",
            f"its manifest {where} names another tree; refused as tampered",
            _build_hint(manifest.name),
        )
    return StoredRuntime(manifest, base / "sha256" / tree_sha)


def find(name: str) -> StoredRuntime:
    """The runtime ``name`` as built on this host (not yet verified: see :func:`verify`).

    ``name@<tree sha256>`` names one exact build, as long as the store still holds it (a
    replay asks for the tree its record names, whatever the name points at now)."""
    if "@" in name:
        return _find_tree(*name.split("@", 1))
    check_name(name)
    for base in search_dirs():
        tree = _read_pointer(base, name)
        if tree is not None:
            stored = load(base, tree)
            # Node's runtime holds no Python code: any Python boots it.
            if stored.manifest.kind == "python" and stored.manifest.python != python_tag():
                raise ConfigError(
                    f"runtime {name!r} was built for Python {stored.manifest.python}, sandcell "
                    f"runs on {python_tag()}; rebuild it with: {_build_hint(name)}"
                )
            return stored
    where = " or ".join(str(b) for b in search_dirs())
    raise ConfigError(
        f"runtime {name!r} is not built on this host (looked in {where}); build it with: "
        f"{_build_hint(name)}"
    )


def _find_tree(name: str, tree_sha: str) -> StoredRuntime:
    check_name(name)
    for base in search_dirs():
        if (base / "sha256" / f"{tree_sha}.json").is_file():
            stored = load(base, tree_sha)
            if stored.manifest.name != name:
                raise ConfigError(
                    f"the runtime tree {tree_sha[:12]} was built as {stored.manifest.name!r}, "
                    f"not {name!r}"
                )
            return stored
    raise ConfigError(
        f"the build {tree_sha[:12]} of runtime {name!r} is no longer stored on this host; run "
        f"in the current build (--runtime {name}), or rebuild that lock"
    )


def list_runtimes() -> list[StoredRuntime]:
    found: dict[str, StoredRuntime] = {}
    for base in search_dirs():
        names = base / "names"
        if not names.is_dir():
            continue
        for pointer in sorted(names.glob("*.json")):
            name = pointer.stem
            if name in found:
                continue
            tree = _read_pointer(base, name)
            if tree is not None:
                found[name] = load(base, tree)
    return list(found.values())


_verified: dict[str, tuple[int, int]] = {}
"""Trees verified by this process, by hash: the (device, inode) of the directory then, so that
a tree replaced under a running process (a rebuild of a changed tree) is verified again."""
_verify_lock = threading.Lock()


def _cache_file(tree_sha: str) -> Path:
    return platformdirs.user_cache_path("sandcell") / "runtime-verified" / tree_sha


def verify(stored: StoredRuntime, *, full: bool = False) -> None:
    """Refuse a runtime whose files are not the ones it was built with.

    The content hash is compared with the name the tree is stored under. It is computed once
    per tree and state: afterwards a stat fingerprint (``tree.fingerprint``), kept in this
    process and in the user's cache, stands in for it until any entry changes. ``full``
    always hashes the content.
    """
    tree_sha = stored.manifest.tree_sha256
    if not stored.tree.is_dir():
        raise IsolationUnavailable(
            f"runtime {stored.manifest.name}",
            f"its files ({stored.tree}) are missing",
            _build_hint(stored.manifest.name),
        )
    with _verify_lock:
        try:
            top = os.stat(stored.tree)
        except OSError as exc:
            raise IsolationUnavailable(
                f"runtime {stored.manifest.name}",
                f"its files ({stored.tree}) cannot be read: {exc.strerror}",
                _build_hint(stored.manifest.name),
            ) from None
        identity = (top.st_dev, top.st_ino)
        if not full and _verified.get(tree_sha) == identity:
            return
        print_ = fingerprint(stored.tree)
        cache = _cache_file(tree_sha)
        if not full:
            try:
                if cache.read_text().strip() == print_:
                    _verified[tree_sha] = identity
                    return
            except OSError:
                pass
        summary = summarize(stored.tree)
        if summary.sha256 != tree_sha:
            raise IsolationUnavailable(
                f"runtime {stored.manifest.name}",
                f"its files at {stored.tree} changed since it was built (they hash to "
                f"{summary.sha256[:12]}, not {tree_sha[:12]}); refused as tampered, no run starts",
                f"rebuild it (the build replaces the changed tree): "
                f"{_build_hint(stored.manifest.name)}",
            )
        _verified[tree_sha] = identity
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(print_)
            os.replace(tmp, cache)
        except OSError:
            pass  # no cache: the next process hashes again


def forget_verified() -> None:
    """Forget this process's verifications (tests that tamper with a tree)."""
    with _verify_lock:
        _verified.clear()
