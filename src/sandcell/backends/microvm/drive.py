"""One run inside a ready VM: the job, inputs and stdin in; output, status and files out.

:func:`drive` talks to the agent over the channel (after the handshake) and enforces, from the
host, what the guest must not be trusted with: the wall-time limit and the output caps (the
program is told to stop with a ``K`` frame, and the VM is destroyed after a short grace if the
guest does not answer), and the size of everything it sends back. The agent sends the program's
output as it is written (small writes gathered for a few tens of milliseconds): each piece kept
under its cap is handed to the run's output sink as it arrives (the caps, deadline and stops are
the :class:`~sandcell.backends.host.supervise.Watch` every rung's supervision shares). A guest
image built before live output speaks the same frames (one per read) but its runner holds a
Python program's stderr until the end: the output is the same, less of it live (``sandcell vm
build`` renews the image). :func:`classify` hands what was observed to the outcome classifier
every rung shares.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.backends.base import OutputSink
from sandcell.backends.host.node_program import heap_exhausted
from sandcell.backends.host.outcome import V8_HEAP, Seen
from sandcell.backends.host.outcome import classify as outcome_of
from sandcell.backends.host.supervise import STDERR, STDOUT, Watch
from sandcell.backends.microvm import channel, relay
from sandcell.backends.microvm.guest_packages import NONE, PACKAGES_DIR, GuestPackages
from sandcell.backends.microvm.transfer import FileSink, TransferError, input_frames, input_items
from sandcell.run_sockets import SANDBOX_LIB, SandboxSockets
from sandcell.runtimes import code_path, common_env, runtime_for
from sandcell.spec import IsolationMode, Outcome, RunRequest

STOP_GRACE_S = 5.0
"""How long the guest has to report after it was told to stop, before the VM is destroyed."""
_TICK_S = 0.05
_STREAMS = {channel.STDOUT: STDOUT, channel.STDERR: STDERR}


@dataclass(slots=True)
class Ended:
    """What the host observed of one run in a VM."""

    started: bool = False
    """The job reached the agent and the program was handed over."""
    stopped_by: str | None = None
    """``wall_time``, ``stdout``, ``stderr``, ``cancelled``, or None."""
    exit_code: int | None = None
    signal: int | None = None
    oom_kill: int = 0
    cpu_ms: float | None = None
    peak_bytes: int | None = None
    reported: bool = False
    """The agent sent its exit report."""
    failure: str | None = None
    """Why the run could not go on (the agent's message, a protocol error, the VM's end)."""
    vm_stopped: bool = False
    """The VM stopped during the run (its kernel crashed or QEMU died)."""
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, kind) of matching entries the agent did not send (links, special files)."""
    wall_ms: float = 0.0
    files_complete: bool = False
    stand_ins: set[str] = field(default_factory=set)
    """Paths the host re-created as stand-ins (links, special and oversized files)."""


NO_RELAY = (
    "the guest agent did not serve the run's sockets (its image was built before they "
    "existed): rebuild it: sandcell vm build"
)


def job_doc(
    request: RunRequest,
    *,
    run_id: str,
    export_budget: int,
    packages: GuestPackages = NONE,
    sockets: SandboxSockets | None = None,
) -> dict[str, object]:
    """The job the agent receives (the program, its environment and limits, fresh entropy;
    with ``sockets``, what the agent serves at ``/run/sandcell``: ``relay.py``)."""
    runtime = runtime_for(request.language, request.runtime)
    lim = request.effective_limits
    items = input_items(request.inputs)
    python_paths = [f"{PACKAGES_DIR}/{n}" for n in packages.names]
    env = {**common_env(), **runtime.sandbox_env, **request.env}
    if sockets is not None:
        env.update(sockets.env())
        python_paths.append(SANDBOX_LIB)
    return {
        "code": request.code,
        "code_path": str(code_path(request.language)),
        "language": request.language,
        # The guest has the runtime at the namespaces backend's neutral paths (``image.py``).
        "interpreter": runtime.sandbox_interpreter,
        # Node's permission flags; whatever the mode, the guest's cgroup bounds the program's
        # memory and V8 sizes its heap from it (the rlimits mode's flags are for a host).
        "interpreter_args": list(runtime.interpreter_args),
        "env": env,
        "limits": {
            "cpu_time_s": lim.cpu_time_s,
            "memory_bytes": lim.memory_bytes,
            "max_pids": lim.max_pids,
            "max_open_files": lim.max_open_files,
            "max_file_bytes": lim.max_file_bytes,
            "workspace_bytes": lim.workspace_bytes,
            "workspace_inodes": lim.workspace_inodes,
            "tmp_bytes": lim.tmp_bytes,
            "stdout_bytes": lim.stdout_bytes,
            "stderr_bytes": lim.stderr_bytes,
        },
        "inputs": [i.name for i in request.inputs],
        "inputs_bytes": sum(i.size + 4096 for i in items),
        # Created in a tmpfs at /packages, read-only to the program, appended to its sys.path.
        "packages": list(packages.names),
        "packages_bytes": packages.guest_bytes if packages.names else 0,
        "python_paths": python_paths,
        "exports": list(request.exports),
        "display": request.display and request.language == "python",
        "export_budget": export_budget,
        "entropy": os.urandom(64).hex(),
        "time_ns": time.time_ns(),
        "hostname": f"sandcell-{run_id[:8]}",
        "sockets": relay.guest_spec(sockets) if sockets is not None else None,
    }


def drive(
    chan: channel.Channel,
    request: RunRequest,
    *,
    run_id: str,
    sink_dir: Path,
    stop: threading.Event,
    alive: object,
    export_budget: int,
    max_entries: int,
    packages: GuestPackages = NONE,
    sockets: SandboxSockets | None = None,
    on_output: OutputSink | None = None,
) -> Ended:
    """Run ``request`` through the agent on ``chan``; files go into ``sink_dir`` (created here).

    ``stop`` is set by a cancellation; ``alive`` is a callable telling whether QEMU still runs.
    With ``sockets``, a relay thread owns the channel from ``G`` on (``relay.py``); it stops
    with the channel. ``on_output`` is told each piece of output kept, as it arrives.
    """
    ended = Ended()
    lim = request.effective_limits
    job = job_doc(
        request, run_id=run_id, export_budget=export_budget, packages=packages, sockets=sockets
    )
    pump: relay.Pump | None = None
    t0 = time.monotonic()
    try:
        chan.send(channel.JOB, json.dumps(job).encode())
        for frame in input_frames(input_items(request.inputs)):
            chan.send_raw(frame)
        sending = time.monotonic()
        for frame in packages.frames():
            chan.send_raw(frame)
        # Sending them is the run's setup, as their bind mount is on the namespaces backend:
        # not counted in its wall time (about 10 MiB/s under TCG; nothing of the program's
        # runs yet, so nothing hostile can stall it).
        t0 += time.monotonic() - sending
        for frame in channel.chunks(channel.STDIN, request.stdin):
            chan.send_raw(frame)
        chan.send(channel.GO)
        if sockets is not None:
            pump = relay.Pump(chan, sockets)
            pump.start()
    except channel.ChannelError as exc:
        ended.failure = f"the job could not be sent: {exc}"
        return ended
    ended.started = True
    watch = Watch(
        stdout_cap=lim.stdout_bytes,
        stderr_cap=lim.stderr_bytes,
        deadline=t0 + lim.wall_time_s,
        on_output=on_output,
    )
    hard_deadline: float | None = None
    sink = FileSink(sink_dir, max_bytes=export_budget, max_entries=max_entries)

    def tell_stop() -> None:
        """Tell the guest to stop the program (once); the VM goes after the grace."""
        nonlocal hard_deadline
        if hard_deadline is None:
            hard_deadline = time.monotonic() + STOP_GRACE_S
            try:
                chan.send(channel.KILL)
            except channel.ChannelError:
                hard_deadline = time.monotonic()

    try:
        while True:
            now = time.monotonic()
            if stop.is_set() and watch.stopped_by != "cancelled" and not ended.reported:
                watch.cancel()
                tell_stop()
            if not ended.reported and watch.expired(now):
                tell_stop()
            if hard_deadline is not None and now >= hard_deadline:
                ended.failure = ended.failure or "the guest did not report after it was stopped"
                break
            try:
                kind, payload = chan.recv(now + _TICK_S)
            except channel.ChannelTimeout:
                if not alive() and not chan.pending:  # type: ignore[operator]
                    ended.failure = "the VM stopped during the run"
                    ended.vm_stopped = True
                    break
                continue
            stream = _STREAMS.get(kind)
            if stream is not None:
                if watch.output(stream, payload) and not ended.reported:
                    tell_stop()
            elif kind == channel.EXIT:
                if pump is not None and pump.ready is None:
                    ended.failure = NO_RELAY
                    break
                _exit_report(ended, payload)
                watch.over = True
                ended.wall_ms = (time.monotonic() - t0) * 1000
            elif kind == channel.FILE and ended.reported:
                sink.header(payload)
            elif kind == channel.DATA and ended.reported:
                sink.data(payload)
            elif kind == channel.SKIPPED and ended.reported:
                _skipped(ended, sink, payload)
            elif kind == channel.DONE and ended.reported:
                ended.files_complete = not sink.expecting_data
                break
            elif kind == channel.FAILED:
                ended.failure = "the guest agent failed: " + _message(payload)
                break
            else:
                raise channel.ChannelError(f"unexpected frame {kind!r}")
    except channel.ChannelError as exc:
        ended.failure = ended.failure or f"the channel to the guest failed: {exc}"
    except TransferError as exc:
        ended.failure = f"the guest sent files the host refuses: {exc}"
    finally:
        sink.close()
    ended.stopped_by = watch.stopped_by
    ended.stdout, ended.stderr = watch.data[STDOUT], watch.data[STDERR]
    ended.stdout_truncated, ended.stderr_truncated = (
        watch.truncated[STDOUT],
        watch.truncated[STDERR],
    )
    if not ended.wall_ms:
        ended.wall_ms = (time.monotonic() - t0) * 1000
    return ended


def _exit_report(ended: Ended, payload: bytes) -> None:
    try:
        doc = json.loads(payload)
    except ValueError:
        raise channel.ChannelError("the exit report is not JSON") from None
    if not isinstance(doc, dict):
        raise channel.ChannelError("the exit report is not an object")
    ended.reported = True
    ended.exit_code = _int(doc.get("exit_code"), 0, 255)
    ended.signal = _int(doc.get("signal"), 1, 64)
    ended.oom_kill = _int(doc.get("oom_kill"), 0, 1 << 31) or 0
    cpu = doc.get("cpu_ms")
    ended.cpu_ms = float(cpu) if isinstance(cpu, int | float) and cpu >= 0 else None
    ended.peak_bytes = _int(doc.get("peak_bytes"), 0, 1 << 50)


def _int(value: object, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _skipped(ended: Ended, sink: FileSink, payload: bytes) -> None:
    """An entry the agent did not send: a link or special file gets a stand-in the host's
    export checks refuse; anything else is reported as not exported."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("path"), str):
        return
    path, kind = doc["path"], str(doc.get("kind"))
    if sink.stand_in(path, kind, doc.get("size")):
        ended.stand_ins.add(path)
        return
    if len(ended.skipped) < 64:
        ended.skipped.append((path[:200], kind[:40]))


def _message(payload: bytes) -> str:
    try:
        doc = json.loads(payload)
        return str(doc.get("message"))[:500]
    except (ValueError, AttributeError):
        return payload[:200].decode("utf-8", "replace")


def classify(
    ended: Ended, request: RunRequest, *, cancel_reason: str | None, console: str
) -> tuple[Outcome, str]:
    """The outcome and its reason, by the classifier every rung shares
    (:func:`sandcell.backends.host.outcome.classify`)."""
    lim = request.effective_limits
    seen = Seen(
        subject="run",
        limits=lim,
        mode=request.mode,
        wall_time_s=lim.wall_time_s,
        started=ended.started,
        stopped_by="cancel" if ended.stopped_by == "cancelled" else ended.stopped_by,
        cancel_reason=cancel_reason,
        reported=ended.reported,
        failure=ended.failure,
        sandbox_died=ended.vm_stopped,
        detail=console,
        exit_code=ended.exit_code,
        signal=ended.signal,
        oom_killed=bool(ended.oom_kill),
        cpu_ms=ended.cpu_ms,
        error=V8_HEAP
        # The guest bounds memory by its cgroup whatever the mode (no RLIMIT_AS there).
        if heap_exhausted(bytes(ended.stderr), ended.exit_code, ended.signal, IsolationMode.STRICT)
        else None,
    )
    outcome, reason, _, _ = outcome_of(seen)
    return outcome, reason


__all__ = ["Ended", "classify", "drive", "job_doc"]
