"""Packages from the wheel cache, for a guest: verified on the host, sent in with the job.

A guest cannot share a host directory, so a run's cache packages travel over the agent channel
after its inputs; the agent writes them to a tmpfs at ``/packages/<name>`` (owned by root,
remounted read-only before the program starts) and the runner appends those directories to the
program's ``sys.path``, after the runtime's own site-packages, as the namespaces backend does.

What is sent is what the cache vouches for: each directory must be an entry of a wheel cache
whose kept wheel still has the SHA-256 its lock records, the extracted tree must match that
wheel's RECORD (:func:`sandcell.packages.wheels.tree_problems`), and every file is read once, into
memory, and its bytes checked against the RECORD digest before they are sent, so a file changed
after the check is refused rather than sent. The tmpfs lives in guest RAM: :func:`guest_bytes`
is what it takes, a cold VM gets that much more memory, and more than :data:`MAX_BYTES` is
refused.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.microvm import channel
from sandcell.errors import ConfigError
from sandcell.packages.wheel_cache import CachedPackage, WheelCache, sha256_file
from sandcell.packages.wheels import _target, tree_problems, wheel_record

__all__ = ["MAX_BYTES", "NONE", "PACKAGES_DIR", "GuestPackages", "load"]

PACKAGES_DIR = "/packages"
MAX_BYTES = 1 << 30
"""Most guest RAM a run's packages may take (they are held in a tmpfs)."""
_PER_ENTRY = 4096
"""What each file or directory costs a tmpfs beyond its bytes (a page and an inode, rounded)."""
RESERVED_MIB = 128
"""Guest RAM a pooled VM keeps for its kernel, agent and runner: packages never use it."""


@dataclass(frozen=True, slots=True)
class _Entry:
    path: str
    """Relative to ``/packages``: ``<name>/...``."""
    data: bytes | None
    """The verified bytes of a file; None for a directory."""


@dataclass(frozen=True, slots=True)
class GuestPackages:
    """A run's packages, verified and read: their names and every entry to create."""

    names: tuple[str, ...]
    entries: tuple[_Entry, ...]

    @property
    def guest_bytes(self) -> int:
        """Guest RAM the packages' tmpfs takes (bytes plus a page per entry)."""
        return sum(len(e.data or b"") + _PER_ENTRY for e in self.entries) + (1 << 20)

    @property
    def extra_mib(self) -> int:
        """Guest RAM to add to a cold VM for them, in MiB."""
        return -(-self.guest_bytes // (1 << 20)) if self.names else 0

    def fits(self, memory_mib: int, program_bytes: int) -> bool:
        """Whether a VM of ``memory_mib`` (a pooled one) has room for them beside a program
        limited to ``program_bytes`` and the guest's own reserve."""
        if not self.names:
            return True
        room = (memory_mib - RESERVED_MIB) * (1 << 20) - program_bytes
        return self.guest_bytes <= room

    def frames(self) -> Iterator[bytes]:
        """The frames that create the packages in the guest (after the inputs' frames)."""
        for e in self.entries:
            kind = "dir" if e.data is None else "file"
            size = len(e.data or b"")
            meta = {"path": e.path, "type": kind, "size": size, "area": "packages"}
            yield channel.encode(channel.INPUT, json.dumps(meta).encode())
            if e.data is None:
                continue
            view = memoryview(e.data)
            for at in range(0, size, channel.MAX_FRAME):
                yield channel.encode(channel.DATA, bytes(view[at : at + channel.MAX_FRAME]))


NONE = GuestPackages(names=(), entries=())


def load(paths: Sequence[Path]) -> GuestPackages:
    """Verify and read the cache packages at ``paths`` (see module).

    Raises:
        ConfigError: a directory that is not a wheel-cache entry, an entry that no longer
            matches its lock (the message says which file and how to repair it), two packages
            of one name, or packages over :data:`MAX_BYTES` together.
    """
    if not paths:
        return NONE
    names: list[str] = []
    entries: list[_Entry] = []
    total = 0
    for path in paths:
        pkg = _cache_entry(Path(path))
        name = Path(path).name
        if name in names:
            raise ConfigError(f"two packages named {name!r} in one run; pass each once")
        names.append(name)
        record = _verified_record(pkg)
        fix = f"run `sandcell packages remove {pkg.name}` and add {pkg.name}=={pkg.version} again"
        problems = tree_problems(pkg.path, record)
        if problems:
            raise ConfigError(
                f"cache package {pkg.name} {pkg.version} does not match its lock: "
                f"{'; '.join(problems[:3])}; {fix}"
            )
        for entry in _read_tree(pkg.path, name, record, fix):
            total += len(entry.data or b"") + _PER_ENTRY
            if total > MAX_BYTES:
                raise ConfigError(
                    f"the run's packages take over {MAX_BYTES} bytes of guest memory together; "
                    "a microVM holds them in RAM: use fewer or smaller packages, or the "
                    "namespaces backend"
                )
            entries.append(entry)
    return GuestPackages(names=tuple(names), entries=tuple(entries))


def _cache_entry(path: Path) -> CachedPackage:
    """The lock's entry whose extracted directory is ``path``."""
    root = path.parent.parent
    try:
        cached = WheelCache(root).packages() if path.parent.name == "site" else []
    except ConfigError as exc:
        raise ConfigError(f"package directory {path}: {exc}") from exc
    for pkg in cached:
        if pkg.path == path:
            return pkg
    raise ConfigError(
        f"{path} is not a package of a wheel cache (<cache>/site/<name>-<version> recorded in "
        "<cache>/lock.json); a microVM only receives packages the cache can vouch for: add it "
        "with `sandcell packages add`"
    )


def _verified_record(pkg: CachedPackage) -> str:
    fix = f"run `sandcell packages remove {pkg.name}` and add {pkg.name}=={pkg.version} again"
    wheel = pkg.path.parent.parent / "wheels" / pkg.wheel
    if not wheel.is_file():
        raise ConfigError(f"cache package {pkg.name} {pkg.version}: {wheel} is missing; {fix}")
    if sha256_file(wheel) != pkg.sha256:
        raise ConfigError(
            f"cache package {pkg.name} {pkg.version}: {wheel} no longer has the sha256 its lock "
            f"records; {fix}"
        )
    record = wheel_record(wheel)
    if record is None:
        raise ConfigError(f"cache package {pkg.name} {pkg.version}: {wheel} has no RECORD; {fix}")
    return record


def _digests(record: str) -> dict[str, str]:
    """Path in the extracted tree -> its RECORD digest (``sha256=...``), placed as the
    extraction places it (``.data/purelib`` files at the top); empty where RECORD has none."""
    out: dict[str, str] = {}
    for row in csv.reader(record.splitlines()):
        parts = row[0].split("/") if row and row[0] else []
        target = _target(parts) if parts and ".." not in parts else None
        if target is not None:
            out["/".join(target)] = row[1] if len(row) > 1 else ""
    return out


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _read_tree(tree: Path, name: str, record: str, fix: str) -> Iterator[_Entry]:
    """Every directory and file under ``tree``, files read once and checked against the
    RECORD's digests (RECORD itself against the wheel's); links and special files are refused
    (the extraction makes none)."""
    digests = _digests(record)

    def refuse(rel: str, why: str) -> ConfigError:
        return ConfigError(f"cache package {name}: {rel} {why}; {fix}")

    yield _Entry(name, None)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        for child in sorted(os.listdir(tree / rel_dir) if rel_dir else os.listdir(tree)):
            rel = f"{rel_dir}/{child}" if rel_dir else child
            host = tree / rel
            st = os.lstat(host)
            if stat.S_ISDIR(st.st_mode):
                yield _Entry(f"{name}/{rel}", None)
                stack.append(rel)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise refuse(rel, "is not a regular file")
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
            if rel.endswith(".dist-info/RECORD") and rel.count("/") == 1:
                ok = data == record.encode("utf-8")
            else:
                expected = digests.get(rel)
                ok = bool(expected) and _digest(data) == expected
            if not ok:
                raise refuse(rel, "does not match its wheel's RECORD (changed after the check)")
            yield _Entry(f"{name}/{rel}", data)
