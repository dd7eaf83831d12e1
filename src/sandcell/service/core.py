"""The service's state: one executor, the stores, the runs in flight, the live sessions.

Every endpoint is a thin layer over :class:`Service`, and :class:`Service` over the one
:class:`~sandcell.executor.Executor`: a run over HTTP is admitted, run, validated and recorded by
exactly the code an in-process run goes through. The executor blocks, so its calls run on
worker threads, at most ``workers`` at once; the rest wait in the queue the metrics show.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandcell.backends.warm import WarmStats
from sandcell.errors import SandcellError
from sandcell.executor import Executor
from sandcell.home import bulk_dir
from sandcell.live_output import OutputListener
from sandcell.policy.approvals import Ticket
from sandcell.policy.profiles import Profile, load_profile
from sandcell.service import saved_sessions
from sandcell.service.audit_verification import AuditVerifications
from sandcell.service.kept_bytes import held_bytes, state_bytes
from sandcell.service.local_owner import LOCAL_TENANT
from sandcell.service.metrics import Metrics
from sandcell.service.models import RunStatusName
from sandcell.service.problems import ServiceProblem
from sandcell.service.profile_cache import ProfileCache
from sandcell.service.quotas import Quotas
from sandcell.service.replica import replica_state
from sandcell.service.tenants import Tenant, TenantStore
from sandcell.sessions import Session, saving
from sandcell.spec import InputFile, Outcome, RunRequest, RunResult, result_to_dict
from sandcell.wire import error_wire

__all__ = ["RunState", "Service", "ServiceConfig"]

if TYPE_CHECKING:
    from sandcell.cluster import Cluster as Placement
    from sandcell.cluster.wire import NodeReport

log = logging.getLogger("sandcell.service")
_INPUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CANCEL_POLL_S = 0.05
_KEPT_RUNS = 1_000
"""Finished runs whose state (events, result) stays in memory; older ones answer from their
record, which holds the whole result, so this only saves reading it back."""
_KEPT_OUTPUT_CHARS = 64 * 1024 * 1024
"""And at most this much of their output (a run's own caps allow megabytes each): a soak of
10,000 runs grew the service by 330 MiB when only the count bounded what it kept."""
OUTPUT_KEPT_CHARS = 1024 * 1024
"""Live output of one run kept for its event stream (a late subscriber gets it from the
start); the run's own caps bound it too."""
OUTPUT_KEPT_S = 60.0
"""How long a finished run's live output stays for its event stream; then only its status and
result events are kept (the result has the output)."""
OUTPUT_EVENTS = frozenset({"stdout", "stderr", "output_limit"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """How the service is set up (``sandcell serve`` options)."""

    home: Path
    workers: int = 16
    """Executor calls at once (runs, cells, session starts); more wait in the queue."""
    max_body_bytes: int = 8 * 1024 * 1024
    max_code_bytes: int = 512 * 1024
    drain_timeout_s: float = 300.0
    """How long a graceful stop waits for runs in flight."""
    advertise: str = ""
    """The base URL other replicas reach this one at (``--advertise``): requests for the
    sessions and runs it holds are forwarded there (:mod:`sandcell.service.forwarding`)."""
    local_tenant: str | None = None
    """The tenant a keyless request from the service's own user on the Unix socket acts as;
    None: the built-in ``@local`` (see :mod:`sandcell.service.local_owner`)."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names ``/mcp`` answers besides the loopback ones (a proxy's or a LAN name)."""
    metrics_key_sha256: str | None = None
    """The SHA-256 of the operator key ``/metrics`` asks for from any address
    (``--metrics-key-file``); None: ``/metrics`` answers loopback and the local socket only."""


@dataclass(slots=True, kw_only=True)
class RunState:
    """One run the service accepted, from queued to finished (kept in memory; the record is
    the durable part)."""

    id: str
    tenant: str
    """The id of the tenant it runs for (:attr:`Tenant.id`, never its name)."""
    status: RunStatusName = "queued"
    result: dict[str, object] | None = None
    cancel_requested: bool = False
    error: Exception | None = None
    """What the executor raised instead of returning a result (a request it refused)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    noted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the run is in the directory of runs in flight (where replicas share one, else
    at once): an asynchronous run's 202 waits for it, so that another replica asked about the
    run just after forwards to this one instead of answering 404."""
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    events: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    output_chars: int = 0
    """Live output kept in :attr:`events` so far (at most :data:`OUTPUT_KEPT_CHARS`)."""
    stdin: tuple[str, int] | None = None
    """``(sha256, size)`` of its stdin, which its record keeps: counted as the tenant's."""
    code: str = ""
    language: str = ""
    """What it runs: kept with the run while it is in flight, for the record of a run whose
    replica is lost (:mod:`sandcell.service.replica`)."""

    def kept_chars(self) -> int:
        """The output this state holds: its result's streams and its live output events."""
        streams = (self.result or {}).get("stdout"), (self.result or {}).get("stderr")
        return self.output_chars + sum(len(v) for v in streams if isinstance(v, str))

    async def emit(self, kind: str, data: dict[str, object]) -> None:
        async with self.changed:
            self.events.append((kind, data))
            self.changed.notify_all()

    def add_output(self, stream: str, text: str) -> None:
        """Keep a piece of live output as a ``stdout``/``stderr`` event (on the event loop).

        Bounded: past :data:`OUTPUT_KEPT_CHARS` one ``output_limit`` event says so and later
        output is not streamed (the result still has all of it, up to the run's caps)."""
        if self.output_chars >= OUTPUT_KEPT_CHARS:
            return
        self.output_chars += len(text)
        if self.output_chars > OUTPUT_KEPT_CHARS:
            event = ("output_limit", {"id": self.id, "kept_chars": OUTPUT_KEPT_CHARS})
        else:
            event = (stream, {"id": self.id, "text": text})
        # Appended now, in the order the run wrote it; the waiters are woken by a task (the
        # condition's lock cannot be taken outside a coroutine), and a waiter checks the list
        # under that lock before it waits, so none misses it.
        self.events.append(event)
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def forget_output(self) -> None:
        """Drop the live output of a finished run (its result has it): the state of a finished
        run stays in memory long after anyone streams it. Positions in :attr:`events` are kept,
        so a subscriber part way through goes on from where it was."""
        for i, (kind, _) in enumerate(self.events):
            if kind in OUTPUT_EVENTS:
                self.events[i] = ("", {})


@dataclass(slots=True, kw_only=True)
class LiveSession:
    tenant: str
    """The id of the tenant it belongs to (:attr:`Tenant.id`, never its name)."""
    session: Session
    inputs_dir: Path | None
    key_sha256: str = ""
    """The hash of the tenant key it was opened with: rotating that key (or removing the
    tenant) ends it (:meth:`Service.reap_sessions`)."""
    released: bool = False
    surface: str = "http"
    """Where it was opened: ``http`` (``/v1/sessions``) or ``mcp`` (an MCP client's, held
    here only for the tenant's quota and the graceful stop; MCP ties it to its connection, so
    the HTTP endpoints neither list nor drive it)."""


def _decode_files(files: Mapping[str, str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, encoded in files.items():
        if not _INPUT_NAME.match(name):
            raise ServiceProblem(
                400,
                f"files: {name!r} is not a usable file name (letters, digits, '.', '_', '-'; "
                "no directories)",
            )
        try:
            out[name] = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ServiceProblem(400, f"files.{name}: not valid base64") from None
    return out


class Service:
    """Holds the executor and the stores; runs requests for tenants."""

    def __init__(self, config: ServiceConfig, executor: Executor) -> None:
        self.config = config
        self.executor = executor
        self.tenants = TenantStore.in_home(config.home)
        self.replica = replica_state(address=config.advertise)
        """This replica's shared rows when replicas share a PostgreSQL database (else None):
        quotas counted across replicas, runs in flight noted until answered."""
        self.nodes: Callable[[], Sequence[NodeReport]] | None = None
        """The reports of the cluster's nodes when runs go to a cluster (their /metrics)."""
        self.cluster: Placement | None = None
        """The cluster runs go to, if any (see :meth:`use_cluster`)."""
        self.quotas = Quotas(
            self.tenants, states=lambda tenant: state_bytes(executor, tenant), shared=self.replica
        )
        saving.on_event(executor, saved_sessions.event_listener(self))
        self.metrics = Metrics()
        self.runs: dict[str, RunState] = {}
        self._ended: dict[str, int] = {}
        """The finished runs among :attr:`runs`, each with the output it held when it ended
        (:meth:`_note_ended`); their sum is :attr:`_ended_chars`."""
        self._ended_chars = 0
        self.sessions: dict[str, LiveSession] = {}
        self._sessions_lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = anyio.CapacityLimiter(config.workers)
        self._threads = anyio.CapacityLimiter(config.workers)
        self._session_threads = anyio.CapacityLimiter(max(4, config.workers))
        self.queued = 0
        self.draining = False
        self.on_stop: list[Callable[[], Awaitable[None]]] = []
        """Called by a graceful stop once the runs in flight are over, before the sessions end
        (the E2B API pauses its sandboxes whose timeout pauses them, so they outlive it)."""
        self._profiles_used: set[str] = set()
        self._profiles = ProfileCache()
        self.inputs_root = bulk_dir(config.home) / "service" / "inputs"
        self.audit_verifications = AuditVerifications(
            audit=executor.audit.path, service_db=self.tenants.path
        )

    # -- profiles and inputs -----------------------------------------------------------------

    def profile_for(self, tenant: Tenant, name: str | None) -> Profile:
        """The profile a request names (default: the tenant's first), if the tenant may use
        it."""
        chosen = name or tenant.profiles[0]
        if chosen not in tenant.profiles:
            raise ServiceProblem(
                403,
                f"profile {chosen!r} is not one of tenant {tenant.name!r}'s profiles "
                f"({', '.join(tenant.profiles)})",
            )
        profile = self._profiles.load(chosen)
        self._profiles_used.add(profile.name)
        return profile

    def check_backend(self, profile: Profile, requested: str | None) -> None:
        if requested is None:
            return
        from sandcell.backends.registry import check_name

        wanted = check_name(requested)
        serving = self.executor.backend_for(profile).name
        if wanted != serving:
            raise ServiceProblem(
                400,
                f"this service runs profile {profile.name!r} on backend {serving!r}, not "
                f"{wanted!r}; leave backend out, or ask for a profile that runs there",
            )

    def write_inputs(
        self, key: str, files: Mapping[str, str]
    ) -> tuple[Path | None, tuple[InputFile, ...]]:
        decoded = _decode_files(files)
        if not decoded:
            return None, ()
        folder = self.inputs_root / key
        folder.mkdir(mode=0o700, parents=True)
        inputs = []
        for name, data in decoded.items():
            path = folder / name
            path.write_bytes(data)
            inputs.append(InputFile(host_path=path, name=name))
        return folder, tuple(inputs)

    def drop_inputs(self, request: RunRequest) -> None:
        """Remove the uploaded input files of a request that has been decided (they were kept
        while it waited for approval)."""
        root = self.inputs_root.resolve()
        for item in request.inputs:
            folder = item.host_path.parent
            if folder.resolve().parent == root:
                shutil.rmtree(folder, ignore_errors=True)

    def check_code(self, code: str) -> None:
        size = len(code.encode("utf-8", errors="surrogatepass"))
        if size > self.config.max_code_bytes:
            raise ServiceProblem(
                413,
                f"code: {size} bytes, over the service's limit of {self.config.max_code_bytes}; "
                "send a shorter program (data belongs in files)",
            )

    # -- runs -----------------------------------------------------------------------------------

    def admit(self, tenant: Tenant, *, sandbox: bool, adding: int = 0) -> None:
        """Take the quota for one start (see :meth:`Quotas.start`), after giving back the slots
        of sessions that ended on their own; 429 over a quota (``adding``: the bytes it may
        leave stored, :func:`~sandcell.service.kept_bytes.submission_bytes`)."""
        if sandbox:
            self.reap_sessions()
        self.quotas.start(
            tenant, sandbox=sandbox, adding=adding, settle=lambda: self.settle_decided(tenant.id)
        )

    def new_run(self, tenant: Tenant) -> RunState:
        # Mapped to the tenant in the store when it ends (one write per run, see own_result);
        # until then the state in memory answers for it.
        state = RunState(id=uuid.uuid4().hex, tenant=tenant.id)
        self._forget_finished()
        self.runs[state.id] = state
        return state

    def _forget_finished(self) -> None:
        # The oldest finished runs go first (dicts keep insertion order); runs in flight stay.
        # Their output is counted once as each ends, not summed over all of them here: this is
        # on every run's path, and walking the up to _KEPT_RUNS runs kept took 1.3 ms of the
        # event loop per request on the 2-core host once a service had run a thousand.
        gone: list[str] = []
        for key in self.runs:
            if len(self.runs) - len(gone) < _KEPT_RUNS and self._ended_chars <= _KEPT_OUTPUT_CHARS:
                break
            chars = self._ended.pop(key, None)
            if chars is not None:
                gone.append(key)
                self._ended_chars -= chars
        for key in gone:
            del self.runs[key]

    def _note_ended(self, state: RunState) -> None:
        """Mark ``state`` finished, its output counted among what is kept."""
        state.done.set()
        if self.runs.get(state.id) is state:
            chars = state.kept_chars()
            self._ended[state.id] = chars
            self._ended_chars += chars

    def start(
        self,
        state: RunState,
        call: Callable[[str], RunResult],
        *,
        cleanup: Callable[[RunResult | None], None] | None = None,
    ) -> asyncio.Task[None]:
        """Run ``call(run_id)`` for ``state`` in the background (the quota slot already taken);
        the task is kept until it ends so that a graceful stop can wait for it."""
        task = asyncio.get_running_loop().create_task(self._drive(state, call, cleanup))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _drive(
        self,
        state: RunState,
        call: Callable[[str], RunResult],
        cleanup: Callable[[RunResult | None], None] | None,
    ) -> None:
        began = time.monotonic()
        result: RunResult | None = None
        try:
            if self.replica is not None:
                # Noted while queued already: another replica asked about it forwards here.
                await anyio.to_thread.run_sync(self._note_started, state)
            state.noted.set()
            await state.emit("status", {"id": state.id, "status": "queued"})
            self.queued += 1
            try:
                await self._slots.acquire()
            finally:
                self.queued -= 1
            try:
                state.status = "running"
                await state.emit("status", {"id": state.id, "status": "running"})
                if state.cancel_requested:
                    self._keep_cancelling(state)
                ran, state.result = await anyio.to_thread.run_sync(
                    self._run_and_map, state, call, limiter=self._threads
                )
                result = ran
            finally:
                self._slots.release()
            self.metrics.finished(ran.outcome.value, time.monotonic() - began)
        except Exception as exc:
            # The executor raises only for a request it cannot accept at all, or a store that
            # failed; the client of an asynchronous run learns it from the run's status.
            if not error_wire(exc).public:  # kept to the log (sandcell.wire)
                log.error("run %s of tenant %s failed", state.id, state.tenant, exc_info=exc)
            state.error = exc
            with contextlib.suppress(Exception):
                self.tenants.own(state.tenant, "run", [state.id])
            state.result = _failure(state.id, exc)
            self.metrics.finished("error", time.monotonic() - began)
        finally:
            if self.replica is not None:
                with contextlib.suppress(Exception):
                    await anyio.to_thread.run_sync(self.replica.run_finished, state.id)
            self.quotas.release(state.tenant)
            if cleanup is not None:
                with contextlib.suppress(Exception):
                    cleanup(result)
            state.status = "finished"
            state.noted.set()  # a run that failed before it was noted: its 202 waits no more
            await state.emit(
                "result", {"id": state.id, "status": "finished", "result": state.result}
            )
            self._note_ended(state)
            if state.output_chars:
                asyncio.get_running_loop().call_later(OUTPUT_KEPT_S, state.forget_output)

    def use_cluster(self, cluster: Placement) -> None:
        """Runs go to ``cluster``'s nodes: its reports feed /metrics, and each run's node is
        noted in this replica's runs in flight once placed (a sweep after this replica's
        death cancels it there)."""
        self.cluster = cluster
        self.nodes = cluster.reports
        if self.replica is not None:
            cluster.on_placed = self._note_placed

    def _note_placed(self, run_id: str, node: str) -> None:
        assert self.replica is not None
        if run_id in self.runs:  # a run of this service, noted in flight (not a session's cell)
            self.replica.run_placed(run_id, node)

    def _note_started(self, state: RunState) -> None:
        """Note the run as this replica's until it is answered (see replica.py); a database
        that is down then does not stop the run: only the note of it is missing."""
        assert self.replica is not None
        try:
            self.replica.run_started(
                state.id, state.tenant, code=state.code, language=state.language
            )
        except SandcellError as exc:
            log.warning("run %s: cannot note it as in flight: %s", state.id, exc)

    @staticmethod
    def output_listener(state: RunState) -> OutputListener:
        """An ``on_output`` for the executor that turns the run's live output into events of
        ``state`` (called from the run's delivery thread; hops to the event loop)."""
        loop = asyncio.get_running_loop()

        def on_output(stream: str, text: str) -> None:
            # Raises once the loop is closed: the live output then stops (live_output.py).
            loop.call_soon_threadsafe(state.add_output, stream, text)

        return on_output

    def _run_and_map(
        self, state: RunState, call: Callable[[str], RunResult]
    ) -> tuple[RunResult, dict[str, object]]:
        """On the worker thread: the run, its mapping to the tenant (a write to the service's
        store) and its JSON form, so that the event loop has only the answer left to do."""
        result = call(state.id)
        try:
            self.own_result(state.tenant, result, state.id, stdin=state.stdin)
        except SandcellError as exc:
            # The run happened and is recorded; only the tenant's view of it is missing.
            log.error(
                "run %s of tenant %s: cannot map it to its tenant: %s", state.id, state.tenant, exc
            )
        return result, result_to_dict(result)

    def own_result(
        self,
        tenant: str,
        result: RunResult,
        run_id: str | None = None,
        *,
        stdin: tuple[str, int] | None = None,
    ) -> None:
        """Map what the run made to its tenant: its record(s), its approval, its artifacts,
        the stdin its record keeps (``stdin``: its sha256 and size), each with the bytes it
        counts against the tenant's stored-bytes quota (a held run: its request and inputs)."""
        approval = (result.policy or {}).get("approval")
        found = None
        if isinstance(approval, Mapping):
            found = approval.get("id") or approval.get("approval_id")
        artifacts = [(a.sha256, a.size) for a in result.artifacts]
        artifacts += [(a.sha256, a.size) for o in result.outputs for a in o.artifacts]
        ran = result.outcome not in (Outcome.AWAITING_APPROVAL, Outcome.DENIED)
        if stdin is not None and ran and self.executor.store.path_for(stdin[0]).is_file():
            artifacts.append(stdin)  # kept by its sha256 with the record, as an artifact is
        cpu_ms = result.usage.cpu_ms if result.usage.cpu_ms is not None else result.usage.wall_ms
        self.tenants.record_run(
            tenant,
            # A run that did not start (denied, waiting) has a record id of its own.
            runs=[result.run_id] if run_id in (None, result.run_id) else [run_id, result.run_id],
            approvals=[found] if isinstance(found, str) else [],
            artifacts=artifacts,
            cpu_ms=cpu_ms,
        )
        if isinstance(found, str) and result.outcome is Outcome.AWAITING_APPROVAL:
            held = held_bytes(self.executor.approvals.get(found))
            self.tenants.set_size(tenant, "approval", found, held)

    def settle_decided(self, tenant: str) -> bool:
        """Settle the tenant's held runs that were decided without the service knowing (on the
        host's command line, or an E2B cell's approval); whether any was."""
        held = self.tenants.counted(tenant, "approval")
        decided = [
            t for t in self.executor.approvals.get_many(held).values() if t.status != "pending"
        ]
        for ticket in decided:
            self.settle_approval(tenant, ticket)
        return bool(decided)

    def settle_approval(self, tenant: str, ticket: Ticket) -> None:
        """A held run was decided (it ran, or was denied): its uploaded inputs are deleted and
        it no longer counts against the tenant's stored bytes."""
        self.drop_inputs(ticket.request)
        self.tenants.set_size(tenant, "approval", ticket.id, 0)

    def cancel(self, state: RunState) -> None:
        """Ask for the run to stop; it ends ``killed`` (and is recorded) once its sandbox is
        reached. A run still queued is stopped as soon as it starts."""
        if state.done.is_set() or state.cancel_requested:
            return
        state.cancel_requested = True
        if state.status == "running":
            self._keep_cancelling(state)

    def _keep_cancelling(self, state: RunState) -> None:
        async def loop() -> None:
            # The run registers its sandbox a moment after it starts: ask until it has ended.
            while not state.done.is_set():
                self.executor.cancel(state.id, "cancelled through the service")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.done.wait(), _CANCEL_POLL_S)

        task = asyncio.get_running_loop().create_task(loop())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def state_for(self, tenant: Tenant, run_id: str) -> RunState | None:
        state = self.runs.get(run_id)
        if state is None or state.tenant != tenant.id:
            return None
        return state

    async def in_thread(self, fn: Callable[[], Any], *, session: bool = False) -> Any:
        limiter = self._session_threads if session else self._threads
        return await anyio.to_thread.run_sync(fn, limiter=limiter)

    # -- sessions -------------------------------------------------------------------------------

    def holds(self, kind: str, key: str) -> bool:
        """Whether this replica holds the session or the run ``key`` (the others forward
        requests for it here)."""
        if kind == "session":
            return key in self.sessions
        return key in self.runs

    def add_session(self, live: LiveSession) -> None:
        if self.replica is not None:
            self.replica.place_session(
                live.session.id,
                tenant=live.tenant,
                # The node holding its sandbox on a cluster (a sweep ends it there).
                node=getattr(live.session, "node", None) or socket.gethostname(),
                profile=live.session.profile.name,
            )
        with self._sessions_lock:
            old = self.sessions.get(live.session.id)
            self.sessions[live.session.id] = live
        if old is not None and old is not live:
            # A resumed session takes the id of its paused self, which an idle pause may have
            # left here unreaped: its slot is given back now.
            self.end_session(old)
        self.tenants.own(live.tenant, "session", [live.session.id])

    def live_sessions(self, tenant: Tenant) -> list[LiveSession]:
        with self._sessions_lock:
            mine = [
                live
                for live in self.sessions.values()
                if live.tenant == tenant.id and live.surface == "http"
            ]
        # Opened with a key since rotated: ended, not listed to the new key.
        self._end_revoked([live for live in mine if live.key_sha256 != tenant.key_sha256])
        return [live for live in mine if live.key_sha256 == tenant.key_sha256]

    def session_for(self, tenant: Tenant, session_id: str) -> LiveSession:
        with self._sessions_lock:
            live = self.sessions.get(session_id)
        if live is None or live.tenant != tenant.id or live.surface != "http":
            raise ServiceProblem(404, f"no session {session_id!r}")
        if live.key_sha256 != tenant.key_sha256:
            # Opened with a key since rotated: it ends, it is not handed to the new key.
            self._end_revoked([live])
            raise ServiceProblem(404, f"no session {session_id!r}")
        return live

    def end_session(self, live: LiveSession) -> None:
        """Forget a session that has ended, and give back its quota slot (once)."""
        with self._sessions_lock:
            if self.sessions.get(live.session.id) is live:  # not a resumed one of its id
                del self.sessions[live.session.id]
            released, live.released = live.released, True
        if not released:
            self.quotas.release(live.tenant)
            if self.replica is not None:
                with contextlib.suppress(SandcellError):
                    self.replica.session_ended(live.session.id)
        # A paused session's, a fork's or a snapshot's inputs are read again when it comes back.
        folder = live.inputs_dir
        if folder is not None and not saved_sessions.inputs_in_use(self, live.tenant, folder):
            shutil.rmtree(folder, ignore_errors=True)

    def reap_sessions(self) -> None:
        """Give back the slots of sessions that ended on their own (idle, lifetime), and end
        those whose tenant was removed or whose key was rotated since they were opened."""
        with self._sessions_lock:
            ended = [live for live in self.sessions.values() if live.session.ended is not None]
            live_now = [live for live in self.sessions.values() if live.session.ended is None]
        for live in ended:
            self.end_session(live)
        if live_now:
            keys = self.tenants.keys_now()
            self._end_revoked([s for s in live_now if not self._key_works(s, keys)])

    def key_current(self, live: LiveSession) -> bool:
        """Whether the key ``live`` was opened with is still its tenant's key (one read of the
        service's store: an E2B sandbox's calls carry its access token, no key, so this is how
        they learn that the key it came with was rotated)."""
        if live.tenant == LOCAL_TENANT:
            return True
        tenant = self.tenants.by_id(live.tenant)
        return tenant is not None and hmac.compare_digest(tenant.key_sha256, live.key_sha256)

    @staticmethod
    def _key_works(live: LiveSession, keys: Mapping[str, str]) -> bool:
        if live.tenant == LOCAL_TENANT:
            return True
        now = keys.get(live.tenant)
        return now is not None and hmac.compare_digest(now, live.key_sha256)

    def _end_revoked(self, revoked: list[LiveSession]) -> None:
        """End sessions opened with a key that no longer works: forgotten at once (nobody
        reaches them, their slot is given back), closed on a thread of their own (a teardown
        blocks)."""
        for live in revoked:
            log.info("session %s ends: its tenant was removed or its key rotated", live.session.id)
            self.end_session(live)
            threading.Thread(
                target=_close_quietly, args=(live.session,), name="sandcell-revoked", daemon=True
            ).start()

    # -- lifecycle ------------------------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(1 for s in self.runs.values() if not s.done.is_set())

    async def drain(self) -> None:
        """Wait for the runs in flight (a graceful stop), then end the sessions."""
        self.draining = True
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            log.info("waiting for %d runs in flight", len(pending))
            _, still = await asyncio.wait(pending, timeout=self.config.drain_timeout_s)
            if still:
                log.warning(
                    "%d runs still running after %.0f s: cancelling them",
                    len(still),
                    self.config.drain_timeout_s,
                )
                self.executor.cancel_all("the service is stopping")
                await asyncio.wait(still, timeout=30)
        for hook in self.on_stop:
            try:
                await hook()
            except Exception:
                log.exception("a stop hook failed; the sessions end anyway")
        with self._sessions_lock:
            live = list(self.sessions.values())
        for item in live:
            with contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(item.session.close)
            self.end_session(item)

    def close(self) -> None:
        self.executor.close()
        self.tenants.close()
        if self.replica is not None:
            self.replica.close()

    def gauges(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        self.reap_sessions()
        pools: list[tuple[dict[str, str], float]] = []
        for name in sorted(self._profiles_used):
            with contextlib.suppress(Exception):
                backend = self.executor.backend_for(load_profile(name))
                stats = backend.warm_stats()
                # A template's pool; gVisor's pool of whole sandboxes reports no PoolStats and
                # is no series of this gauge.
                if isinstance(stats, WarmStats) and stats.pool is not None:
                    ready = float(stats.pool.ready)
                    pools.append(({"backend": backend.name, "profile": name}, ready))
        found: dict[str, list[tuple[dict[str, str], float]]] = {
            "sandcell_runs_in_flight": [({}, float(self.in_flight()))],
            "sandcell_queue_length": [({}, float(self.queued))],
            "sandcell_sessions": [({}, float(len(self.sessions)))],
            "sandcell_pool_ready": pools,
        }
        if self.replica is not None:
            up = 0.0 if self.replica.unreachable else 1.0
            found["sandcell_database_up"] = [({"replica": self.replica.id}, up)]
        if self.nodes is not None:
            found.update(node_gauges(self.nodes()))
        return found


def node_gauges(reports: Sequence[NodeReport]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Each node of the cluster as this replica last saw it (its agent's report)."""
    gauges: dict[str, list[tuple[dict[str, str], float]]] = {
        "sandcell_node_slots": [],
        "sandcell_node_running": [],
        "sandcell_node_queued": [],
        "sandcell_node_sessions": [],
        "sandcell_node_pool_ready": [],
    }
    for report in reports:
        node = {"node": report.node_id, "host": report.hostname}
        gauges["sandcell_node_slots"].append((node, float(report.slots)))
        gauges["sandcell_node_running"].append((node, float(report.running)))
        gauges["sandcell_node_queued"].append((node, float(report.queued)))
        gauges["sandcell_node_sessions"].append((node, float(report.sessions)))
        for pool in report.pools:
            labels = {**node, "rung": pool.rung, "runtime": pool.runtime}
            gauges["sandcell_node_pool_ready"].append((labels, float(pool.ready)))
    return gauges


def _close_quietly(session: Session) -> None:
    with contextlib.suppress(Exception):
        session.cancel("its tenant's key was rotated or the tenant removed")
        session.close()


def _failure(run_id: str, exc: Exception) -> dict[str, object]:
    """The status body of a run the executor refused with an error after it was accepted."""
    from sandcell.errors import ConfigError

    reason = str(exc) if isinstance(exc, ConfigError) else "the service failed to run it"
    return {
        "run_id": run_id,
        "outcome": "error",
        "reason": reason,
        "exit_code": None,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "usage": {"wall_ms": 0.0, "cpu_ms": None, "peak_memory_bytes": None},
        "artifacts": [],
        "rejected_exports": [],
        "enforcement": None,
        "started_at": "",
        "policy": None,
        "validation": None,
        "leaks": [],
        "outputs": [],
        "start": {"mode": "cold", "template": None, "preloaded": [], "wait_ms": None},
        "session_id": None,
        "network": None,
        "tools": None,
    }
