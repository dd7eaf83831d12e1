"""``sandcell runtime build``: install a lock into a new tree, hash it, store it by its hash.

The packages are installed by pip (the only step that needs an index: the build is the install
step, never a run) with ``--require-hashes --no-deps --only-binary :all:`` into a staging
directory shaped like a virtual environment's ``lib/python3.X/site-packages``. Then the tree is
made neutral and reproducible:

* console scripts are dropped (their ``#!`` line names the staging path; programs run modules);
* every module is compiled here, with the path it has inside the sandbox
  (``/opt/sandcell/venv/lib/...``) and hash-based, unchecked invalidation: a sandbox cannot write
  bytecode (read-only mount), so without it every import would compile again, and a timestamp
  would make two builds differ;
* modes become read-only (files ``0444``, ``0555`` where executable, directories ``0555``).

The tree is hashed (``tree.summarize``) and renamed to ``sha256/<hash>``; a tree of that hash that
is already there is kept and the new one dropped, so a rebuild from the same wheels changes
nothing. The name then points at the hash (written aside and renamed: a process reading it sees
the old runtime or the new one).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sandcell.errors import ConfigError, InfraError
from sandcell.packages.wheels import dist_imports, module_of, normalize_name, read_metadata
from sandcell.runtimes.store.locks import Lock
from sandcell.runtimes.store.store import FORMAT, RuntimeManifest, StoredRuntime, python_tag
from sandcell.runtimes.store.tree import TreeSummary, summarize
from sandcell.runtimes.view import SANDBOX_VENV

__all__ = ["build", "open_staging", "read_only", "remove_tree", "store_staged"]

Progress = Callable[[str], None]


def _site_rel() -> str:
    return f"lib/python{python_tag()}/site-packages"


def _pip_install(lock: Lock, target: Path, pip_args: Sequence[str], say: Progress) -> None:
    if not lock.pins:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(lock.text)
        req = f.name
    argv = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
        "--no-deps", "--require-hashes", "--only-binary", ":all:", "--no-compile",
        "--no-warn-script-location", "--target", str(target), "-r", req, *pip_args,
    ]  # fmt: skip
    say(f"installing {len(lock.pins)} packages with pip (wheels only, hashes required) ...")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    finally:
        os.unlink(req)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise InfraError(
            f"pip could not install runtime {lock.name!r} from {lock.source}:\n{tail}\n"
            "The build needs the package index (or --find-links DIR with the wheels); nothing was "
            "stored."
        )


def _drop_scripts(target: Path) -> None:
    # pip --target puts console scripts in <target>/bin; their #! names the staging path.
    shutil.rmtree(target / "bin", ignore_errors=True)
    for cache in target.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


def _compile(target: Path) -> None:
    argv = [
        sys.executable, "-m", "compileall", "-q", "-q", "-j", "0",
        "--invalidation-mode", "unchecked-hash",
        "-s", str(target), "-p", f"{SANDBOX_VENV}/{_site_rel()}", str(target),
    ]  # fmt: skip
    # A file that does not compile (a template, a test fixture in Python 2 syntax) fails the
    # same way inside the sandbox; the rest is compiled, so the exit status is not an error.
    # Without PYTHONPYCACHEPREFIX: with it the bytecode would go there, not into the tree.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    subprocess.run(argv, capture_output=True, check=False, env={**env, "PYTHONHASHSEED": "0"})


def read_only(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                os.chmod(path, 0o555 if st.st_mode & 0o111 else 0o444)
        os.chmod(dirpath, 0o555)  # noqa: S103 - shared read-only code, every user mounts it


def _inventory(site: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    dists: dict[str, str] = {}
    names: set[str] = set()
    for dist_info in sorted(site.glob("*.dist-info")):
        if (dist_info / "METADATA").is_file():
            name, version, _, _ = read_metadata(dist_info)
            dists[normalize_name(name)] = version
            names |= dist_imports(dist_info)
    for entry in site.iterdir():
        if entry.is_dir() and entry.name.isidentifier() and not entry.name.startswith("__"):
            names.add(entry.name)
        elif entry.is_file() and (module := module_of(entry.name)):
            names.add(module)
    return dists, tuple(sorted(n for n in names if n not in sys.stdlib_module_names))


def build(
    lock: Lock, base: Path, *, pip_args: Sequence[str] = (), say: Progress = lambda _: None
) -> StoredRuntime:
    """Build ``lock`` into the store at ``base`` and point its name at the result."""
    staging = open_staging(base)
    try:
        site = staging / "tree" / _site_rel()
        site.mkdir(parents=True)
        _pip_install(lock, site, pip_args, say)
        _drop_scripts(site)
        say("compiling bytecode for the sandbox's paths ...")
        _compile(site)
        dists, imports = _inventory(site)
        missing = sorted({p.name for p in lock.pins} - set(dists))
        if missing:
            raise InfraError(f"pip did not install {', '.join(missing)} from {lock.source}")

        def manifest(summary: TreeSummary) -> RuntimeManifest:
            return RuntimeManifest(
                format=FORMAT,
                name=lock.name,
                lock_source=lock.source,
                lock_sha256=lock.sha256,
                python=python_tag(),
                implementation=f"{platform.python_implementation()} {platform.python_version()}",
                platform=f"{sys.platform}-{platform.machine()}",
                tree_sha256=summary.sha256,
                files=summary.files,
                size_bytes=summary.size_bytes,
                site_packages=_site_rel(),
                distributions=dists,
                imports=imports,
                built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            )

        return store_staged(base, staging, manifest, say)
    finally:
        remove_tree(staging)


def open_staging(base: Path) -> Path:
    """A new staging directory inside the store at ``base`` (made if missing), on the store's
    filesystem so that the finished tree is renamed into place. The caller builds ``tree`` in
    it, then calls :func:`store_staged`, and removes it (:func:`remove_tree`) either way."""
    try:
        for sub in ("sha256", "names"):
            (base / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the runtime store {base}: {exc.strerror}; build as root for the "
            "system-wide store, or set SANDCELL_RUNTIMES_DIR to a directory you own"
        ) from None
    if os.geteuid() == 0:
        base.chmod(0o755)
    return Path(tempfile.mkdtemp(prefix=".build-", dir=base))


def store_staged(
    base: Path,
    staging: Path,
    manifest_of: Callable[[TreeSummary], RuntimeManifest],
    say: Progress,
) -> StoredRuntime:
    """Make ``staging/tree`` read-only, hash it, store it by its hash with the manifest
    ``manifest_of`` gives for its summary, and point the manifest's name at it."""
    read_only(staging / "tree")
    say("hashing the tree ...")
    summary = summarize(staging / "tree")
    manifest = manifest_of(summary)
    final = base / "sha256" / summary.sha256
    if final.is_dir() and summarize(final).sha256 == summary.sha256:
        say("an identical tree is already stored; keeping it")
    else:
        if final.exists():
            # Stored under this hash but no longer hashing to it: changed since; replaced.
            # Moved aside first, never removed in place: a process looking the runtime up
            # meanwhile finds the changed tree (refused), no tree, or the new one, never a
            # half-removed one; a service's warm template sees the new directory
            # (runtime_store/stamp.py).
            say(f"the stored tree {final} was changed since it was built; replacing it")
            _move_dir(final, staging / "replaced")
        _move_dir(staging / "tree", final)
    _write_atomic(base / "sha256" / f"{summary.sha256}.json", manifest.to_json())
    pointer = f'{{"tree_sha256": "{summary.sha256}", "lock_sha256": "{manifest.lock_sha256}"}}\n'
    _write_atomic(base / "names" / f"{manifest.name}.json", pointer)
    return StoredRuntime(manifest, final)


def _move_dir(src: Path, dest: Path) -> None:
    """Rename a read-only directory to another parent: its ``..`` entry changes, which needs
    write permission on it for any user but root. Writable for the rename only (its mode is not
    part of the tree's hash)."""
    os.chmod(src, 0o755)  # noqa: S103 - shared read-only code, read-only again below
    os.rename(src, dest)
    os.chmod(dest, 0o555)  # noqa: S103 - shared read-only code, every user mounts it


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, path)


def remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for dirpath, _, _ in os.walk(path):
        os.chmod(dirpath, 0o755)  # noqa: S103 - our own staging tree, removed next
    shutil.rmtree(path, ignore_errors=True)
