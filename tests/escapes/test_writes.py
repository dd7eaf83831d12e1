"""Escapes by writing outside the workspace: the runtime, the root, /etc, the control directory and
the inputs are read-only; only the workspace (the working directory) and the private /tmp take
writes.

Every write attempt is harmless if it got through: it creates a new, uniquely named entry, opens an
existing file for appending without writing, or sets a mode to the value it already has. The test
removes anything that appeared on the host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandcell import ConfigError
from sandcell.runtimes import python_runtime

from .conftest import END

if TYPE_CHECKING:
    from .conftest import Attack

VENV = os.path.abspath(sys.prefix)
# The runtime's directories as the sandbox sees them (fixed neutral paths), and the host
# directory behind each, where a write that got through would land.
_RT = python_runtime()
SANDBOX_VENV = os.path.dirname(os.path.dirname(_RT.sandbox_python))


# On the wasm rung these directories are Pyodide's in-memory filesystem (or absent), not the host's:
# a write there may succeed in memory and is no breach; what must hold is that nothing lands on
# the host (checked by the test). Each attempt is reported, neither blocked nor a breach.
_IN_MEMORY = """
    def attempt(what, fn, ok=None):
        try:
            r = fn()
        except OSError as exc:
            print("refused:", what, "->", errname(exc), flush=True)
        else:
            print("in Pyodide's memory:", what, "->", repr(r), flush=True)
"""


def _write_attempts(
    directory: str,
    existing: str | None,
    token: str,
    wasm: bool = False,
    rename_to: str | None = None,
) -> str:
    """Attack body: create a file, make a directory, append to and chmod an existing file, rename
    it (onto itself unless ``rename_to`` names another path)."""
    stat_existing = "os.stat(existing).st_mode"
    if wasm:
        stat_existing = "os.stat(existing).st_mode if os.path.exists(existing) else 0o644"
    return (
        (_IN_MEMORY if wasm else "")
        + f"""
    d = {directory!r}
    ok = (errno.EROFS, errno.EACCES, errno.EPERM)
    def create():
        fd = os.open(os.path.join(d, {token!r}), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"BREACH\\n")
        os.close(fd)
        return "created"
    attempt(f"create a file in {{d}}", create, ok=ok)
    base = os.path.join(d, {token!r})
    attempt(f"make a directory in {{d}}", lambda: os.mkdir(base + ".d") or "made", ok=ok)
    attempt(f"create a symlink in {{d}}", lambda: os.symlink("/", base + ".l") or "made", ok=ok)
    existing = {existing!r}
    if existing is not None:
        def append():
            fd = os.open(existing, os.O_WRONLY | os.O_APPEND)
            os.close(fd)
            return "opened for writing"
        attempt(f"open {{existing}} for writing", append, ok=ok)
        mode = stat.S_IMODE({stat_existing})
        attempt(f"chmod {{existing}}", lambda: os.chmod(existing, mode) or "chmod done", ok=ok)
        target = {rename_to or existing!r}
        attempt(f"rename {{existing}}", lambda: os.rename(existing, target) or "renamed", ok=ok)
    """
    )


def _host_cleanup(directory: str, token: str) -> list[str]:
    """Remove what a breach left on the host; returns what was there."""
    left = []
    for suffix in ("", ".d", ".l"):
        p = Path(directory) / (token + suffix)
        if p.is_symlink() or p.exists():
            left.append(str(p))
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    return left


def _site_packages() -> tuple[str, str]:
    """The runtime's site-packages: (path inside the sandbox, host path)."""
    host = next(p for p in sys.path if p.startswith(VENV + "/") and p.endswith("site-packages"))
    inside = dict(_RT.mounts)[host]
    return inside, host


def _host_dir(directory: str) -> str:
    """The host directory behind a sandbox directory of the runtime (itself elsewhere)."""
    for host, inside in _RT.mounts:
        if directory == inside or directory.startswith(inside.rstrip("/") + "/"):
            return host + directory[len(inside) :]
    return VENV if directory == SANDBOX_VENV else directory


def _guest_venv() -> str:
    """The runtime's venv in a microVM guest: where its image was built from (its manifest)."""
    from sandcell.backends.microvm import image

    return os.path.dirname(os.path.dirname(image.load_manifest().python))


TARGETS = {
    "usr": ("/usr", "/usr/bin/env"),
    "usr_bin": ("/usr/bin", "/usr/bin/env"),
    "venv": (SANDBOX_VENV, os.path.join(SANDBOX_VENV, "pyvenv.cfg")),
    "venv_site_packages": ("<site-packages>", None),
    "root_dir": ("/", None),
    "etc": ("/etc", "/etc/passwd"),
    "control_dir": ("/sandcell", "/sandcell/main.py"),
}


@pytest.mark.parametrize("target", list(TARGETS), ids=list(TARGETS))
def test_blocks_write_outside_workspace(attack: Attack, token: str, target: str) -> None:
    directory, existing = TARGETS[target]
    # A microVM guest's image holds the runtime at the path it was built from, not at the neutral
    # path: aim there. A write that got through would land in the guest's read-only root disk;
    # the host is checked below all the same.
    guest_venv = _guest_venv() if attack.sandbox.backend == "microvm" else None
    if guest_venv is not None and target == "venv":
        directory, existing = guest_venv, os.path.join(guest_venv, "pyvenv.cfg")
    if directory == "<site-packages>":
        directory, host_dir = _site_packages()
        if guest_venv is not None:
            directory = guest_venv + host_dir[len(VENV) :]
        # A package file of the runtime (sandcell itself may be an editable install).
        found = next((p for p in sorted(Path(host_dir).glob("*/__init__.py"))), None)
        existing = None if found is None else directory + str(found)[len(host_dir) :]
    attempts = 3 + (3 if existing else 0)
    wasm = attack.sandbox.backend == "wasm"
    left: list[str] = []
    try:
        res = attack.run(_write_attempts(directory, existing, token, wasm=wasm))
        if wasm:
            out = str(res["stdout"])
            assert res["outcome"] == "ok" and END in out, res
            assert out.count("refused:") + out.count("in Pyodide's memory:") == attempts, out
        else:
            attack.expect_blocked(res, attempts=attempts)
    finally:
        if directory != "/sandcell":
            left = _host_cleanup(_host_dir(directory), token)
    assert not left, f"[{attack.identity}] ESCAPE: the sandbox wrote {left} on the host"


def test_blocks_write_to_inputs(attack: Attack, tmp_path: Path, token: str) -> None:
    src = tmp_path / "data"
    src.mkdir()
    (src / "table.csv").write_text("a,b\n1,2\n")
    src.chmod(0o777)  # writable on the host by anyone: only the sandbox's mount may stop writes
    (src / "table.csv").chmod(0o666)
    single = tmp_path / "single.txt"
    single.write_text("hello\n")
    single.chmod(0o666)
    # Emscripten's rename returns early, with no call at all, when the source and the target are
    # one file: on the wasm rung the rename aims at a new name instead, the stronger check (the
    # host listing below must not change).
    rename_to = f"/inputs/data/{token}.renamed" if attack.sandbox.backend == "wasm" else None
    body = (
        _write_attempts("/inputs/data", "/inputs/data/table.csv", token, rename_to=rename_to)
        + """
    def overwrite():
        with open("/inputs/single.txt", "w") as f:
            f.write("BREACH")
        return "overwritten"
    attempt("overwrite /inputs/single.txt", overwrite, ok=(errno.EROFS, errno.EACCES, errno.EPERM))
    attempt("create a file in /inputs", lambda: open("/inputs/new.txt", "w") and "created",
            ok=(errno.EROFS, errno.EACCES, errno.EPERM))
    attempt("remove /inputs/single.txt", lambda: os.unlink("/inputs/single.txt") or "removed",
            ok=(errno.EROFS, errno.EACCES, errno.EPERM, errno.EBUSY))
    """
    )
    res = attack.run(body, inputs=[src, single])
    attack.expect_blocked(res, attempts=6 + 3)
    assert single.read_text() == "hello\n"
    assert (src / "table.csv").read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in src.iterdir()) == ["table.csv"]


def test_blocks_fifo_in_input_dir(attack: Attack, tmp_path: Path) -> None:
    """A FIFO in an input directory, read by a host process, must not become a way to write out."""
    src = tmp_path / "shared"
    src.mkdir(mode=0o755)
    fifo = src / "pipe"
    os.mkfifo(fifo, 0o666)
    fifo.chmod(0o666)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a host reader is there
    try:
        body = """
        def write():
            fd = os.open("/inputs/shared/pipe", os.O_WRONLY | os.O_NONBLOCK)
            try:
                return os.write(fd, b"BREACH through a FIFO")
            finally:
                os.close(fd)
        attempt("write to a host FIFO in an input", write)
        """
        # Refused before anything runs (the input check names the FIFO); Landlock would also
        # refuse the open, but a run without Landlock must be safe too.
        with pytest.raises(ConfigError, match=r"FIFO .*pipe"):
            attack.run(body, inputs=[src])
        with contextlib.suppress(BlockingIOError):
            got = os.read(reader, 4096)
            assert not got, f"[{attack.identity}] ESCAPE: the host read {got!r} from the FIFO"
    finally:
        os.close(reader)


def test_allows_writes_to_tmp_and_workspace(attack: Attack) -> None:
    """The control: the two writable places do take writes (so the blocks above mean something)."""
    body = """
    for d in ("/tmp", os.getcwd()):
        p = os.path.join(d, "probe.txt")
        with open(p, "w") as f:
            f.write("ok")
        os.mkdir(os.path.join(d, "sub"))
        print("wrote", p, open(p).read(), flush=True)
    print("cwd", os.getcwd())
    """
    res = attack.run(body)
    assert res["outcome"] == "ok", res
    out = str(res["stdout"])
    assert "wrote /tmp/probe.txt ok" in out and "wrote /sandbox/probe.txt ok" in out, res
