"""Reading and unpacking one wheel safely: the checks on its entries, its extraction into an
empty directory, its ``RECORD`` and ``METADATA``, and the comparison of an extracted tree with the
``RECORD`` it came with. :mod:`sandcell.packages` uses it for the cache, its lock and resolution.

The threat
----------
A wheel is a zip archive from a package index, or a file someone handed over, and nothing in it is
trusted until checked. A hostile or broken one can hold absolute paths or ``..`` components that
climb out of the directory it is unpacked into, symbolic links, special files and duplicate
entries; unpack to far more files or bytes than it is (a zip bomb); carry files its ``RECORD``
does not list or whose hash does not match; or say in ``METADATA`` that it is another
distribution than the one asked for. Once extracted, the tree stays on disk between runs, where
it may be changed.

The rules
---------
Every entry is checked before anything is written (:func:`extract`), so an unsafe wheel leaves
nothing behind. Only the importable part is extracted (top-level packages and modules, the
``.dist-info``, the purelib/platlib of ``.data``), each file created anew without following links
and hashed against ``RECORD``; ``METADATA`` must name the pin asked for. :func:`tree_problems`
compares an extracted tree with the kept wheel's ``RECORD``, so a file added, changed, removed or
turned into a symbolic link is reported.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import stat
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from sandcell.errors import ConfigError

_MODULE_SUFFIXES = (".py", ".so", ".pyd")
_MAX_ENTRIES = 50_000
_MAX_UNPACKED_BYTES = 512 * 1024 * 1024
"""A wheel unpacking to more is refused (zip bombs; the add-ons a run needs are small)."""


def normalize_name(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(version: str) -> str:
    """A version in a form where ``1.0`` equals ``1.0.0`` and ``V1.0`` equals ``1.0``."""
    v = version.strip().lower().removeprefix("v")
    m = re.match(r"(\d+(?:\.\d+)*)(.*)", v)
    if not m:
        return v
    release = [str(int(x)) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == "0":
        release.pop()
    return ".".join(release) + m.group(2)


def wheel_name(filename: str) -> tuple[str, str]:
    parts = filename.removesuffix(".whl").split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise ConfigError(f"{filename!r} is not a wheel file name (NAME-VERSION-...-TAG.whl)")
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.!+_]*", parts[1]):
        raise ConfigError(f"{filename!r} has an unusual version {parts[1]!r}")
    return normalize_name(parts[0]), parts[1]


def _record_digest(data_sha256: bytes) -> str:
    """A digest as a wheel's RECORD writes it: ``sha256=`` urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(data_sha256).rstrip(b"=").decode()


def module_of(filename: str) -> str | None:
    """The module a top-level file provides (``six.py`` -> ``six``), None if it is not one."""
    stem, dot, _ = filename.partition(".")
    ok = dot and stem.isidentifier() and not stem.startswith("__")
    return stem if ok and filename.endswith(_MODULE_SUFFIXES) else None


def _target(parts: Sequence[str]) -> list[str] | None:
    """Where a wheel path goes in the extracted tree, or None when it is not importable: only
    top-level packages and modules and the ``.dist-info``; of ``.data`` only purelib/platlib
    (scripts, headers and data would land outside site-packages, so they are left out)."""
    parts = list(parts)
    if parts[0].endswith(".data"):
        if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
            return None
        parts = parts[2:]
    first = parts[0]
    if len(parts) > 1:
        package = first.isidentifier() and not first.startswith("__")
        return parts if first.endswith(".dist-info") or package else None
    return parts if module_of(first) else None


def _imports_from_paths(paths: Iterable[str]) -> set[str]:
    """Top-level import names provided by the files listed in a RECORD."""
    names: set[str] = set()
    for path in paths:
        parts = path.split("/")
        if not parts[0] or ".." in parts:
            continue  # console scripts and the like, recorded relative to site-packages
        mapped = _target(parts)
        if mapped is None or mapped[0].endswith(".dist-info"):
            continue
        names.add(mapped[0] if len(mapped) > 1 else (module_of(mapped[0]) or ""))
    names.discard("")
    return names


def _record_rows(text: str) -> list[list[str]]:
    return [row for row in csv.reader(text.splitlines()) if row]


def dist_imports(dist_info: Path) -> set[str]:
    """Import names of an installed or extracted distribution: top_level.txt, else RECORD."""
    top = dist_info / "top_level.txt"
    if top.is_file():
        lines = top.read_text(encoding="utf-8", errors="replace").split()
        return {n.split(".")[0] for n in lines if n.split(".")[0].isidentifier()}
    record = dist_info / "RECORD"
    if not record.is_file():
        return set()
    return _imports_from_paths(row[0] for row in _record_rows(record.read_text("utf-8")))


_HEADERS_END = re.compile(r"\r?\n\r?\n")


def read_metadata(dist_info: Path) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """Name, version, unconditional requirements and marker-gated ones, from METADATA."""
    # Imported here: the email package costs every command line run a few milliseconds, and
    # metadata is read only when a run imports something outside the standard library.
    from email.parser import HeaderParser

    text = (dist_info / "METADATA").read_text(encoding="utf-8", errors="replace")
    # The headers end at the first empty line; what follows is the long description, which
    # the parser would otherwise walk line by line (most of a warm executor's start, reading
    # the ~400 distributions of a data-science runtime: bench/PROFILE.md).
    msg = HeaderParser().parsestr(_HEADERS_END.split(text, maxsplit=1)[0] + "\n")
    required: list[str] = []
    conditional: list[str] = []
    for value in msg.get_all("Requires-Dist") or []:
        req, _, marker = str(value).partition(";")
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if not m or "extra" in marker:
            continue  # extras are asked for by name; a plain pin never pulls them in
        (conditional if marker.strip() else required).append(normalize_name(m.group(1)))
    name, version = str(msg.get("Name", "")), str(msg.get("Version", ""))
    return name, version, tuple(required), tuple(conditional)


def _entry_problem(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    mode = info.external_attr >> 16
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "an absolute path"
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        return "a path climbing out with '..'"
    if "\\" in name or "\0" in name or any(p in ("", ".") for p in parts):
        return "a malformed path"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "a special file"
    return None


def extract(
    wheel: Path, dest: Path, name: str, version: str, *, shown: str
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Extract the importable part of ``wheel`` (called ``shown`` in messages) into the empty
    directory ``dest``; return its import names and requirements. Every entry is checked before
    anything is written, so an unsafe wheel leaves nothing behind (the caller removes ``dest``).
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{shown} is not a readable wheel: {exc}") from exc
    with zf:
        infos = zf.infolist()
        if len(infos) > _MAX_ENTRIES or sum(i.file_size for i in infos) > _MAX_UNPACKED_BYTES:
            raise ConfigError(f"{shown} unpacks to too many files or bytes; refused")
        seen: set[str] = set()
        for info in infos:
            problem = _entry_problem(info)
            if problem is None and info.filename in seen:
                problem = "a duplicate entry"
            if problem:
                raise ConfigError(
                    f"{shown} holds {problem} ({info.filename!r}); refused, nothing extracted"
                )
            seen.add(info.filename)
        dist_infos = {
            i.filename.split("/")[0]
            for i in infos
            if i.filename.split("/")[0].endswith(".dist-info")
        }
        matching = [
            d
            for d in dist_infos
            if normalize_name(d.removesuffix(".dist-info").rsplit("-", 1)[0]) == name
        ]
        if len(matching) != 1:
            raise ConfigError(f"{shown} has no single .dist-info for {name}; refused")
        record_name = f"{matching[0]}/RECORD"
        try:
            rows = _record_rows(zf.read(record_name).decode("utf-8"))
        except (KeyError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{shown} has no readable RECORD; refused") from exc
        digests = {row[0]: row[1] if len(row) > 1 else "" for row in rows}
        for info in infos:
            parts = _target(info.filename.rstrip("/").split("/"))
            if info.is_dir() or parts is None or info.filename.startswith(f"{record_name}."):
                continue  # not importable, or RECORD's signature (not hashed by RECORD itself)
            if info.filename not in digests and info.filename != record_name:
                # verify() compares the tree with RECORD: everything in it must be listed there.
                raise ConfigError(f"{shown}: {info.filename} is not listed in its RECORD")
            out = dest.joinpath(*parts)
            h = hashlib.sha256()
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                with os.fdopen(os.open(out, flags, 0o644), "wb") as f, zf.open(info) as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        h.update(chunk)
                        f.write(chunk)
            except (OSError, zipfile.BadZipFile) as exc:
                raise ConfigError(f"{shown}: cannot extract {info.filename!r}: {exc}") from exc
            expected = digests.get(info.filename, "")
            if expected.startswith("sha256=") and expected != _record_digest(h.digest()):
                raise ConfigError(f"{shown}: {info.filename} does not match its RECORD hash")
    if not (dest / matching[0] / "METADATA").is_file():
        raise ConfigError(f"{shown} has no METADATA; refused")
    meta_name, meta_version, requires, requires_if = read_metadata(dest / matching[0])
    if (normalize_name(meta_name), version_key(meta_version)) != (name, version_key(version)):
        raise ConfigError(f"{shown} says it is {meta_name} {meta_version}; refused")
    imports = dist_imports(dest / matching[0]) or _imports_from_paths(r[0] for r in rows)
    for root, dirs, _ in os.walk(dest):  # readable by the sandbox user, whatever the umask
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)  # noqa: S103 (public code, read-only mount)
    dest.chmod(0o755)
    return tuple(sorted(imports)), requires, requires_if


def wheel_record(wheel: Path) -> str | None:
    """The RECORD inside a wheel file, None if it has none."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
            return zf.read(names[0]).decode("utf-8") if len(names) == 1 else None
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def tree_problems(tree: Path, record: str | None = None) -> list[str]:
    """How an extracted tree differs from ``record`` (the kept wheel's RECORD, which the lock's
    hash covers), or else from the RECORD of the tree's own ``.dist-info``."""
    if not tree.is_dir():
        return [f"{tree} is missing"]
    dist_infos = sorted(tree.glob("*.dist-info"))
    if len(dist_infos) != 1 or not (dist_infos[0] / "RECORD").is_file():
        return [f"{tree} has no single .dist-info with a RECORD"]
    if record is None:
        record = (dist_infos[0] / "RECORD").read_text("utf-8", errors="replace")
    expected = {f"{dist_infos[0].name}/RECORD": ""}
    for row in _record_rows(record):
        parts = _target(row[0].split("/")) if row[0] and ".." not in row[0].split("/") else None
        if parts is not None:
            expected["/".join(parts)] = row[1] if len(row) > 1 else ""
    problems: list[str] = []
    for root, _, files in os.walk(tree):
        for file in files:
            path = Path(root, file)
            rel = path.relative_to(tree).as_posix()
            digest = expected.pop(rel, None)
            if digest is None:
                problems.append(f"{rel} is not in its RECORD")
            elif path.is_symlink():
                problems.append(f"{rel} became a symbolic link")
            elif digest and digest != _record_digest(hashlib.sha256(path.read_bytes()).digest()):
                problems.append(f"{rel} was changed after extraction")
    problems += [f"{rel} is missing" for rel in sorted(expected)]
    return problems
