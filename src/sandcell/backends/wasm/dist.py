"""Pyodide on this host: fetched from the npm registry at install time, checked, never at run time.

``sandcell wasm install`` (:func:`install`) asks npm for the pinned package (``npm pack``: the
registry npm is configured for, its cache), checks the tarball against the pinned SHA-512 (the
registry's own ``integrity``), unpacks it, and makes Pyodide's memory snapshot (the interpreter
loaded with the modules most programs import), so a run restores memory instead of starting
CPython. A run reads only what :func:`find` returns, after checking that the manifest's version is
the pinned one; nothing is fetched then. The files live, like the microVM's image, in a directory
every user of the host can read::

    $SANDCELL_WASM_DIR, else /var/lib/sandcell/wasm for root or when it exists (root's install),
    else ~/.local/share/sandcell/wasm
        pyodide-<version>/   the package's files, snapshot.bin, manifest.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from sandcell.errors import IsolationUnavailable
from sandcell.packages import npm

PYODIDE_VERSION = "0.29.3"
PYODIDE_INTEGRITY = (
    "sha512-22UBuhOJawj7vKUnS7/F3xK+515LJdjiMAHoCfuS6/PbHiOrSQVnYwDe+2sbVwiOZ3sMMexdXICew6NqOMQGgA"
    "=="
)
"""npm's ``dist.integrity`` of ``pyodide@0.29.3``: the tarball is refused unless it matches."""
PYTHON_VERSION = "3.13.2"
"""The CPython that Pyodide 0.29.3 is a build of."""

SYSTEM_DIR = Path("/var/lib/sandcell/wasm")
NODE_MIN_MAJOR = 20
"""Node's permission model (``--experimental-permission``), which the rung relies on, is 20's."""
_NEEDED = ("pyodide.mjs", "pyodide.asm.js", "pyodide.asm.wasm", "python_stdlib.zip")
_SNAPSHOT = "snapshot.bin"
_MANIFEST = "manifest.json"
_INSTALL_FIX = "run: sandcell wasm install (fetches the pinned Pyodide through npm, once)"

# Imported before the snapshot is taken: a run that imports them finds them loaded.
SNAPSHOT_IMPORTS = (
    "json", "re", "math", "collections", "itertools", "functools", "traceback", "linecache",
    "typing", "dataclasses", "string", "random", "heapq", "bisect", "statistics", "fractions",
    "decimal", "datetime", "operator", "copy", "hashlib", "textwrap", "csv", "io",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PyodideDist:
    """An installed, checked Pyodide."""

    directory: Path
    version: str
    python: str
    snapshot: Path | None
    node: str
    node_version: str

    def describe(self) -> str:
        return (
            f"Pyodide {self.version} (CPython {self.python}) on Node.js {self.node_version} "
            f"({self.node})"
        )


def wasm_dir() -> Path:
    explicit = os.environ.get("SANDCELL_WASM_DIR")
    if explicit:
        return Path(explicit)
    if SYSTEM_DIR.is_dir() or os.geteuid() == 0:
        return SYSTEM_DIR
    return platformdirs.user_data_path("sandcell") / "wasm"


def dist_dir(base: Path | None = None) -> Path:
    return (base or wasm_dir()) / f"pyodide-{PYODIDE_VERSION}"


def find_node() -> tuple[str, str]:
    """(path, version) of the Node.js the rung runs, or IsolationUnavailable with the fix."""
    path = shutil.which("node") or shutil.which("nodejs")
    fix = f"install Node.js >= {NODE_MIN_MAJOR} (Debian: apt-get install nodejs)"
    if path is None:
        raise IsolationUnavailable("wasm", "Node.js is not installed", fix)
    path = os.path.realpath(path)
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise IsolationUnavailable("wasm", f"{path} --version failed: {exc}", fix) from exc
    try:
        major = int(out.lstrip("v").split(".")[0])
    except ValueError:
        raise IsolationUnavailable("wasm", f"{path} printed {out!r} as its version", fix) from None
    if major < NODE_MIN_MAJOR:
        raise IsolationUnavailable(
            "wasm", f"Node.js {out} at {path} has no permission model (needs 20 or later)", fix
        )
    if not path.startswith("/usr/"):
        # The sandbox shows the host's /usr read-only and nothing else of the host's programs.
        raise IsolationUnavailable(
            "wasm",
            f"Node.js at {path} is outside /usr, which the sandbox cannot show",
            "install Node.js under /usr (Debian: apt-get install nodejs)",
        )
    return path, out


def find(base: Path | None = None) -> PyodideDist:
    """The installed Pyodide, checked against the pin; IsolationUnavailable with the fix."""
    node, node_version = find_node()
    d = dist_dir(base)
    manifest_path = d / _MANIFEST
    if not manifest_path.is_file():
        raise IsolationUnavailable(
            "wasm", f"Pyodide {PYODIDE_VERSION} is not installed in {d}", _INSTALL_FIX
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise IsolationUnavailable(
            "wasm", f"{manifest_path} is unreadable: {exc}", _INSTALL_FIX
        ) from exc
    if manifest.get("version") != PYODIDE_VERSION or manifest.get("integrity") != PYODIDE_INTEGRITY:
        raise IsolationUnavailable(
            "wasm",
            f"{d} holds Pyodide {manifest.get('version')!r}, not the pinned {PYODIDE_VERSION}",
            _INSTALL_FIX,
        )
    missing = [n for n in _NEEDED if not (d / n).is_file()]
    if missing:
        raise IsolationUnavailable("wasm", f"{d} lacks {', '.join(missing)}", _INSTALL_FIX)
    snapshot = d / _SNAPSHOT
    usable = snapshot.is_file() and manifest.get("snapshot_node") == node_version
    return PyodideDist(
        directory=d,
        version=PYODIDE_VERSION,
        python=PYTHON_VERSION,
        snapshot=snapshot if usable else None,
        node=node,
        node_version=node_version,
    )


def make_snapshot(directory: Path, node: str) -> Path:
    """Pyodide's memory snapshot, made by this host's Node (outside any sandbox: no program runs
    in it, only Pyodide's own start and the imports of :data:`SNAPSHOT_IMPORTS`)."""
    out = directory / _SNAPSHOT
    script = (
        f"import {{ loadPyodide }} from {json.dumps(str(directory / 'pyodide.mjs'))};\n"
        "import fs from 'node:fs';\n"
        f"const py = await loadPyodide({{ indexURL: {json.dumps(str(directory) + '/')}, "
        "_makeSnapshot: true });\n"
        f"py.runPython({json.dumps('import ' + ', '.join(SNAPSHOT_IMPORTS))});\n"
        f"fs.writeFileSync({json.dumps(str(out) + '.tmp')}, py.makeMemorySnapshot());\n"
    )
    proc = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise IsolationUnavailable(
            "wasm",
            f"Pyodide's snapshot could not be made: {proc.stderr.strip()[-800:]}",
            _INSTALL_FIX,
        )
    os.replace(f"{out}.tmp", out)
    out.chmod(0o644)
    return out


def _make_readable_dirs(path: Path) -> None:
    """``path`` and its missing parents, each 0755 whatever the umask: root installs for every
    user of the host (the tests' unprivileged user included), and a run reads these files."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        d.chmod(0o755)


def install(base: Path | None = None) -> PyodideDist:
    """Fetch, check and unpack the pinned Pyodide, and make its snapshot (idempotent)."""
    node, node_version = find_node()
    target = dist_dir(base)
    with tempfile.TemporaryDirectory(prefix="sandcell-pyodide-") as tmp:
        tarball = npm.pack("pyodide", PYODIDE_VERSION, Path(tmp), layer="wasm")
        npm.check_integrity(tarball, PYODIDE_INTEGRITY, layer="wasm", what="Pyodide")
        staging = target.with_name(f"{target.name}.new")
        shutil.rmtree(staging, ignore_errors=True)
        _make_readable_dirs(staging)
        with tarfile.open(tarball) as tf:
            for member in tf.getmembers():
                if not member.isfile() or not member.name.startswith("package/"):
                    continue
                rel = member.name.removeprefix("package/")
                if "/" in rel:  # the package's files are all at its top level
                    continue
                src = tf.extractfile(member)
                assert src is not None
                (staging / rel).write_bytes(src.read())
                (staging / rel).chmod(0o644)
        make_snapshot(staging, node)
        (staging / _MANIFEST).write_text(
            json.dumps(
                {
                    "version": PYODIDE_VERSION,
                    "integrity": PYODIDE_INTEGRITY,
                    "python": PYTHON_VERSION,
                    "snapshot_node": node_version,
                    "snapshot_imports": list(SNAPSHOT_IMPORTS),
                },
                indent=1,
            )
        )
        (staging / _MANIFEST).chmod(0o644)
        staging.chmod(0o755)
        old = target.with_name(f"{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    target.parent.chmod(0o755)
    return find(base)
