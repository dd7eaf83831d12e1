"""A namespaces session's pause: its workspace saved as files, and a fresh sandbox filled with them.

This rung keeps files only (:data:`PAUSE_MODES`). A memory pause needs a checkpoint of the
sandbox's processes that comes back under the same namespaces, seccomp filter, Landlock rules
and cgroup; CRIU is the only such mechanism for this rung, and the CRIU this project can install
cannot run on every host it supports (Debian 12's 3.17 fails on kernel 6.x's vDSO), so a memory
save is refused (:class:`~sandcell.backends.cell.state.PauseRefused`) rather than offered where
it could not be restored, or restored into a weaker sandbox.

The state directory holds one file, :data:`ARCHIVE`: the workspace as an uncompressed tar
(``host/workspace_archive.py``: no link followed, links out of the workspace left out, fifos and
devices left out). The manifest's detail names the format and the workspace's path inside the
sandbox, and counts what was kept.

Saving reads a quiet workspace. With ``keep_running`` the session's cgroup is frozen for the
copy (the v1 freezer, made with the session's cgroup, or v2's ``cgroup.freeze``) and thawed
after, so a process a cell left running neither writes during the copy nor notices it. Where the
session has no freezer (an ordinary user's sandbox, or the rlimits mode) such a process can still
write while the copy runs: a file it replaces or shortens then fails the copy, which is tried
again (:data:`UNFROZEN_TRIES` in all) before the save fails with InfraError; a file it appends
to is kept as it was when its copy began. Without ``keep_running`` the sandbox is
killed first (every process of its pid namespace gone before the copy) and its workspace,
still held on the host, is copied quietly.

Restoring starts a fresh sandbox from the same request (same limits and layers, decided again)
and, once its kernel said hello and before any cell, unpacks the archive into its workspace
through the host's view of it; files made by the host user there belong to the sandbox's user
inside. The archive is only read, so any number of sandboxes restore from one state at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.cell.state import PauseMode, PauseRefused, SavedState
from sandcell.backends.host import cgroups, workspace_archive
from sandcell.backends.host.layout import SANDBOX_WORKDIR
from sandcell.errors import ConfigError, InfraError

if TYPE_CHECKING:
    from sandcell.backends.namespaces.session import SessionSandbox

PAUSE_MODES = frozenset({PauseMode.FILES})
ARCHIVE = "workspace.tar"
FORMAT = "workspace-tar-1"
FREEZE_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0
UNFROZEN_TRIES = 3


def refuse_memory() -> PauseRefused:
    return PauseRefused(
        "the namespaces backend keeps files only: a memory pause needs a CRIU checkpoint that "
        "comes back under the same confinement, and no CRIU that can do that runs on this "
        "host. Pause with mode files (the workspace is kept, the interpreter starts empty), or "
        "use the gvisor or microvm backend for a memory pause"
    )


def bounds_of(box: SessionSandbox) -> workspace_archive.Bounds:
    return workspace_archive.Bounds(
        max_bytes=box.limits.workspace_bytes, max_entries=box.limits.workspace_inodes
    )


def save(
    box: SessionSandbox, state_dir: Path, *, mode: PauseMode, keep_running: bool
) -> SavedState:
    """The sandbox's ``save`` (see the module's docstring)."""
    if mode is not PauseMode.FILES:
        raise refuse_memory()
    if box.ended is not None or box.sandbox_pid is None:
        raise InfraError(f"the session's sandbox cannot be saved: it has ended ({box.ended})")
    _check_state_dir(state_dir)
    if keep_running:
        tally = _pack_live(box, state_dir)
    else:
        _stop(box)
        tally = workspace_archive.pack(
            box.workspace_view(), state_dir / ARCHIVE, bounds=bounds_of(box)
        )
    return SavedState(
        backend=box.backend.name,
        mode=PauseMode.FILES,
        detail={
            "format": FORMAT,
            "archive": ARCHIVE,
            "workspace": SANDBOX_WORKDIR,
            "files": str(tally.files),
            "directories": str(tally.directories),
            "links": str(tally.links),
            "bytes": str(tally.bytes),
            "left_out": str(tally.left_out),
        },
    )


def restore(box: SessionSandbox) -> None:
    """Fill the started sandbox's workspace from ``box.restore`` (before its first cell)."""
    point = box.restore
    if point is None:
        return
    saved = point.saved
    if saved.backend != box.backend.name:
        raise ConfigError(f"this state was saved by the {saved.backend} backend, not namespaces")
    if saved.mode is not PauseMode.FILES:
        raise refuse_memory()
    if saved.detail.get("format") != FORMAT or saved.detail.get("archive") != ARCHIVE:
        raise ConfigError(
            f"this state's format ({saved.detail.get('format')!r}) is not one the namespaces "
            f"backend reads ({FORMAT})"
        )
    workspace_archive.unpack(point.state_dir / ARCHIVE, box.workspace_view(), bounds=bounds_of(box))


def _check_state_dir(state_dir: Path) -> None:
    try:
        st = state_dir.lstat()
        empty = not os.listdir(state_dir) if stat.S_ISDIR(st.st_mode) else False
    except OSError as exc:
        raise InfraError(f"the state directory {state_dir} cannot be used: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise InfraError(
            f"the state directory {state_dir} must be a directory of uid {os.geteuid()} that "
            "no one else can write"
        )
    if not empty:
        raise InfraError(f"the state directory {state_dir} is not empty")


def _pack_live(box: SessionSandbox, state_dir: Path) -> workspace_archive.Tally:
    group = box.cgroup
    if group is not None and group.can_freeze:
        with _frozen(group):
            return workspace_archive.pack(
                box.workspace_view(), state_dir / ARCHIVE, bounds=bounds_of(box)
            )
    # Unfrozen, a file replaced or cut short under the copy fails it (and its archive is
    # removed): a writer that keeps doing so is given a few chances to be caught between two.
    tries = 1
    while True:
        try:
            return workspace_archive.pack(
                box.workspace_view(), state_dir / ARCHIVE, bounds=bounds_of(box)
            )
        except InfraError:
            if tries >= UNFROZEN_TRIES:
                raise
            tries += 1


@contextlib.contextmanager
def _frozen(group: cgroups.RunCgroup | None) -> Iterator[None]:
    """The session's processes stopped for the block (nothing, without a freezer: see the
    module's docstring for what that allows)."""
    if group is None or not group.can_freeze:
        yield
        return
    if not group.freeze(FREEZE_TIMEOUT_S):
        group.thaw()
        raise InfraError(
            f"the session's sandbox could not be frozen within {FREEZE_TIMEOUT_S:g} s to be "
            "saved; it goes on"
        )
    try:
        yield
    finally:
        group.thaw()


def _stop(box: SessionSandbox) -> None:
    """Kill the sandbox and return once every process of its pid namespace is gone (its init's
    exit waits for them); its workspace stays for the copy, and for ``teardown``."""
    assert box.sandbox_pid is not None
    try:
        pidfd = os.pidfd_open(box.sandbox_pid)
    except ProcessLookupError:
        pidfd = None
    box.ended = "saved"
    box._kill()
    if pidfd is None:
        return
    try:
        if not select.select([pidfd], [], [], STOP_TIMEOUT_S)[0]:
            raise InfraError(f"the session's sandbox did not end within {STOP_TIMEOUT_S:g} s")
    finally:
        os.close(pidfd)


__all__ = ["ARCHIVE", "FORMAT", "PAUSE_MODES", "refuse_memory", "restore", "save"]
