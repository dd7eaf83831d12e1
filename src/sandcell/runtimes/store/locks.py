"""Runtime lock files: which packages, at which versions, with which wheel hashes.

A lock is a pip requirements file with ``name==version`` pins and ``--hash`` options (the form
``pip-compile --generate-hashes`` writes), read as data here and handed whole to pip at build
time with ``--require-hashes``. sandcell ships three (``locks/*.txt``): ``minimal``, ``analysis``
and ``datascience``; a user's own lock is any such file, named after its stem.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sandcell.errors import ConfigError

__all__ = ["SHIPPED", "Lock", "Pin", "load_lock", "shipped_lock"]

SHIPPED = ("minimal", "analysis", "datascience")
"""The locks that come with sandcell, smallest first."""
NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Lock:
    name: str
    source: str
    """``builtin:<name>`` for a shipped lock, else the file's absolute path."""
    text: str
    sha256: str
    """Of the text: the lock a runtime was built from, as its record names it."""
    pins: tuple[Pin, ...]


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"{name!r} is not a runtime name; use lowercase letters, digits, '-' and '_' "
            "(at most 40, starting with a letter), for example: datascience"
        )
    return name


def parse(name: str, source: str, text: str) -> Lock:
    """A lock from its text; every pin must be exact and carry at least one sha256 hash."""
    pins: list[Pin] = []
    # Continuation lines belong to the requirement above them.
    logical = re.sub(r"\\\n", " ", text)
    for number, raw in enumerate(logical.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line or line.startswith("--only-binary") or line.startswith("--no-binary :none:"):
            continue
        if line.startswith("-"):
            raise ConfigError(
                f"runtime lock {source}: line {number} is the pip option {line.split()[0]!r}; a "
                "lock holds only 'name==version --hash=sha256:...' pins (index options belong in "
                "pip's own configuration)"
            )
        m = _PIN.match(line)
        hashes = tuple(_HASH.findall(line))
        if m is None or not hashes:
            raise ConfigError(
                f"runtime lock {source}: {line[:60]!r} is not an exact pin with hashes; write "
                "'name==version --hash=sha256:<hex>' (pip-compile --generate-hashes does)"
            )
        pins.append(Pin(m.group(1).lower().replace("_", "-"), m.group(2), hashes))
    names = [p.name for p in pins]
    if len(set(names)) != len(names):
        raise ConfigError(f"runtime lock {source}: a package is pinned twice")
    return Lock(
        name=check_name(name),
        source=source,
        text=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        pins=tuple(pins),
    )


def shipped_lock(name: str) -> Lock:
    if name not in SHIPPED:
        raise ConfigError(
            f"sandcell ships no runtime lock {name!r}; choose one of {', '.join(SHIPPED)}, or "
            "pass your own with --lock FILE"
        )
    text = resources.files("sandcell.runtimes.store").joinpath(f"locks/{name}.txt").read_text()
    return parse(name, f"builtin:{name}", text)


def load_lock(path: Path, name: str | None = None) -> Lock:
    """A user's lock file; the runtime is named after the file's stem unless ``name`` says."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the runtime lock {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the runtime lock {path} is not UTF-8 text") from None
    stem = path.name.removesuffix(".txt").removesuffix(".lock")
    return parse(name or stem, str(path.resolve()), text)
