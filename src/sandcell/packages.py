"""Packages beyond the runtime: a local wheel cache prepared ahead of time, and the resolution of
a run's imports against the runtime, that cache and the profile's ``allowed_packages``.

Installing a package is running code, so nothing is installed while a run runs. The runtime's
own packages are pinned (:func:`write_runtime_lock` records them, :func:`check_runtime_lock`
reports drift). A package outside the runtime is added ahead of time, on the host, where the
network is allowed: :meth:`WheelCache.prepare` downloads the wheel of an exact pin (never an
sdist: building one runs its code), hashes it, checks it names what was asked for, extracts its
importable part into its own directory and records it in ``lock.json``. A run that imports it
gets that directory mounted read-only, only if its profile lists the package; any other import
of something absent is denied with a ``py.package`` finding (:func:`resolve_packages`).

Reading and unpacking one wheel safely (entry checks, extraction, ``RECORD`` and ``METADATA``)
is :mod:`sandcell._wheels`'s job; this module keeps the cache, its lock and resolution.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandcell._wheels import (
    _dist_imports,
    _extract,
    _metadata,
    _module_of,
    _tree_problems,
    _version_key,
    _wheel_name,
    _wheel_record,
    normalize_name,
)
from sandcell.errors import ConfigError, InfraError
from sandcell.policy.checks.findings import Finding, snippet_of

__all__ = [
    "CachedPackage",
    "Resolution",
    "WheelCache",
    "check_runtime_lock",
    "imports_of",
    "normalize_name",
    "resolve_packages",
    "runtime_distributions",
    "runtime_imports",
    "write_runtime_lock",
]

_PIN = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([0-9A-Za-z][0-9A-Za-z.!+_]*)")
_PIP_TIMEOUT_S = 600
_SITE_DIRS = ("site-packages", "dist-packages")  # the latter: Debian's system Python
_NETWORK_TROUBLE = re.compile(
    r"NewConnectionError|Max retries exceeded|Failed to establish|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|ProxyError|SSLError|timed out",
    re.IGNORECASE,
)


def _sha256_file(path: Path) -> str:
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
            from sandcell.executor import data_dir  # the executor imports this module

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
            elif _sha256_file(wheel) != p.sha256:
                problems.append(f"{p.name} {p.version}: {wheel} no longer has its sha256; {fix}")
            else:
                record = _wheel_record(wheel)
            found = _tree_problems(p.path, record)
            problems += [f"{p.name} {p.version}: {s}; {fix}" for s in found]
        return problems

    def _intact(self, pkg: CachedPackage) -> bool:
        wheel = self.root / "wheels" / pkg.wheel
        ok = wheel.is_file() and _sha256_file(wheel) == pkg.sha256
        return ok and not _tree_problems(pkg.path, _wheel_record(wheel))

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
                same = cached and _version_key(cached.version) == _version_key(version)
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
        name, version = _wheel_name(wheel.name)
        if expect and (name, _version_key(version)) != (expect[0], _version_key(expect[1])):
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
        sha = _sha256_file(part)
        lock = self._read_lock()
        old = self._package(name, lock[name]) if name in lock else None
        if old and old.sha256 == sha and self._intact(old):
            return old  # the same wheel again: nothing to do
        if old and old.sha256 != sha and _version_key(old.version) == _version_key(version):
            raise ConfigError(
                f"{kept.name} has sha256 {sha[:12]}..., but the lock recorded {old.sha256[:12]}"
                f"... for {name} {version}; if the change is expected, run `sandcell packages "
                f"remove {name}` first"
            )
        staging = Path(tempfile.mkdtemp(dir=self.root / "site", prefix=".extract-"))
        try:
            meta = _extract(part, staging, name, version, shown=kept.name)
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


# -- the runtime --------------------------------------------------------------------------------


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
                name, version, _, _ = _metadata(dist_info)
                found.setdefault(normalize_name(name), (version, dist_info))
    return found


@functools.cache
def _runtime_distribution_names() -> frozenset[str]:
    # The runtime is read-only while sandcell runs: read its metadata once per process.
    return frozenset(runtime_distributions())


@functools.cache
def runtime_imports() -> frozenset[str]:
    """Top-level names importable in the default runtime: the standard library, what each
    distribution declares (top_level.txt or RECORD) and the modules in site-packages. Computed
    once per process: the runtime's site-packages are read-only while sandcell runs."""
    names = set(sys.stdlib_module_names)
    for _, dist_info in runtime_distributions().values():
        names |= _dist_imports(dist_info)
    for site in _runtime_site_dirs():
        for entry in site.iterdir():
            is_package = entry.is_dir() and entry.name.isidentifier()
            if is_package and not entry.name.startswith("__"):
                names.add(entry.name)
            elif entry.is_file() and (module := _module_of(entry.name)):
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
    return _sha256_file(record) if record.is_file() else "-"


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


# -- a run's imports ----------------------------------------------------------------------------


def _import_sites(code: str) -> dict[str, tuple[int, int, str]]:
    """Top-level module -> (line, column, snippet) of its first import in ``code``."""
    try:
        tree = ast.parse(code)
        nodes = list(ast.walk(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    lines = code.splitlines()
    sites: dict[str, tuple[int, int, str]] = {}

    def add(module: str, node: ast.stmt | ast.expr) -> None:
        top = module.split(".", 1)[0]
        if not top.isidentifier():
            return  # a relative import_module(".x") or a non-name
        text = lines[node.lineno - 1] if 0 < node.lineno <= len(lines) else ""
        # ast columns are UTF-8 byte offsets; findings count characters.
        col = len(text.encode()[: node.col_offset].decode(errors="replace")) + 1
        if top not in sites or (node.lineno, col) < sites[top][:2]:
            sites[top] = (node.lineno, col, snippet_of(text))

    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            add(node.module, node)
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            called = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
            value = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
            if called in ("import_module", "__import__") and isinstance(value, str):
                add(value, node)
    return sites


def imports_of(code: str) -> frozenset[str]:
    """Top-level modules that Python ``code`` imports: ``import``, ``from ... import`` (not
    relative ones) and ``importlib.import_module``/``__import__`` of a constant name. Code that
    does not parse imports nothing (the checks report the syntax error)."""
    return frozenset(_import_sites(code))


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a run gets from the wheel cache, and what is denied."""

    paths: tuple[Path, ...]
    """Extracted directories to mount read-only and put on ``sys.path``, in name order."""
    packages: tuple[CachedPackage, ...]
    findings: tuple[Finding, ...]
    """``py.package`` denials: imports neither in the runtime nor allowed from the cache."""


def resolve_packages(
    code_imports: Collection[str],
    *,
    allowed_packages: Collection[str],
    cache: WheelCache,
    code: str = "",
    local: Collection[str] = (),
) -> Resolution:
    """Resolve a run's top-level imports: the standard library and the runtime need nothing;
    a cached package listed in ``allowed_packages`` is mounted, with the cached packages it
    requires; anything else is a ``deny`` finding. ``code``, when given, places the findings
    on the import lines; ``local`` names modules the run brings itself (its own input files).
    """
    allowed = {normalize_name(p) for p in allowed_packages}
    known = runtime_imports() | set(local)
    if set(code_imports) <= known:
        # The common case, on every run: nothing to look up in the cache.
        return Resolution(paths=(), packages=(), findings=())
    in_runtime = _runtime_distribution_names()
    cached = {p.name: p for p in cache.packages()}
    by_import = {i: p for p in cached.values() for i in p.imports}
    sites = _import_sites(code) if code else {}
    used: dict[str, CachedPackage] = {}
    findings: list[Finding] = []

    def deny(module: str, message: str) -> None:
        line, column, snippet = sites.get(module, (1, 1, ""))
        findings.append(Finding("py.package", "deny", line, column, message, snippet))

    def use(pkg: CachedPackage, module: str) -> None:
        used[pkg.name] = pkg
        for dep in (*pkg.requires, *pkg.requires_if):
            if dep in used or dep in in_runtime:
                continue
            if dep in cached and dep in allowed:
                use(cached[dep], module)
            elif dep in pkg.requires:
                where = "is in the wheel cache but not in" if dep in cached else "is not in"
                deny(module, f"package {pkg.name} needs {dep}, which {where} this profile's "
                     f"allowed_packages or the cache; add it with `sandcell packages add "
                     f"{dep}==VERSION` and allow it in the profile")  # fmt: skip

    for module in sorted(set(code_imports)):
        pkg = by_import.get(module)
        if module in known or (pkg is not None and pkg.name in used):
            continue
        if pkg is None:
            deny(module, f"{module} is not in the runtime or the wheel cache; nothing is "
                 "installed at run time: prepare it ahead of time with `sandcell packages add "
                 f"{module}==VERSION` and allow it in the profile")  # fmt: skip
        elif pkg.name not in allowed:
            deny(module, f"package {pkg.name} is in the wheel cache but not in this profile's "
                 "allowed_packages; add it to the profile or use one that allows it")  # fmt: skip
        else:
            use(pkg, module)
    chosen = tuple(used[n] for n in sorted(used))
    return Resolution(tuple(p.path for p in chosen), chosen, tuple(findings))
