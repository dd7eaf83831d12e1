"""A session VM's pause, fork and snapshot (issue 23): what :class:`~.session.VMSessionSandbox`'s
``save``, ``metrics`` and restoring ``start`` do, kept here so the session module stays small.

The VM's state itself is :mod:`.session_state`'s business; this module speaks to the guest
agent: after a memory restore it sends ``Y`` (fresh host entropy, which the agent adds to the
kernel's pool before forcing its generator to reseed, and the host's wall clock, which stopped
when the state was saved) and waits for ``y``; ``V`` asks for the usage ``metrics`` reports
(``v``). A guest that cannot reseed fails the restore: two copies of one state must never draw
the same random numbers.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.cell.kernel import memory_refusal
from sandcell.backends.cell.state import PauseMode, PauseRefused, SandboxMetrics, SavedState
from sandcell.backends.microvm import session_state
from sandcell.backends.microvm.vm import VM
from sandcell.errors import ConfigError, InfraError

if TYPE_CHECKING:
    from sandcell.backends.microvm.session import VMSessionSandbox

# host -> guest, and the guest's answers
RESUME = b"Y"
ASK_USAGE = b"V"
RESUMED = b"y"
USAGE = b"v"
RESUME_TIMEOUT_S = 30.0
RESEND_S = 2.0
"""A first frame to a guest that just resumed may be lost (its port reconnects): sent again."""
USAGE_TIMEOUT_S = 10.0
_FILES_FORMAT = "microvm-files-1"
_ENTROPY_BYTES = 64
ALL_MODES = frozenset({PauseMode.MEMORY, PauseMode.FILES})


def pause_modes(sb: VMSessionSandbox) -> frozenset[PauseMode]:
    """Memory and files; files only for a session with sockets (its egress relay's
    connections live on the host and would not come back with the guest) and for a JavaScript
    or TypeScript session (:func:`~sandcell.backends.cell.kernel.memory_refusal`)."""
    return ALL_MODES if _memory_refusal(sb) is None else frozenset({PauseMode.FILES})


def _memory_refusal(sb: VMSessionSandbox) -> str | None:
    if sb.sockets is not None:
        return (
            "a microVM session with sockets (egress or tools) cannot keep its memory: the "
            "relay's connections live on the host; mode=files keeps its files"
        )
    return memory_refusal(sb.request.language)


def _ask(
    sb: VMSessionSandbox,
    send: bytes,
    reply: bytes,
    payload: Callable[[], bytes],
    timeout_s: float,
    *,
    resend_s: float | None = None,
) -> dict[str, object]:
    """Send ``send`` (again every ``resend_s``) until the guest answers ``reply``."""
    sb._replies.pop(reply, None)
    deadline = time.monotonic() + timeout_s
    next_send = 0.0
    while reply not in sb._replies:
        now = time.monotonic()
        if now >= deadline:
            raise InfraError(f"the guest did not answer {send!r} within {timeout_s:g} s")
        if now >= next_send:
            if not sb._send(send, payload()):
                raise InfraError("the session VM's channel is closed")
            next_send = now + resend_s if resend_s is not None else deadline
        if sb._pump(None, None, min(next_send, deadline) - now) == "ended":
            raise InfraError(f"the session's VM ended: {sb._protocol_error or 'it stopped'}")
    return sb._replies.pop(reply)


# -- restore ---------------------------------------------------------------------------------


def restored_vm(sb: VMSessionSandbox) -> VM:
    """A VM resumed from the session's memory state (refused where it would differ)."""
    restore = sb.restore
    assert restore is not None
    if sb.sockets is not None:
        raise ConfigError(
            "a memory state of the microVM comes back without sockets (it was saved without "
            "them); restore its files instead"
        )
    t0 = time.monotonic()
    guest = sb.backend.guest_for(sb.request)
    vm = session_state.restore_memory(
        guest,
        dict(restore.saved.detail),
        restore.state_dir,
        name=f"session-{sb.session_id[:12]}",
        limits=sb.limits,
    )
    assert vm.plan is not None
    sb.memory_mib = vm.plan.memory_mib
    cells = restore.saved.detail.get("cells", "0")
    sb._cell_seq = int(cells) if cells.isdigit() else 0
    sb.start_note = f"restored from a saved memory state in {(time.monotonic() - t0) * 1000:.0f} ms"
    return vm


def resume(sb: VMSessionSandbox) -> None:
    """Fresh entropy and the wall clock into the restored guest, before any cell runs."""
    vm = sb.vm
    assert vm is not None and vm.chan is not None
    from sandcell.backends.microvm.session import GUEST_TYPES

    vm.chan.reader.allowed = GUEST_TYPES

    def payload() -> bytes:
        doc = {"entropy": os.urandom(_ENTROPY_BYTES).hex(), "time_ns": time.time_ns()}
        return json.dumps(doc).encode()

    doc = _ask(sb, RESUME, RESUMED, payload, RESUME_TIMEOUT_S, resend_s=RESEND_S)
    if "error" in doc:
        raise InfraError(
            f"the restored guest could not reseed its generator or set its clock: "
            f"{str(doc['error'])[:200]}; an image built before pause existed? rebuild it: "
            "sandcell vm build"
        )
    # The usage the next cell's CPU time counts from, as after the kernel's hello.
    sb._stats = doc


# -- save --------------------------------------------------------------------------------------


def save(
    sb: VMSessionSandbox, state_dir: Path, *, mode: PauseMode, keep_running: bool
) -> SavedState:
    """Write the session's state into the empty ``state_dir`` (see :mod:`.session_state`)."""
    vm = sb.vm
    if sb.ended is not None or vm is None:
        raise InfraError(f"the session's VM has ended: {sb.ended}")
    why = _memory_refusal(sb) if mode is PauseMode.MEMORY else None
    if why is not None:
        raise PauseRefused(why)
    if not state_dir.is_dir() or any(state_dir.iterdir()):
        raise ConfigError(f"the state directory {state_dir} must exist and be empty")
    if mode is PauseMode.FILES:
        detail = _save_files(sb, state_dir)
    else:
        guest = sb.backend.guest_for(sb.request)
        detail = session_state.save_memory(
            vm, state_dir, guest=guest, limits=sb.limits, keep_running=keep_running
        )
        # The kernel keeps counting cells (its outputs directories are numbered by them).
        detail["cells"] = str(sb._cell_seq)
        if not keep_running:
            # Stopped: nothing in it answers any more; teardown only destroys it.
            sb.ended = "saved"
    return SavedState(backend=sb.backend.name, mode=mode, detail=detail)


def _save_files(sb: VMSessionSandbox, state_dir: Path) -> dict[str, str]:
    from sandcell.backends.microvm.session import _remove

    got = sb._receive("/sandbox", ["**"])
    try:
        if got.failure is not None:
            raise InfraError(f"the workspace's files could not be saved: {got.failure}")
        copied = session_state.copy_workspace(
            got.root, state_dir / session_state.FILES, skip=got.stand_ins
        )
    finally:
        _remove(got.root)
    fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dropped = [p for p, _ in got.skipped] + sorted(got.stand_ins)
    return {
        "format": _FILES_FORMAT,
        "bytes": str(copied),
        "dropped": json.dumps(dropped[:64]),
        "note": "regular files and directories only; links and special files are dropped",
    }


# -- metrics -----------------------------------------------------------------------------------


def metrics(sb: VMSessionSandbox) -> SandboxMetrics:
    """The guest's own counts, asked of its agent: the session cgroup's CPU time (the
    program's, not QEMU's emulation) since the previous sample, its memory now
    (``memory.current``) and the workspace tmpfs's used bytes; limits from the request."""
    vm = sb.vm
    if sb.ended is not None or vm is None:
        raise InfraError(f"the session's VM has ended: {sb.ended}")
    doc = _ask(sb, ASK_USAGE, USAGE, lambda: b"", USAGE_TIMEOUT_S)
    now = time.monotonic()
    cpus = vm.plan.vcpus if vm.plan is not None else 1
    cpu = _count(doc.get("cpu_ms"))
    since, cpu_before = sb._sample or (vm.started_at, 0.0)
    pct = 0.0
    if cpu is not None:
        wall_ms = max((now - since) * 1000, 1e-3)
        pct = min(max(cpu - cpu_before, 0.0) / wall_ms * 100 / cpus, 100.0)
        sb._sample = (now, float(cpu))
    return SandboxMetrics(
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
        cpu_count=cpus,
        cpu_used_pct=round(pct, 2),
        mem_used_bytes=int(_count(doc.get("mem_bytes")) or 0),
        mem_total_bytes=sb.limits.memory_bytes,
        disk_used_bytes=int(_count(doc.get("disk_bytes")) or 0),
        disk_total_bytes=sb.limits.workspace_bytes,
    )


def _count(value: object) -> float | None:
    """A count from the guest (hostile): a non-negative number below 2**62, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < 1 << 62 else None


__all__ = ["ALL_MODES", "metrics", "pause_modes", "restored_vm", "resume", "save"]
