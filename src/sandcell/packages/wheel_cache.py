"""The local wheel cache: pinned wheels downloaded ahead of time, checked, extracted, locked.

:meth:`WheelCache.prepare` downloads the wheel of an exact pin (never an sdist: building one runs
its code), hashes it, checks it names what was asked for, extracts its importable part into its
own directory and records it in ``lock.json``. Reading and unpacking one wheel safely is
:mod:`sandcell.packages.wheels`'s job; :mod:`sandcell.packages` is the public face of both.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import ConfigError, InfraError
from sandcell.home import data_dir
from sandcell.packages.wheels import (
    extract,
    normalize_name,
    tree_problems,
    version_key,
    wheel_name,
    wheel_record,
)

__all__ = ["CachedPackage", "WheelCache", "sha256_file"]

_PIN = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([0-9A-Za-z][0-9A-Za-z.!+_]*)")
_PIP_TIMEOUT_S = 600
_NETWORK_TROUBLE = re.compile(
    r"NewConnectionError|Max retries exceeded|Failed to establish|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|ProxyError|SSLError|timed out",
    re.IGNORECASE,
)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class CachedPackage:
    """One package of the wheel cache, as ``lock.json`` records it."""

    name: str
    """The normalized distribution name (PEP 503)."""
    version: str
    wheel: str
    """File name of the wheel it came from, kept in ``<root>/wheels``."""
    sha256: str
    """Hex SHA-256 of that wheel."""
    imports: tuple[str, ...]
    """Top-level import names it provides."""
    requires: tuple[str, ...]
    """Distributions it always needs (from METADATA; they are added and allowed separately)."""
    requires_if: tuple[str, ...]
    """Distributions it needs only under an environment marker (used when present)."""
    path: Path
    """The extracted directory, ``<root>/site/<name>-<version>``: what goes on ``sys.path``."""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form, as ``sandcell packages list --json`` prints it."""
        return {
            "name": self.name,
            "version": self.version,
            "wheel": self.wheel,
            "sha256": self.sha256,
            "imports": list(self.imports),
            "requires": list(self.requires),
            "requires_if": list(self.requires_if),
            "path": str(self.path),
        }


class WheelCache:
    """The local wheel cache: ``lock.json``, ``wheels/`` (the files as downloaded, kept so they
    can be re-verified) and ``site/<name>-<version>/`` (their importable part, extracted).

    Dependencies are not followed (``pip download --no-deps``): every package a run needs is
    added explicitly, by an exact pin, and allowed by name in the profile. What a package
    declares it needs is recorded, so a run gets those too, or a finding says which is missing.
    """

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            root = data_dir() / "wheels"
        self.root = Path(root)

    # -- reading ------------------------------------------------------------------------------

    def _read_lock(self) -> dict[str, dict[str, object]]:
        path = self.root / "lock.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is unreadable ({exc}); restore it or remove it") from exc
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ConfigError(f"{path} is not a wheel-cache lock; restore it or remove it")
        return data

    def _package(self, name: str, entry: dict[str, object]) -> CachedPackage:
        def strings(key: str) -> tuple[str, ...]:
            value = entry.get(key, [])
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        extracted = Path(str(entry.get("extracted", "")))
        if extracted.is_absolute() or len(extracted.parts) != 2 or extracted.parts[0] != "site":
            raise ConfigError(f"lock entry {name!r} has a bad path {str(extracted)!r}")
        return CachedPackage(
            name=name,
            version=str(entry.get("version", "")),
            wheel=Path(str(entry.get("wheel", ""))).name,
            sha256=str(entry.get("sha256", "")),
            imports=strings("imports"),
            requires=strings("requires"),
            requires_if=strings("requires_if"),
            path=self.root / extracted,
        )

    def packages(self) -> list[CachedPackage]:
        """Every cached package, by name."""
        return [self._package(n, e) for n, e in sorted(self._read_lock().items())]

    def get(self, name: str) -> CachedPackage | None:
        """The cached package of this distribution name, if any."""
        entry = self._read_lock().get(normalize_name(name))
        return None if entry is None else self._package(normalize_name(name), entry)

    def lookup(self, import_name: str) -> CachedPackage | None:
        """The cached package providing this top-level import name, if any."""
        return next((p for p in self.packages() if import_name in p.imports), None)

    def verify(self) -> list[str]:
        """Problems with the cache, one sentence each; empty when every wheel still has the hash
        the lock records and every extracted tree is exactly what its RECORD lists."""
        try:
            packages = self.packages()
        except ConfigError as exc:
            return [str(exc)]
        problems: list[str] = []
        for p in packages:
            fix = f"run `sandcell packages remove {p.name}` and add {p.name}=={p.version} again"
            wheel = self.root / "wheels" / p.wheel
            record = None
            if not wheel.is_file():
                problems.append(f"{p.name} {p.version}: wheel {wheel} is missing; {fix}")
            elif sha256_file(wheel) != p.sha256:
                problems.append(f"{p.name} {p.version}: {wheel} no longer has its sha256; {fix}")
            else:
                record = wheel_record(wheel)
            found = tree_problems(p.path, record)
            problems += [f"{p.name} {p.version}: {s}; {fix}" for s in found]
        return problems

    def _intact(self, pkg: CachedPackage) -> bool:
        wheel = self.root / "wheels" / pkg.wheel
        ok = wheel.is_file() and sha256_file(wheel) == pkg.sha256
        return ok and not tree_problems(pkg.path, wheel_record(wheel))

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One writer at a time, across processes (two `packages add` at once)."""
        for sub in ("wheels", "site"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".mutex", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_lock(self, lock: dict[str, dict[str, object]]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".lock-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(lock, indent=2, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.root / "lock.json")  # readers see the old lock or the new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def prepare(
        self, requirements: Sequence[str], *, python: str = sys.executable
    ) -> list[CachedPackage]:
        """Download, check, extract and record each pinned requirement (``name==version``).

        Run ahead of time on the host: this is the only place the network is used. Only wheels
        are taken and only the named distribution (``--no-deps``): list its dependencies too.
        A pin already in the cache and intact is not downloaded again.

        Raises:
            ConfigError: an unpinned requirement (before anything is downloaded), no wheel of
                that version for ``python``, or a wheel that is unsafe or not what was asked.
            InfraError: pip could not reach the index; safe to retry.
        """
        pins = [_parse_pin(r) for r in requirements]
        done: list[CachedPackage] = []
        with self._exclusive():
            for name, version, req in pins:
                cached = self.get(name)
                same = cached and version_key(cached.version) == version_key(version)
                if cached and same and self._intact(cached):
                    done.append(cached)
                    continue
                with tempfile.TemporaryDirectory(dir=self.root, prefix=".download-") as tmp:
                    wheel = _pip_download(req, Path(tmp), python)
                    done.append(self._add(wheel, expect=(name, version)))
        return done

    def prepare_files(self, paths: Sequence[Path]) -> list[CachedPackage]:
        """Add local wheel files, with the checks of :meth:`prepare` (an offline mirror, tests)."""
        with self._exclusive():
            return [self._add(Path(p)) for p in paths]

    def remove(self, name: str) -> bool:
        """Drop a package from the cache; False if it was not there."""
        with self._exclusive():
            lock = self._read_lock()
            entry = lock.pop(normalize_name(name), None)
            if entry is None:
                return False
            pkg = self._package(normalize_name(name), entry)
            self._write_lock(lock)
            shutil.rmtree(pkg.path, ignore_errors=True)
            (self.root / "wheels" / pkg.wheel).unlink(missing_ok=True)
            return True

    def _add(self, wheel: Path, *, expect: tuple[str, str] | None = None) -> CachedPackage:
        name, version = wheel_name(wheel.name)
        if expect and (name, version_key(version)) != (expect[0], version_key(expect[1])):
            raise ConfigError(f"asked for {expect[0]}=={expect[1]} but got {wheel.name}")
        kept = self.root / "wheels" / wheel.name
        # The copy kept is the one hashed and extracted: the original may change meanwhile.
        part = kept.with_name(f".{kept.name}.part")
        try:
            shutil.copyfile(wheel, part)
        except OSError as exc:
            raise ConfigError(f"cannot read {wheel}: {exc.strerror}") from exc
        try:
            return self._add_kept(part, kept, name, version)
        finally:
            part.unlink(missing_ok=True)

    def _add_kept(self, part: Path, kept: Path, name: str, version: str) -> CachedPackage:
        sha = sha256_file(part)
        lock = self._read_lock()
        old = self._package(name, lock[name]) if name in lock else None
        if old and old.sha256 == sha and self._intact(old):
            return old  # the same wheel again: nothing to do
        if old and old.sha256 != sha and version_key(old.version) == version_key(version):
            raise ConfigError(
                f"{kept.name} has sha256 {sha[:12]}..., but the lock recorded {old.sha256[:12]}"
                f"... for {name} {version}; if the change is expected, run `sandcell packages "
                f"remove {name}` first"
            )
        staging = Path(tempfile.mkdtemp(dir=self.root / "site", prefix=".extract-"))
        try:
            meta = extract(part, staging, name, version, shown=kept.name)
            for other, entry in lock.items():
                clash = set(meta[0]) & set(self._package(other, entry).imports)
                if other != name and clash:
                    raise ConfigError(
                        f"{kept.name} provides {', '.join(sorted(clash))}, already provided by "
                        f"cached package {other}; remove one of them"
                    )
            final = self.root / "site" / f"{name}-{version}"
            shutil.rmtree(final, ignore_errors=True)  # a leftover of an interrupted add
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        os.replace(part, kept)
        imports, requires, requires_if = meta
        lock[name] = {
            "version": version,
            "wheel": kept.name,
            "sha256": sha,
            "imports": list(imports),
            "requires": list(requires),
            "requires_if": list(requires_if),
            "extracted": f"site/{final.name}",
        }
        self._write_lock(lock)
        if old and old.path != final:  # an upgrade: old files go once the lock drops them
            shutil.rmtree(old.path, ignore_errors=True)
            if old.wheel != kept.name:
                (self.root / "wheels" / old.wheel).unlink(missing_ok=True)
        return self._package(name, lock[name])


def _parse_pin(requirement: str) -> tuple[str, str, str]:
    m = _PIN.fullmatch(re.sub(r"\s+", "", requirement))
    if not m:
        raise ConfigError(
            f"{requirement!r} is not pinned: pin it to one version, as NAME==VERSION (extras, "
            "ranges and URLs are refused, so the cache holds exactly what was reviewed)"
        )
    return normalize_name(m.group(1)), m.group(2), f"{m.group(1)}=={m.group(2)}"


def _pip_download(requirement: str, dest: Path, python: str) -> Path:
    cmd = [python, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--no-input"]
    cmd += ["--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest)]
    try:
        proc = subprocess.run(
            [*cmd, requirement],
            capture_output=True,
            text=True,
            timeout=_PIP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"pip download {requirement} took over {_PIP_TIMEOUT_S}s") from exc
    except OSError as exc:
        raise ConfigError(f"cannot start {python} -m pip: {exc}") from exc
    if proc.returncode != 0:
        out = (proc.stderr + proc.stdout).strip()
        tail = " | ".join(out.splitlines()[-4:])
        if "No module named pip" in out:
            raise ConfigError(f"{python} has no pip; install it there (python -m ensurepip)")
        if _NETWORK_TROUBLE.search(out):
            raise InfraError(f"pip could not reach the package index for {requirement}: {tail}")
        raise ConfigError(
            f"pip found no wheel of {requirement} for {python} ({tail}); pick a version that "
            "ships a wheel: building from source runs code, so sdists are never used"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise InfraError(f"pip download {requirement} left {len(wheels)} wheels, not one")
    return wheels[0]
