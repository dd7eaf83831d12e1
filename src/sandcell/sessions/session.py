"""A session: one sandbox kept alive across cells, like a notebook kernel.

>>> with Executor() as ex, ex.session(profile="analysis") as s:      # doctest: +SKIP
...     s.run("import math; x = 6 * 7")
...     s.run("print(math.sqrt(x))").stdout
'6.48074069840786\\n'

Every cell goes through the policy gate under the session's profile before it is sent (a denied
cell does not run and the session goes on; the run pipeline's ``prepare`` and ``finish``,
:mod:`sandcell.pipeline`, as for a one-shot run), runs in the session's one sandbox (see
:mod:`sandcell.backends.namespaces.session`; on the microVM backend one VM, see
:mod:`sandcell.backends.microvm.session`) and becomes one run in the record, with the session's
id in ``RunResult.session_id``. A cell has its own wall-time limit; memory, processes and CPU
time are limits of the whole session. A watchdog ends the session after ``idle_timeout_s``
without a cell (counted from when its sandbox is up) or at ``max_lifetime_s`` (counted from
when it was opened); a cell still running at the end of life is ended with
it. Once ended, nothing of the session is left on the host: no process, cgroup, mount or
directory.

Security limitations: see :mod:`sandcell.backends.namespaces.session`. State persisting between
cells is the point of a session, so a cell sees everything earlier cells left, including anything a
hostile cell planted; a session is one trust domain, never shared between users or tasks."""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from sandcell.artifacts import collect_exports, validate_globs
from sandcell.backends.base import BackendResult, Collector
from sandcell.backends.cell import (
    CellRun,
    CellScope,
    Exported,
    HeldOnNode,
    lacking,
    open_cell_sandbox,
)
from sandcell.backends.cell.state import PauseMode, SandboxMetrics
from sandcell.backends.cell.verdict import CellCancel
from sandcell.display import DisplayCollection
from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.inputs import inspect_inputs
from sandcell.pipeline.finish import finish
from sandcell.pipeline.prepare import prepare
from sandcell.policy.gate import admit
from sandcell.policy.profiles import Profile, load_profile
from sandcell.sessions import saving
from sandcell.sessions.bash_cell import bash_cell
from sandcell.sessions.metrics import SAMPLE_EVERY_S, MetricsHistory
from sandcell.sessions.ports import PortAccess
from sandcell.sessions.processes import ProcessControl
from sandcell.sessions.states import (
    SessionSettings,
    StateNotFound,
    StoredState,
    check_snapshot_name,
)
from sandcell.spec import (
    NODE_LANGUAGES,
    Artifact,
    InputFile,
    IsolationMode,
    Language,
    Limits,
    Outcome,
    RejectedExport,
    RunRequest,
    RunResult,
)

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.live_output import OutputListener

DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_MAX_LIFETIME_S = 3600.0
DEFAULT_PAUSED_TTL_S = 30 * 24 * 3600.0
"""How long a paused session is kept before it is swept (its own ``paused_ttl_s``)."""

OnIdle = Literal["end", "pause"]
KERNEL_LANGUAGES: tuple[Language, ...] = ("python", *sorted(NODE_LANGUAGES))
"""The languages a session's kernel runs (its ``language``)."""


class SessionEnded(ConfigError):
    """A cell was sent to a session that has ended (closed, idle, out of lifetime, or killed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """What a session is, for listings."""

    id: str
    profile: str
    backend: str
    """The rung the session's sandbox runs on (``namespaces``, ``gvisor``, ``microvm``)."""
    created_at: str
    cells: int
    idle_timeout_s: float
    max_lifetime_s: float
    ended: str | None
    """Why the session ended, or None while it is alive."""
    on_idle: str = "end"
    """What its idle timeout does: ``end`` it, or ``pause`` it."""
    parent: str | None = None
    """The session it was forked or started from."""
    language: str = "python"
    """The language of its kernel's cells (``python``, ``javascript``, ``typescript``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEnd:
    """What closing a session exported."""

    artifacts: tuple[Artifact, ...]
    rejected_exports: tuple[RejectedExport, ...]
    reason: str


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


_LIVE: weakref.WeakSet[Session] = weakref.WeakSet()
"""Sessions not closed yet: closed at interpreter exit, so a forgotten one leaves nothing."""


@atexit.register
def _close_live_sessions() -> None:
    for session in list(_LIVE):
        with contextlib.suppress(Exception):
            session.close()


class Session(ProcessControl, PortAccess):
    """One live session; open it with :meth:`sandcell.Executor.session`.

    Thread-safe: cells run one at a time. Use it as a context manager, or call :meth:`close`.
    Background processes, terminals and watches: :class:`ProcessControl`
    (:mod:`sandcell.sessions.processes`); ports: :class:`PortAccess`
    (:mod:`sandcell.sessions.ports`).
    """

    def __init__(
        self,
        executor: Executor,
        *,
        profile: Profile | str | None = None,
        limits: Limits | None = None,
        inputs: Sequence[InputFile] = (),
        mode: IsolationMode = IsolationMode.STRICT,
        landlock: bool | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
        session_id: str | None = None,
        runtime: str | None = None,
        on_idle: OnIdle = "end",
        paused_ttl_s: float = DEFAULT_PAUSED_TTL_S,
        owner: str | None = None,
        restore: StoredState | None = None,
        parent: str | None = None,
        labels: Mapping[str, str] | None = None,
        language: Language = "python",
    ) -> None:
        if language not in KERNEL_LANGUAGES:
            raise ConfigError(
                f"a session's language is the one its kernel runs: one of "
                f"{', '.join(KERNEL_LANGUAGES)}, not {language!r} (Bash cells run in any session "
                "whose profile allows them: run(code, language='bash'))"
            )
        if idle_timeout_s <= 0 or max_lifetime_s <= 0 or paused_ttl_s <= 0:
            raise ConfigError("idle_timeout_s, max_lifetime_s and paused_ttl_s must be positive")
        if on_idle not in ("end", "pause"):
            raise ConfigError(f"on_idle must be 'end' or 'pause', not {on_idle!r}")
        self.executor = executor
        self.on_idle: OnIdle = on_idle
        self.paused_ttl_s = float(paused_ttl_s)
        self.owner = owner
        """Whose session it is (the service's tenant id; None for a local user): its saved
        states are that owner's."""
        self.parent = parent
        """The session this one was forked or started from (its id), or None."""
        self.labels: Mapping[str, str] = dict(labels or {})
        """What the surface that opened the session keeps with every state saved of it (a
        pause, a snapshot, a fork point), and gets back on the session restored from one: the
        E2B API keeps its sandbox's template, metadata and token here, so a paused sandbox
        comes back as itself after the service restarts. The surface may replace it at any
        time; a save takes the one set then."""
        self.restored_from = restore
        """The saved state this session came back from, or None for a fresh one."""
        self.profile = (
            executor.profile
            if profile is None
            else profile
            if isinstance(profile, Profile)
            else load_profile(profile)
        )
        # The session's own request: the profile resolves its limits (refusing any above a
        # ceiling), its runtime, and accepts its inputs once; every cell is admitted again with
        # its code.
        base = RunRequest(
            code="",
            language=language,
            inputs=tuple(inputs),
            limits=limits,
            mode=mode,
            landlock=landlock,
            runtime=runtime,
        )
        self.request = admit(base, self.profile, cache=executor.wheels).request
        executor.check_runtime(self.request)
        backend = executor.backend_for(self.profile, runtime=self.request.runtime)
        self.id = session_id or uuid.uuid4().hex
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_lifetime_s = float(max_lifetime_s)
        self.created_at = _now()
        self.cells = restore.cells if restore is not None and restore.kind == "paused" else 0
        self._metrics = MetricsHistory()
        self._inputs_record = inspect_inputs(self.request.inputs)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._born = time.monotonic()
        self._last_active = self._born
        self._ended: str | None = None
        self._cancel: CellCancel | None = None
        """The running cell's, while one runs (see :meth:`cancel`)."""
        # One proxy, gateway and ingress gate for the whole session; each cell's record gets
        # its share.
        self._sockets = executor.open_sockets(
            self.profile, self.request, run_id=self.id, ingress=True
        )
        try:
            self._sandbox = open_cell_sandbox(
                backend,
                self.request,
                session_id=self.id,
                sockets=self._sockets.sandbox if self._sockets is not None else None,
                restore=restore.restore_point if restore is not None else None,
            )
            if isinstance(self._sandbox, HeldOnNode):
                self._sandbox.bound_idle(self.idle_timeout_s)
            self._sandbox.start()
        except BaseException:
            if self._sockets is not None:
                self._sockets.close()
            raise
        if restore is not None and restore.saved.mode is PauseMode.MEMORY:
            try:
                self._reseed()
            except BaseException:
                self._end("its restored kernel did not answer")
                raise
        # Idle from here: a start longer than the idle timeout (a microVM booting cold under
        # emulation) must not end the session before its first cell. The lifetime counts it.
        self._last_active = time.monotonic()
        self._watchdog = threading.Thread(
            target=self._watch, name=f"sandcell-session-watchdog-{self.id}", daemon=True
        )
        self._watchdog.start()
        _LIVE.add(self)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- state -----------------------------------------------------------------------------------

    @property
    def language(self) -> Language:
        """The language of the kernel's cells, chosen when the session was opened: ``python``
        (the default), ``javascript`` or ``typescript`` (a Node kernel, ``_kernel.mjs``)."""
        return self.request.language

    @property
    def ended(self) -> str | None:
        """Why the session ended, or None while it is alive."""
        return self._ended

    @property
    def sandbox_pid(self) -> int | None:
        """The host pid of the sandbox's init (for inspection and tests)."""
        return self._sandbox.sandbox_pid

    @property
    def run_dir(self) -> Path:
        """The session's run directory on the host (removed when it ends)."""
        return self._sandbox.run_dir

    @property
    def node(self) -> str | None:
        """The cluster node whose agent holds the sandbox; None when this host does."""
        return self._sandbox.node_id if isinstance(self._sandbox, HeldOnNode) else None

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            profile=self.profile.name,
            backend=self._sandbox.backend.name,
            created_at=self.created_at,
            cells=self.cells,
            idle_timeout_s=self.idle_timeout_s,
            max_lifetime_s=self.max_lifetime_s,
            ended=self._ended,
            on_idle=self.on_idle,
            parent=self.parent,
            language=self.language,
        )

    def idle_deadline(self) -> float:
        """Monotonic time at which the session ends unless a cell runs (idle or lifetime)."""
        return min(self._last_active + self.idle_timeout_s, self._born + self.max_lifetime_s)

    # -- cells -----------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        language: Language | None = None,
        timeout_s: float | None = None,
        exports: Sequence[str] = (),
        on_output: OutputListener | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        scope: str | None = None,
    ) -> RunResult:
        """Run one cell in the session; the result is also a run in the record.

        ``language`` is the session's own (None, the default) or ``bash``; a cell in another
        language than the kernel's is refused (open a session with that ``language``).
        ``language="bash"`` runs ``code`` with Bash in the session's sandbox and workspace
        (:mod:`sandcell.sessions.bash_cell`), with ``env`` added to its environment and ``cwd``
        (a path in the sandbox) as its working directory; the policy judges, and the record
        keeps, the Bash program. A Python cell shares the kernel's process, so it takes no
        ``env`` (it sets ``os.environ`` itself). ``scope`` names a namespace of the kernel's
        for a Python cell (:class:`~sandcell.backends.cell.CellScope`): its variables
        are its own, apart from the session's main namespace (no scope) and every other scope,
        until :meth:`drop_scope`; ``cwd`` is then the scope's working directory when this is
        its first cell (the kernel's own directory is put back after each cell of a scope).
        Without a scope a Python cell takes no ``cwd`` (it calls ``os.chdir`` itself).
        Modules, files and the environment are the process's, shared by every scope.
        ``timeout_s`` is this cell's wall-time limit (default: the session's ``wall_time_s``,
        never above the profile's ceiling). ``exports`` are globs of workspace files to export
        after the cell.
        ``on_output(stream, text)`` is told the cell's output while it runs, as
        :meth:`Executor.run <sandcell.executor.Executor.run>` does. Raises
        :class:`SessionEnded` once the session has ended.
        """
        language = self._cell_language(language)
        if language != "bash" and (env or (cwd is not None and scope is None)):
            raise ConfigError(
                "env= applies to Bash cells, and cwd= to Bash cells or kernel cells in a scope; "
                "a kernel cell shares the kernel's process, so set the environment or change "
                "directory in the cell instead (or give the cell a scope= with its cwd=)"
            )
        if language == "bash" and scope is not None:
            raise ConfigError(
                "scope= names a namespace of the session's kernel; a Bash cell is a program of "
                "its own, so give it cwd= and env= instead"
            )
        missing = lacking(self._sandbox, language)
        if missing is not None:
            raise ConfigError(missing)
        cell_scope = CellScope(name=scope, cwd=cwd) if scope is not None else None
        with self._lock:
            self._check_alive()
            self.executor.check_home()  # a cell whose record would be lost does not run
            limits = self.request.effective_limits
            if timeout_s is not None:
                limits = limits.with_(wall_time_s=timeout_s)
            request = replace(
                self.request, code=code, language=language, exports=tuple(exports), limits=limits
            )
            prepared = prepare(
                request,
                self.profile,
                wheels=self.executor.wheels,
                backend=lambda _: self._sandbox.backend,
            )
            request = replace(prepared.request, packages=self.request.packages)
            run_id = uuid.uuid4().hex
            started_at = _now()
            verdict = prepared.verdict
            if verdict != "allow":
                reason = (
                    prepared.denial
                    if verdict == "deny"
                    else f"the cell needs approval under profile {self.profile.name!r} "
                    f"({prepared.admission.decision.reason}), and a session cannot wait for a "
                    "person; run it with `sandcell run`, or use a profile that allows it"
                )
                br = self._not_run(reason)
            else:
                cell = request
                if language == "bash":
                    program = bash_cell(code, env=env or {}, cwd=cwd)
                    cell = replace(request, code=program, language="python")
                br = self._run_cell(cell, run_id, on_output, cell_scope)
            self.cells += 1
            result = finish(
                self.executor,
                request,
                br,
                prepared.validators,
                prepared.policy,
                backend=prepared.backend,
                run_id=run_id,
                started_at=started_at,
                inputs=self._inputs_record,
                session_id=self.id,
                outside=self._sockets.take_record() if self._sockets is not None else None,
                secrets=self._sockets.secrets if self._sockets is not None else (),
            )
            self._last_active = time.monotonic()
            if self._sandbox.ended is not None and self._ended is None:
                self._end(self._sandbox.ended)
            self._wake.set()
            return result

    def _cell_language(self, language: Language | None) -> Language:
        """A cell's language: the kernel's, or Bash (run by a Python kernel)."""
        if language is None or language == self.language:
            return self.language
        if language == "bash" and self.language == "python":
            return language
        if language == "bash":
            raise ConfigError(
                f"a {self.language} session runs no Bash cells: its Node kernel may not start "
                "programs (Node's permission model refuses child processes); run Bash in a "
                "Python session or as a run of its own (sandcell run --lang bash)"
            )
        raise ConfigError(
            f"this session's kernel runs {self.language} cells, not {language}; open a session "
            f"with language={language!r} for them"
        )

    def _run_cell(
        self,
        request: RunRequest,
        run_id: str,
        on_output: OutputListener | None = None,
        scope: CellScope | None = None,
    ) -> BackendResult:
        timeout = request.effective_limits.wall_time_s
        live = self.executor.live_output(
            on_output, request, secrets=self._sockets.secrets if self._sockets is not None else ()
        )
        self._cancel = CellCancel()
        try:
            cell = self._sandbox.run_cell(
                request.code,
                timeout_s=timeout,
                hard_deadline=self._born + self.max_lifetime_s,
                cancel=self._cancel,
                on_output=live,
                scope=scope,
            )
        finally:
            self._cancel = None
            if live is not None:
                live.close()
        shown = self._outputs(cell)
        artifacts: tuple[Artifact, ...] = ()
        rejected: tuple[RejectedExport, ...] = ()
        if request.exports:
            globs = validate_globs(request.exports)
            artifacts, rejected = self._sandbox.export(globs, self._collector(globs))
        return BackendResult(
            outcome=cell.outcome,
            exit_code=cell.exit_code,
            signal=cell.signal,
            stdout=cell.stdout,
            stderr=cell.stderr,
            stdout_truncated=cell.stdout_truncated,
            stderr_truncated=cell.stderr_truncated,
            usage=cell.usage,
            artifacts=artifacts,
            rejected_exports=rejected + shown.rejected,
            enforcement=self._sandbox.enforcement(),
            reason=cell.reason,
            outputs=shown.outputs,
        )

    def _outputs(self, cell: CellRun) -> DisplayCollection:
        """The cell's rich outputs, read from the live sandbox like any hostile export."""
        if cell.out_dir is None or cell.session_ended is not None:
            return DisplayCollection()
        return self._sandbox.outputs(cell.out_dir, self.executor.store)

    def _collector(self, globs: tuple[str, ...]) -> Collector:
        store, limits = self.executor.store, self.executor.export_limits
        return lambda view: collect_exports(view, globs, store, limits)

    def _not_run(self, reason: str) -> BackendResult:
        return BackendResult.not_run(Outcome.DENIED, reason, self._sandbox.enforcement())

    def cancel(self, reason: str = "asked to stop") -> bool:
        """Stop the cell now running, from any thread: it is interrupted as at its wall time
        (SIGINT; the session and its state are kept) and its result is ``killed`` with the
        reason ``cancelled: REASON``; a cell that does not stop within the interrupt's grace
        ends the session, as a timed-out one does. False when no cell is running. A cell
        that ends on its own first (or handles the interrupt and returns) keeps its outcome."""
        cancel = self._cancel
        if cancel is None:
            return False
        cancel.request(reason)
        return True

    def drop_scope(self, name: str) -> None:
        """Forget the kernel namespace ``scope=name`` (its variables, its directory): its next
        cell starts it afresh. Nothing runs, so it is no run in the record; a scope never
        used is no error. Raises :class:`SessionEnded` once the session has ended, and
        InfraError when the kernel does not answer (which ends the session)."""
        with self._lock:
            self._check_alive()
            cell = self._sandbox.run_cell(
                "",
                timeout_s=self.request.effective_limits.wall_time_s,
                hard_deadline=self._born + self.max_lifetime_s,
                scope=CellScope(name=name, drop=True),
            )
            self._last_active = time.monotonic()
            if self._sandbox.ended is not None and self._ended is None:
                self._end(self._sandbox.ended)
            self._wake.set()
            if cell.outcome is not Outcome.OK:
                raise InfraError(f"the session's kernel did not drop scope {name!r}: {cell.reason}")

    def files(self) -> list[str]:
        """Paths of the regular files in the session's workspace, relative to it, sorted."""
        with self._lock:
            self._check_alive()
            return self._sandbox.files()

    # -- lasting: pause, snapshot, fork, metrics ---------------------------------------------

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        """The modes :meth:`pause`, :meth:`snapshot` and :meth:`fork` accept on this session's
        rung (``files`` everywhere, ``memory`` where the rung restores memory under the same
        confinement: gVisor and microVM)."""
        return self._sandbox.pause_modes

    def pause(
        self, *, mode: PauseMode | str = PauseMode.MEMORY, by: str | None = None
    ) -> StoredState:
        """Pause the session: its state (``memory``: variables, processes and files; ``files``:
        the workspace's files only) is saved under the home, its sandbox ends, and nothing of it
        runs or holds memory until :meth:`Executor.resume <sandcell.executor.Executor.resume>`
        brings it back under its id, profile and limits. The paused state expires after the
        session's ``paused_ttl_s``. A mode the rung does not offer raises
        :class:`~sandcell.backends.cell.state.PauseRefused` and the session goes on; a save that
        fails ends the session (InfraError). ``by`` names who asked, for the record."""
        with self._lock:
            self._check_alive()
            return self._pause_locked(PauseMode(mode), by=by)

    def _pause_locked(self, mode: PauseMode, *, by: str | None) -> StoredState:
        started_at = _now()
        state = saving.save(
            self, kind="paused", mode=mode, keep_running=False, state_id=self.id, end_as="paused"
        )
        return saving.record(self, "pause", state, started_at=started_at, by=by)

    def snapshot(
        self,
        name: str,
        *,
        mode: PauseMode | str = PauseMode.MEMORY,
        ttl_s: float | None = None,
        by: str | None = None,
    ) -> StoredState:
        """Keep a named copy of the session's state (an existing snapshot of that name is
        replaced); the session goes on. New sessions start from it with
        :meth:`Executor.session(snapshot=name) <sandcell.executor.Executor.session>`.
        ``ttl_s``: removed after that many seconds (None: kept until deleted)."""
        check_snapshot_name(name)
        with self._lock:
            self._check_alive()
            started_at = _now()
            mode = PauseMode(mode)
            states = self.executor.states
            try:
                old = states.find_snapshot(name, owner=self.owner)
            except StateNotFound:
                old = None
            state = saving.save(
                self,
                kind="snapshot",
                mode=mode,
                keep_running=True,
                state_id=old.id if old is not None else uuid.uuid4().hex,
                name=name,
                ttl_s=ttl_s,
            )
            return saving.record(self, "snapshot", state, started_at=started_at, by=by)

    def fork(
        self, n: int = 1, *, mode: PauseMode | str = PauseMode.MEMORY, by: str | None = None
    ) -> list[Session]:
        """``n`` (1 to :data:`MAX_FORKS`) new sessions, each a copy of this one as it is now
        (``memory``: variables, processes and files; ``files``: the files), with its own id,
        limits, workspace and record; this session goes on. Each copy's kernel gets fresh
        entropy and reseeds Python's ``random`` (as after ``os.fork``); state a program
        seeded itself (a numpy ``Generator``, ``random.Random(42)``) is copied as it is."""
        saving.check_forks(n)
        started_at = _now()
        state = self.fork_point(mode=mode)
        try:
            return saving.open_forks(
                self.executor, state, n, started_at=started_at, by=by, parent=self
            )
        finally:
            saving.drop(self.executor, state)

    def fork_point(self, *, mode: PauseMode | str = PauseMode.MEMORY) -> StoredState:
        """Save the session as it is now as the point copies are restored from (a ``fork``
        state; the session goes on): what :meth:`fork` opens its copies from in this process,
        for a caller whose copies each live in a process of their own (the CLI's session
        servers). That caller records the ``fork`` event once they started and deletes the
        state; one it abandons expires after :data:`~sandcell.sessions.saving.FORK_STATE_TTL_S`."""
        with self._lock:
            self._check_alive()
            return saving.save(
                self,
                kind="fork",
                mode=PauseMode(mode),
                keep_running=True,
                state_id=uuid.uuid4().hex,
            )

    def metrics(self, since: str | None = None, *, fresh: bool = False) -> list[SandboxMetrics]:
        """The session's resource samples taken at or after ``since`` (ISO 8601; None: all
        kept), oldest first, with one taken now when no cell runs (see
        :mod:`sandcell.sessions.metrics`). ``fresh``: the newest is taken now, waiting for a
        running cell (or the watchdog's own sample) to finish, for a caller that decides on it;
        so is the first, when none was kept yet (the watchdog may be taking it)."""
        wait = fresh or self._metrics.last is None
        if self._ended is None and self._lock.acquire(blocking=wait):
            try:
                if self._ended is None:
                    self._sample()
            finally:
                self._lock.release()
        return self._metrics.since(since)

    def settings(self) -> SessionSettings:
        """What the session was opened with (kept with its saved states)."""
        r = self.request
        return SessionSettings(
            profile=self.profile.name,
            limits=asdict(r.effective_limits),
            inputs=tuple((str(i.host_path), i.name) for i in r.inputs),
            mode=r.mode.value,
            landlock=r.landlock,
            runtime=r.runtime,
            language=r.language,
            idle_timeout_s=self.idle_timeout_s,
            max_lifetime_s=self.max_lifetime_s,
            on_idle=self.on_idle,
            paused_ttl_s=self.paused_ttl_s,
        )

    def _reseed(self) -> None:
        """After a memory restore: reseed the kernel's ``random`` from its (fresh) entropy, in a
        scope of its own that is dropped after, so no variable of the session changes."""
        scope = CellScope(name=".sandcell-restored")
        code = "import sys\nif 'random' in sys.modules:\n    sys.modules['random'].seed()\n"
        for cell_scope in (scope, CellScope(name=scope.name, drop=True)):
            cell = self._sandbox.run_cell(
                code,
                timeout_s=self.request.effective_limits.wall_time_s,
                hard_deadline=self._born + self.max_lifetime_s,
                scope=cell_scope,
            )
            if cell.outcome is not Outcome.OK:
                raise InfraError(f"the restored session's kernel did not reseed: {cell.reason}")

    # -- the end -----------------------------------------------------------------------------

    def close(self, *, exports: Sequence[str] = ()) -> SessionEnd:
        """End the session, exporting the workspace files matching ``exports`` first (once
        nothing in the sandbox runs any more). Idempotent; exports need a live session."""
        with self._lock:
            if self._ended is not None:
                if exports:
                    raise SessionEnded(
                        f"session {self.id} has ended ({self._ended}); nothing can be exported"
                    )
                return SessionEnd(artifacts=(), rejected_exports=(), reason=self._ended)
            for glob in exports:
                if not self.profile.allows_export(glob):
                    raise ConfigError(
                        f"profile {self.profile.name!r} does not allow exporting {glob!r}"
                    )
            globs = validate_globs(tuple(exports))
            artifacts, rejected = self._end("closed", globs)
            return SessionEnd(artifacts=artifacts, rejected_exports=rejected, reason="closed")

    def _end(self, reason: str, globs: tuple[str, ...] = ()) -> Exported:
        self._ended = reason
        self._wake.set()
        self._close_ports()
        try:
            return self._sandbox.teardown(globs, self._collector(globs) if globs else None)
        finally:
            if self._sockets is not None:
                # What a cell's leftover process did after the last cell is not any cell's;
                # connections from outside to its ports are recorded all the same.
                left = self._sockets.close()
                with contextlib.suppress(SandcellError):
                    self._record_leftover_ingress(left, self._sandbox.backend.name)

    def _check_alive(self) -> None:
        if self._ended is not None:
            raise SessionEnded(f"session {self.id} has ended ({self._ended}); start a new session")

    def _watch(self) -> None:
        next_sample = time.monotonic()
        while self._ended is None:
            now = time.monotonic()
            self._wake.wait(timeout=max(min(self.idle_deadline(), next_sample) - now, 0.01))
            self._wake.clear()
            if self._ended is not None:
                return
            now = time.monotonic()
            idle = now >= self.idle_deadline()
            if not idle and now < next_sample:
                continue
            # A running cell holds the lock; it enforces the lifetime itself and refreshes idle.
            if not self._lock.acquire(blocking=False):
                self._wake.wait(timeout=1.0)
                continue
            try:
                now = time.monotonic()
                if self._ended is None and now >= self.idle_deadline():
                    if now >= self._born + self.max_lifetime_s:
                        why = f"maximum lifetime of {self.max_lifetime_s:g} s reached"
                    else:
                        why = f"idle for {self.idle_timeout_s:g} s (idle timeout)"
                    if self.on_idle == "pause":
                        self._pause_on_idle(why)
                    else:
                        self._end(why)
                elif self._ended is None and now >= next_sample:
                    next_sample = now + SAMPLE_EVERY_S
                    self._sample()
            finally:
                self._lock.release()

    def _sample(self) -> None:
        """One metrics sample; a sandbox that cannot be sampled just now is not an error of the
        session (the next cell finds out whether it is alive)."""
        with contextlib.suppress(SandcellError):
            self._metrics.add(self._sandbox.metrics())

    def _pause_on_idle(self, why: str) -> None:
        """``on_idle = "pause"``: pause in the best mode the rung offers (memory, else files),
        and end the session as usual when even that fails."""
        mode = PauseMode.MEMORY if PauseMode.MEMORY in self.pause_modes else PauseMode.FILES
        try:
            self._pause_locked(mode, by=f"on_idle ({why})")
        except SandcellError:
            if self._ended is None:
                self._end(why)


__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_LIFETIME_S",
    "DEFAULT_PAUSED_TTL_S",
    "OnIdle",
    "Session",
    "SessionEnd",
    "SessionEnded",
    "SessionInfo",
]
