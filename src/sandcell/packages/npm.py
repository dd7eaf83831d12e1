"""An npm package's tarball, fetched at install time and checked against a pinned integrity.

``npm pack <name>@<version>`` asks the registry npm is configured for (its mirror, its cache,
its proxy settings) for the exact tarball; the bytes are then checked here against the SHA-512
the pin carries (the registry's own ``dist.integrity``, in Subresource Integrity form), so
neither the registry nor the cache can change what is installed. Used by ``sandcell wasm
install`` (Pyodide) and ``sandcell runtime build node`` (Node.js). Nothing is fetched at run time.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from pathlib import Path

from sandcell.errors import IsolationUnavailable

__all__ = ["check_integrity", "integrity_of", "pack"]


def integrity_of(path: Path, algo: str = "sha512") -> str:
    """``<algo>-<base64 digest>`` of a file: npm's form of a tarball's hash."""
    digest = hashlib.new(algo)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"{algo}-{base64.b64encode(digest.digest()).decode()}"


def check_integrity(tarball: Path, integrity: str, *, layer: str, what: str) -> None:
    """Refuse ``tarball`` unless it hashes to the pinned ``integrity``."""
    algo, _, _ = integrity.partition("-")
    got = integrity_of(tarball, algo)
    if got != integrity:
        raise IsolationUnavailable(
            layer,
            f"the {what} tarball's {algo} is {got.partition('-')[2]}, not the pinned "
            f"{integrity.partition('-')[2]}; refused, nothing was installed",
            "check the npm registry npm is configured for (npm config get registry)",
        )


def pack(name: str, version: str, into: Path, *, layer: str) -> Path:
    """The tarball of ``name@version``, written into ``into`` by ``npm pack`` (not yet checked)."""
    npm = shutil.which("npm")
    if npm is None:
        raise IsolationUnavailable(
            layer, "npm is not installed", "install npm (Debian: apt-get install npm)"
        )
    spec = f"{name}@{version}"
    proc = subprocess.run(
        [npm, "pack", spec, "--pack-destination", str(into), "--silent"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=into,
    )
    # npm names a scoped package's tarball without its '@' and with '-' for the '/'.
    tarball = into / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if proc.returncode != 0 or not tarball.is_file():
        raise IsolationUnavailable(
            layer,
            f"npm pack {spec} failed: {proc.stderr.strip()[-500:]}",
            "check that npm reaches its registry (npm ping)",
        )
    return tarball
