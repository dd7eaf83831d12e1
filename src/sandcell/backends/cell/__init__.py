"""The cell contract, beside the backend's: one live sandbox that runs cells, as a session needs.

A session (:mod:`sandcell.sessions.session`) owns the policy, the record, the idle and lifetime
watchdog; a :class:`CellSandbox` owns the isolation. Every rung makes one through
:meth:`~sandcell.backends.base.Backend.session_sandbox` (:func:`open_cell_sandbox` is the call a
session makes), each in its rung's ``session.py``: the namespaces backend's ``SessionSandbox``,
gVisor's ``GVisorSessionSandbox``, the microVM's ``VMSessionSandbox``. All of them speak the
kernel's channel (:mod:`sandcell.backends.cell.channel`) to ``_kernel.py``, watch a cell with one
loop (:func:`sandcell.backends.cell.loop.supervise_cell`, each through its own small adapter) and
judge it with :func:`sandcell.backends.cell.verdict.classify_cell`, so a cell's outcome means the
same on every rung.

The workspace is reached through the sandbox, never as a host path the session walks itself: on
a microVM it lives in the guest, and files cross only through the backend's transfer and then the
host's export checks (the ``collect`` callback, as for a run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sandcell.artifacts.store import ArtifactStore
from sandcell.backends.base import Backend, Collector, OutputSink
from sandcell.backends.cell.state import PauseMode, RestorePoint, SandboxMetrics, SavedState
from sandcell.display import DisplayCollection
from sandcell.errors import ConfigError
from sandcell.run_sockets import SandboxSockets
from sandcell.spec import Artifact, Enforcement, Outcome, RejectedExport, RunRequest, Usage

if TYPE_CHECKING:
    from sandcell.backends.cell.verdict import CellCancel

Exported = tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class CellRun:
    """What the host observed for one cell."""

    outcome: Outcome
    reason: str
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    usage: Usage
    out_dir: str | None
    """The cell's display directory inside the sandbox, if the kernel made one."""
    session_ended: str | None
    """Why the session ended during this cell, or None when it goes on."""

    @classmethod
    def of(
        cls,
        verdict: tuple[Outcome, str, int | None, int | None],
        *,
        reply: Mapping[str, object] | None,
        out: CappedOutput,
        err: CappedOutput,
        usage: Usage,
        session_ended: str | None,
    ) -> CellRun:
        """A cell's run from its verdict (:func:`~sandcell.backends.cell.verdict.classify_cell`:
        outcome, reason, exit code, signal), the kernel's reply and the captured streams."""
        outcome, reason, exit_code, sig = verdict
        out_dir = reply.get("out_dir") if reply is not None else None
        return cls(
            outcome=outcome,
            reason=reason,
            exit_code=exit_code,
            signal=sig,
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            usage=usage,
            out_dir=out_dir if isinstance(out_dir, str) else None,
            session_ended=session_ended,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CellScope:
    """Where a cell runs in the kernel: a named namespace of its own (variables apart from the
    session's main one and from every other scope; modules, files and the environment shared,
    as one process's) with its own working directory. ``cwd`` (a path in the sandbox) is the
    directory of a scope's first cell; a cell that changes directory changes its scope's.
    ``drop`` forgets the scope instead of running code: its next cell starts it afresh."""

    name: str
    cwd: str | None = None
    drop: bool = False

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 256:
            raise ConfigError("a scope's name must be 1 to 256 characters")


def kernel_message(cell_id: int, code: str, scope: CellScope | None) -> dict[str, object]:
    """The message that asks the kernel (``_kernel.py``) to run ``code`` as cell ``cell_id``,
    in ``scope`` when one is given (or to drop that scope)."""
    if scope is None:
        return {"op": "cell", "id": cell_id, "code": code}
    if scope.drop:
        return {"op": "drop", "id": cell_id, "scope": scope.name}
    return {"op": "cell", "id": cell_id, "code": code, "scope": scope.name, "cwd": scope.cwd}


class CappedOutput:
    """One stream of one cell, kept up to ``cap`` bytes; what is kept is also told to
    ``on_output`` as ``(stream, bytes)`` when one is given (live output), except a tail that
    ``hold`` says may not be the program's yet (it gets the bytes not yet passed on and
    answers how many at their end to keep back until more come or :meth:`flush`)."""

    def __init__(
        self,
        cap: int,
        *,
        stream: str = "stdout",
        on_output: OutputSink | None = None,
        hold: Callable[[bytes], int] | None = None,
    ) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False
        self.stream = stream
        self.on_output = on_output
        self.hold = hold
        self.sent = 0

    def add(self, chunk: bytes) -> bool:
        """Keep what fits; True when the cap was passed."""
        room = self.cap - len(self.data)
        self.data += chunk[: max(room, 0)]
        self._pass_on(final=False)
        if len(chunk) > room:
            self.truncated = True
        return self.truncated

    def flush(self) -> None:
        """Pass on what ``hold`` kept back (the stream has ended; whatever was not the
        program's has been removed from :attr:`data`)."""
        self._pass_on(final=True)

    def _pass_on(self, *, final: bool) -> None:
        if self.on_output is None:
            return
        end = len(self.data)
        if self.hold is not None and not final:
            end -= self.hold(bytes(self.data[self.sent :]))
        if end > self.sent:
            self.on_output(self.stream, bytes(self.data[self.sent : end]))
            self.sent = end


class CellSandbox(Protocol):
    """One live sandbox running a kernel. Not thread-safe: the session serialises its calls."""

    @property
    def backend(self) -> Backend:
        """The backend that made it (its versions go into each cell's record)."""
        ...

    @property
    def ended(self) -> str | None:
        """Why the sandbox ended (killed, crashed, closed), or None while it is alive."""
        ...

    @property
    def sandbox_pid(self) -> int | None:
        """The host pid of the sandbox's outermost process (for inspection and tests)."""
        ...

    @property
    def run_dir(self) -> Path:
        """The sandbox's directory on the host (removed by :meth:`teardown`)."""
        ...

    def start(self) -> None:
        """Create the sandbox and wait until its kernel is ready; clean up after itself on
        error."""
        ...

    def run_cell(
        self,
        code: str,
        *,
        timeout_s: float,
        hard_deadline: float | None,
        cancel: CellCancel | None = None,
        on_output: OutputSink | None = None,
        scope: CellScope | None = None,
    ) -> CellRun:
        """Run one cell: at most ``timeout_s`` of wall time (interrupted, state kept), and the
        whole sandbox ended at the monotonic ``hard_deadline``. Once ``cancel`` holds a reason
        (set from another thread), the cell is interrupted as at its wall time and its verdict
        says it was cancelled (:func:`~sandcell.backends.cell.verdict.classify_cell`). With
        ``on_output``, the cell's output is told to it as it is read (:class:`CappedOutput`).
        With ``scope``, the cell runs in that scope (:class:`CellScope`; the message is
        :func:`kernel_message`'s), else in the kernel's main namespace."""
        ...

    def enforcement(self) -> Enforcement: ...

    def files(self) -> list[str]:
        """Paths of the regular files in the workspace, relative to it, sorted."""
        ...

    def export(self, globs: Sequence[str], collect: Collector) -> Exported:
        """Export the workspace files matching ``globs`` through ``collect`` (the host's export
        checks) while the sandbox lives on."""
        ...

    def outputs(self, out_dir: str, store: ArtifactStore) -> DisplayCollection:
        """The rich outputs a cell left in ``out_dir`` (a path inside the sandbox), read and
        checked like any hostile export."""
        ...

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        """The modes :meth:`save` accepts on this sandbox (``files`` everywhere; ``memory``
        where the rung restores memory under the same confinement)."""
        ...

    def save(self, state_dir: Path, *, mode: PauseMode, keep_running: bool) -> SavedState:
        """Write this sandbox's state into ``state_dir`` (an empty directory the host owns)
        as :mod:`~sandcell.backends.cell.state` describes. With ``keep_running`` the sandbox goes
        on afterwards exactly as before (a snapshot, a fork); without, it is left stopped and the
        session tears it down next (a pause). Nothing may run between the save and its end: the
        session holds its lock. Raises :class:`~sandcell.backends.cell.state.PauseRefused` for a
        mode the sandbox does not offer, InfraError when the save fails (the sandbox then ends,
        unless ``keep_running`` and it is still whole)."""
        ...

    def metrics(self) -> SandboxMetrics:
        """One sample of the sandbox's CPU, memory and workspace use."""
        ...

    def teardown(self, globs: Sequence[str] = (), collect: Collector | None = None) -> Exported:
        """Stop everything in the sandbox, export what matches ``globs`` from the quiescent
        workspace through ``collect``, and remove everything. Idempotent."""
        ...


@runtime_checkable
class HeldOnNode(Protocol):
    """A cell sandbox held by another process, a cluster node's agent, not by the session's
    own: it names that node, and is told the session's idle timeout before it starts, so that
    its holder ends it once nobody has touched it for that long (the replica holding the
    session may die, and no one else can reach its sandbox)."""

    @property
    def node_id(self) -> str: ...

    def bound_idle(self, idle_timeout_s: float) -> None: ...


def lacking(sandbox: CellSandbox, what: str) -> str | None:
    """Why ``sandbox`` cannot do ``what`` (``"bash"`` cells, ``"processes"``), or None when it
    can. A rung whose sandboxes lack something names it in a ``lacking`` mapping (the wasm
    rung's: no processes in WebAssembly); the others have everything a session asks for."""
    found: dict[str, str] = getattr(sandbox, "lacking", {})
    return found.get(what)


def open_cell_sandbox(
    backend: Backend,
    request: RunRequest,
    *,
    session_id: str,
    sockets: SandboxSockets | None = None,
    restore: RestorePoint | None = None,
) -> CellSandbox:
    """The backend's live sandbox for one session (not started yet), reaching ``sockets``
    (the session's egress proxy and tool gateway) when given, and coming back from ``restore``
    (a state its :meth:`CellSandbox.save` wrote) when given: its
    :meth:`~sandcell.backends.base.Backend.session_sandbox`, the one door a session opens its
    sandbox through."""
    if restore is not None and restore.saved.backend != backend.name:
        raise ConfigError(
            f"this state was saved by the {restore.saved.backend} backend and cannot come back "
            f"on {backend.name}: resume it under a profile whose backend is "
            f"{restore.saved.backend}"
        )
    return backend.session_sandbox(request, session_id=session_id, sockets=sockets, restore=restore)


__all__ = [
    "CappedOutput",
    "CellRun",
    "CellSandbox",
    "CellScope",
    "Exported",
    "HeldOnNode",
    "PauseMode",
    "RestorePoint",
    "SandboxMetrics",
    "SavedState",
    "kernel_message",
    "lacking",
    "open_cell_sandbox",
]
