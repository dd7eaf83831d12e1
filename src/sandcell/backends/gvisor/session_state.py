"""A gVisor session sandbox saved into a state directory, and brought back from one; its metrics.

What a state directory holds (:mod:`sandcell.backends.cell.state`)::

    image/checkpoint.img   ``runsc checkpoint`` of the sandbox (memory mode only)
    workspace.tar          the workspace's files (:mod:`sandcell.backends.host.workspace_archive`:
                           nothing followed; links out of the workspace and fifos left out)

**Memory.** ``runsc checkpoint`` stops the sandbox and writes the sentry's whole state: every
process, its memory, the kernel's rlimits and seccomp filters, gVisor's own ``/tmp``. It does not
hold the workspace, a host tmpfs the gofer serves, so that is packed next, while nothing runs. A
restore lays out a fresh sandbox exactly as :meth:`GVisorSessionSandbox.start` would (run
directory, control files, bundle, a cgroup of the request's limits), unpacks the workspace into
it (handed to the sandbox's user before anything runs), and starts ``runsc restore`` from the
image in that cgroup instead of ``runsc run``. The host descriptors gVisor held come back as the
new process's: stdin is a fresh socket pair (the channel), stdout and stderr new pipes, so the
host gets a new channel to the same kernel. The sandbox's bundle and limits are fingerprinted at
save and must be the same at restore (never a weaker sandbox); the runsc release and platform
too. The sentry asks the host for every random byte (``getrandom``) and reads the host's clock
after a restore, so two sandboxes restored from one image draw different bytes and tell the right
time. A live session saved with ``keep_running`` (a fork, a snapshot) is checkpointed, packed and
restored in place from its own image, in the same cgroup and workspace, on a new channel: this
release's ``--leave-running`` restores into a ``runsc`` process of its own, out of the session's
reach.

Memory mode is refused for an ordinary user (the workspace lives in the helper's mount namespace,
which ends with runsc), for a session that reaches outside (its connections to host sockets
cannot be checkpointed) and for a JavaScript or TypeScript session (its copies would draw the same
random numbers: :func:`~sandcell.backends.cell.kernel.memory_refusal`): those keep files only.

**Files.** The workspace is packed (after the sandbox was killed, unless it keeps running), and
a restore starts a fresh sandbox whose workspace is filled before its kernel starts (rootless:
through the helper's view, before the first cell).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.cell.kernel import memory_refusal
from sandcell.backends.cell.state import (
    PauseMode,
    PauseRefused,
    RestorePoint,
    SandboxMetrics,
    SavedState,
)
from sandcell.backends.gvisor import cpu_reader
from sandcell.backends.host import workspace_archive
from sandcell.backends.host.layout import SANDBOX_GID, SANDBOX_UID, SANDBOX_WORKDIR
from sandcell.backends.host.warm_runtime import runtime_name
from sandcell.errors import ConfigError, InfraError

if TYPE_CHECKING:
    from sandcell.backends.gvisor.session import GVisorSessionSandbox

BACKEND = "gvisor"
IMAGE_DIR = "image"
ARCHIVE = "workspace.tar"
CHECKPOINT_TIMEOUT_S = 120.0
_STATE_FORMAT = "1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed:
    """What a memory restore carries over into the new sandbox's host side."""

    image: Path
    kernel_pid: int
    cell_seq: int
    cpu_used_ms: float
    """The session's CPU time before the save: its budget goes on from there."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """The previous metrics sample: CPU milliseconds at a monotonic time."""

    at: float
    cpu_ms: float


def pause_modes(sandbox: GVisorSessionSandbox) -> frozenset[PauseMode]:
    return (
        frozenset(PauseMode) if _memory_refusal(sandbox) is None else frozenset({PauseMode.FILES})
    )


def _memory_refusal(sandbox: GVisorSessionSandbox) -> str | None:
    by_language = memory_refusal(sandbox.request.language)
    if by_language is not None:
        return by_language
    if sandbox.host.runsc.rootless:
        return (
            "rootless gVisor keeps the workspace in its helper's mount namespace, which ends "
            "with the checkpoint"
        )
    if sandbox.sockets is not None:
        return "the session reaches outside, and its connections to host sockets cannot be saved"
    return None


# -- save ------------------------------------------------------------------------------------


def save(
    sandbox: GVisorSessionSandbox, state_dir: Path, *, mode: PauseMode, keep_running: bool
) -> SavedState:
    """:meth:`~sandcell.backends.cell.CellSandbox.save` on gVisor (see the module)."""
    if mode is PauseMode.MEMORY:
        why = _memory_refusal(sandbox)
        if why is not None:
            raise PauseRefused(f"this gVisor session cannot save its memory: {why}; use files")
    if sandbox.ended is not None or sandbox.sb.proc is None:
        raise InfraError(f"the session's sandbox is not running: {sandbox.ended or 'not started'}")
    if any(state_dir.iterdir()):
        raise InfraError(f"the state directory {state_dir} is not empty")
    detail = _common_detail(sandbox)
    if mode is PauseMode.MEMORY:
        detail |= _save_memory(sandbox, state_dir, keep_running=keep_running)
    else:
        detail |= _save_files(sandbox, state_dir, keep_running=keep_running)
    return SavedState(backend=BACKEND, mode=mode, detail=detail)


def _common_detail(sandbox: GVisorSessionSandbox) -> dict[str, str]:
    rs = sandbox.host.runsc
    return {
        "format": _STATE_FORMAT,
        "runsc_release": rs.release,
        "runsc_platform": rs.platform,
        "rootless": str(rs.rootless).lower(),
        "runtime": runtime_name(sandbox.request.runtime),
        "sandbox_workdir": SANDBOX_WORKDIR,
        "workspace": ARCHIVE,
    }


def _save_memory(
    sandbox: GVisorSessionSandbox, state_dir: Path, *, keep_running: bool
) -> dict[str, str]:
    sb = sandbox.sb
    used = cpu_reader(sb)()
    fingerprint = sandbox_fingerprint(sandbox)
    image = state_dir / IMAGE_DIR
    image.mkdir(mode=0o700)
    started = time.monotonic()
    try:
        done = subprocess.run(
            sandbox.host.runsc.argv("checkpoint", "--image-path", str(image), sb.container_id),
            capture_output=True,
            timeout=CHECKPOINT_TIMEOUT_S,
            check=False,
            env={},
            stdin=subprocess.DEVNULL,
        )
        failed = None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = str(exc)
    checkpoint_ms = (time.monotonic() - started) * 1000
    assert sb.proc is not None
    if failed is not None:
        if not (keep_running and sb.proc.poll() is None):
            sandbox.ended = "the checkpoint failed; the sandbox was stopped"
            sb.kill()
        raise InfraError(f"runsc checkpoint of the session failed: {failed[-2000:]}")
    # runsc exits once its sandbox is saved; nothing of it runs while the workspace is copied.
    sb.wait()
    try:
        detail = _save_workspace(sandbox, state_dir)
    finally:
        if keep_running:
            sandbox.relaunch(image)
        else:
            sandbox.ended = "paused: its state was saved"
    return detail | {
        "image": IMAGE_DIR,
        "sandbox_sha256": fingerprint,
        "kernel_pid": str(sandbox.kernel_pid),
        "cell_seq": str(sandbox.cell_seq),
        "cpu_used_ms": f"{max((used or 0.0) - sandbox.cpu_base_ms, 0.0):.3f}",
        "checkpoint_ms": f"{checkpoint_ms:.1f}",
    }


def _save_files(
    sandbox: GVisorSessionSandbox, state_dir: Path, *, keep_running: bool
) -> dict[str, str]:
    sb = sandbox.sb
    # A quiescent copy where the workspace outlives the sandbox (as root, a host tmpfs);
    # rootless, it goes with the helper, so it is copied live first.
    stop_first = not keep_running and sb.helper is None
    if stop_first:
        sb.kill()
        sb.wait()
    try:
        return _save_workspace(sandbox, state_dir)
    finally:
        if not keep_running:
            sandbox.ended = "paused: its files were saved"
            if not stop_first:
                sb.kill()


def _save_workspace(sandbox: GVisorSessionSandbox, state_dir: Path) -> dict[str, str]:
    sandbox.clear_outputs()
    tally = workspace_archive.pack(
        sandbox.workspace_view(), state_dir / ARCHIVE, bounds=_bounds(sandbox)
    )
    return {
        "workspace_files": str(tally.files),
        "workspace_bytes": str(tally.bytes),
        "workspace_links": str(tally.links),
        "workspace_left_out": str(tally.left_out),
    }


def _bounds(sandbox: GVisorSessionSandbox) -> workspace_archive.Bounds:
    return workspace_archive.Bounds(
        max_bytes=sandbox.limits.workspace_bytes, max_entries=sandbox.limits.workspace_inodes
    )


def sandbox_fingerprint(sandbox: GVisorSessionSandbox) -> str:
    """SHA-256 of what confines the sandbox: its bundle (the run directory's own path left
    out, as it differs per sandbox), the limits the host enforces, the isolation mode."""
    config = (sandbox.run_dir / "config.json").read_text()
    limits = dataclasses.asdict(sandbox.limits)
    limits.pop("wall_time_s", None)  # a cell's, given with each cell
    doc = {
        "config": config.replace(str(sandbox.run_dir), "<run>"),
        "limits": limits,
        "mode": str(sandbox.request.mode),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


# -- restore ---------------------------------------------------------------------------------


def prepare(sandbox: GVisorSessionSandbox, point: RestorePoint) -> Resumed | None:
    """Between the bundle's creation and runsc's start: check the state against this sandbox
    and fill the workspace (as root; rootless, :func:`after_start` does). Returns what a memory
    restore needs, None for files. Raises ConfigError for a state this sandbox cannot take."""
    saved = point.saved
    if saved.backend != BACKEND:
        raise ConfigError(f"a state saved by {saved.backend} cannot come back on gVisor")
    detail = saved.detail
    if detail.get("format") != _STATE_FORMAT:
        raise ConfigError(f"this gVisor state has format {detail.get('format')!r}, not ours")
    # Names in the state are ours, never read from its detail: a path there is not trusted.
    archive = point.state_dir / ARCHIVE
    resumed: Resumed | None = None
    if saved.mode is PauseMode.MEMORY:
        resumed = _check_memory(sandbox, point)
    if not sandbox.host.runsc.rootless:
        _fill(sandbox, archive, sandbox.sb.work)
    return resumed


def after_start(sandbox: GVisorSessionSandbox, point: RestorePoint) -> None:
    """Rootless files mode: fill the workspace through the helper's view, before any cell."""
    if sandbox.host.runsc.rootless and point.saved.mode is PauseMode.FILES:
        _fill(sandbox, point.state_dir / ARCHIVE, sandbox.workspace_view())


def _fill(sandbox: GVisorSessionSandbox, archive: Path, workspace: Path) -> None:
    workspace_archive.unpack(archive, workspace, bounds=_bounds(sandbox))
    if not sandbox.host.runsc.rootless:
        _give_to_sandbox_user(workspace)


def _give_to_sandbox_user(workspace: Path) -> None:
    """Hand what root just unpacked to the sandbox's user (rootless, the unpacking user is
    already the one the sentry maps to root). Nothing runs in the sandbox yet, and no link is
    followed."""
    os.chown(workspace, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
    for _top, dirs, files, dir_fd in os.fwalk(workspace, follow_symlinks=False):
        for name in (*dirs, *files):
            os.chown(name, SANDBOX_UID, SANDBOX_GID, dir_fd=dir_fd, follow_symlinks=False)


def _check_memory(sandbox: GVisorSessionSandbox, point: RestorePoint) -> Resumed:
    detail = point.saved.detail
    why = _memory_refusal(sandbox)
    if why is not None:
        raise ConfigError(f"this gVisor session cannot come back with its memory: {why}")
    rs = sandbox.host.runsc
    if (detail.get("runsc_release"), detail.get("runsc_platform")) != (rs.release, rs.platform):
        raise ConfigError(
            f"the state was saved by runsc {detail.get('runsc_release')} on platform "
            f"{detail.get('runsc_platform')}; this host has runsc {rs.release} on "
            f"{rs.platform}, which cannot restore it"
        )
    if detail.get("sandbox_sha256") != sandbox_fingerprint(sandbox):
        raise ConfigError(
            "the sandbox this session would come back in differs from the one saved (its "
            "runtime, mounts, limits or isolation mode changed): restore it with the request "
            "it was saved with"
        )
    image = point.state_dir / IMAGE_DIR
    try:
        return Resumed(
            image=image,
            kernel_pid=int(detail["kernel_pid"]),
            cell_seq=int(detail["cell_seq"]),
            cpu_used_ms=float(detail["cpu_used_ms"]),
        )
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"this gVisor state's detail is incomplete: {exc}") from exc


# -- metrics ---------------------------------------------------------------------------------


def metrics(
    sandbox: GVisorSessionSandbox, previous: Sample | None
) -> tuple[SandboxMetrics, Sample]:
    """One sample (:class:`~sandcell.backends.cell.state.SandboxMetrics`) and the sample the
    next one measures its CPU share from."""
    if sandbox.ended is not None or sandbox.sb.proc is None:
        raise InfraError(f"the session's sandbox is not running: {sandbox.ended or 'not started'}")
    now = time.monotonic()
    cpu_ms = cpu_reader(sandbox.sb)() or 0.0
    since = previous or Sample(at=sandbox.started_at, cpu_ms=sandbox.cpu_base_ms)
    cpus = os.cpu_count() or 1
    wall_ms = max((now - since.at) * 1000, 1e-3)
    pct = max(cpu_ms - since.cpu_ms, 0.0) / (wall_ms * cpus) * 100
    cg = sandbox.sb.cgroup
    try:
        fs = os.statvfs(sandbox.workspace_view())
        disk_used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    except OSError:
        disk_used = 0
    sample = SandboxMetrics(
        timestamp=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        cpu_count=cpus,
        cpu_used_pct=round(min(pct, 100.0), 2),
        mem_used_bytes=(cg.memory_now() or 0) if cg is not None else 0,
        mem_total_bytes=sandbox.limits.memory_bytes,
        disk_used_bytes=disk_used,
        disk_total_bytes=sandbox.limits.workspace_bytes,
    )
    return sample, Sample(at=now, cpu_ms=cpu_ms)


__all__ = [
    "ARCHIVE",
    "BACKEND",
    "IMAGE_DIR",
    "Resumed",
    "Sample",
    "after_start",
    "metrics",
    "pause_modes",
    "prepare",
    "sandbox_fingerprint",
    "save",
]
