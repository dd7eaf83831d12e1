"""The executor: the one object every surface (CLI, Python, later HTTP, MCP, the agent) runs
code through.

``Executor.run`` = admit the request under a profile (limits, exports, checks of the code) →
allow, deny, or wait for approval → run it on a backend in a fresh sandbox → export the declared
files → validate the declared result → redact leaked tokens → write the run record → return the
typed result. ``run_async`` is the same for asyncio.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from sandcell.artifacts import ArtifactStore, ExportLimits, collect_exports, validate_globs
from sandcell.audit import AuditLog
from sandcell.backends.base import Backend, BackendResult
from sandcell.backends.registry import BackendName, check_name, create_backend, requested_backend
from sandcell.display import DisplayCollection, take_outputs
from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.home import data_dir as data_dir  # noqa: PLC0414 - re-exported from its old home
from sandcell.home_guard import HomeGuard
from sandcell.inputs import inspect_inputs
from sandcell.packages import WheelCache
from sandcell.policy.approvals import (
    ApprovalStore,
    Ticket,
    approval_record,
    default_approver,
)
from sandcell.policy.gate import Admission, admit
from sandcell.policy.profiles import DEFAULT_PROFILE, Profile, load_profile
from sandcell.replay.evidence import (
    RECORD_VERSION,
    declared_record,
    keep_stdin,
    packages_record,
)
from sandcell.run_sockets import RunSockets
from sandcell.runtimes import Runtime, runtime_for
from sandcell.runtimes.ref import runtime_record, runtime_ref
from sandcell.spec import (
    DEFAULT_RUNTIME,
    Artifact,
    Enforcement,
    InputFile,
    IsolationMode,
    Limits,
    Outcome,
    RejectedExport,
    RunRequest,
    RunResult,
    Usage,
    output_to_dict,
    start_to_dict,
)
from sandcell.validation import (
    InvariantLike,
    Leak,
    default_checks,
    parse_invariant,
    scan_artifact,
    validate_output,
)

if TYPE_CHECKING:
    import pydantic

    from sandcell.backends.warm import WarmConfig
    from sandcell.live_output import LiveOutput, OutputListener
    from sandcell.network.addresses import Resolver
    from sandcell.replay import ReplayReport
    from sandcell.sessions import Session
    from sandcell.tools.approval import Approver

ApprovalCallback = Callable[[Ticket], bool]

PostCollect = Callable[
    [Path, tuple[Artifact, ...], tuple[RejectedExport, ...]],
    tuple[tuple[Artifact, ...], tuple[RejectedExport, ...], Mapping[str, object]],
]
"""Called after the exports were collected, with the workspace (still there) and what was
exported; returns the run's artifacts and rejections, and fields for the run's record that the
host computed from them (``--workdir-from`` turns the sandbox's change archive into the change
set here and names it in the record, :mod:`sandcell.changes`: a record field, unlike an artifact's
path, is something the sandboxed program cannot write)."""
"""Called with the stored ticket of a run that needs approval; True approves and runs it."""

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH)", re.IGNORECASE)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def host_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of the host's secret-looking environment variables: never given to a sandbox, so
    finding one in its output means it leaked some other way; they are redacted by value."""
    env = os.environ if environ is None else environ
    return tuple(v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8)


def _leak_dict(leak: Leak) -> dict[str, object]:
    return {
        "kind": leak.kind,
        "severity": leak.severity,
        "stream": leak.stream,
        "line": leak.line,
        "preview": leak.preview,
    }


class Executor:
    """Runs requests in fresh sandboxes under a policy profile and keeps a record of each run.

    >>> with Executor() as ex:                                   # doctest: +SKIP
    ...     result = ex.run(RunRequest(code="print(6*7)"))
    ...     result.stdout
    '42\\n'
    """

    def __init__(
        self,
        *,
        backend: Backend | str | None = None,
        audit: AuditLog | None = None,
        store: ArtifactStore | None = None,
        approvals: ApprovalStore | None = None,
        profile: Profile | str | None = None,
        export_limits: ExportLimits | None = None,
        known_secrets: Sequence[str] | None = None,
        home: Path | None = None,
        warm: WarmConfig | None = None,
        tool_approver: Approver | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        """``tool_approver`` answers a governed tool call that needs approval while its run
        waits (None: the approval queue, where a person decides with ``sandcell approve`` or
        ``sandcell deny`` before the run's wall time is up; see
        :mod:`sandcell.tools.queue_approver`); ``resolver`` is the name lookup of the egress
        proxy (default: the host's)."""
        base = home or data_dir()
        # The profile when a run names none: the argument, $SANDCELL_PROFILE, else strict.
        from_env = os.environ.get("SANDCELL_PROFILE") if profile is None else None
        try:
            self.profile = self._profile(
                profile if profile is not None else from_env or DEFAULT_PROFILE
            )
        except ConfigError as exc:
            if not from_env:
                raise
            # A name the caller never typed: say where it came from.
            raise ConfigError(f"$SANDCELL_PROFILE: {exc}") from None
        # The rung the caller asked for (a name, a backend object, else $SANDCELL_BACKEND); None
        # lets each run's profile choose. Each profile refuses a rung below its minimum.
        self._warm = warm
        self._backends: dict[str, Backend] = {}
        self._backends_lock = threading.Lock()
        if isinstance(backend, str) or backend is None:
            self._requested: BackendName | None = requested_backend(backend)
        else:
            if warm is not None:
                raise ConfigError(
                    "warm starts are an option of a backend built by name: pass warm with "
                    "backend='namespaces' (or 'gvisor', 'microvm'), or a backend object alone"
                )
            self._requested = check_name(backend.name)
            self._backends[backend.name] = backend
        self.backend: Backend = self.backend_for(self.profile)
        """The backend of a run under the executor's own profile."""
        self.audit = audit or AuditLog(base / "audit.sqlite3")
        self.store = store or ArtifactStore(base / "artifacts")
        self.approvals = approvals or ApprovalStore(base / "approvals.sqlite3")
        self.wheels = WheelCache(base / "wheels")
        # The stores' directory (when they are in it): a run starts only while it is still the
        # one opened here, so that its record is kept (home_guard.py).
        self._home = HomeGuard.of(base) if base.is_dir() else None
        self.export_limits = export_limits or ExportLimits()
        self.known_secrets = tuple(host_secrets() if known_secrets is None else known_secrets)
        self.tool_approver = tool_approver
        self.resolver = resolver

    def check_home(self) -> None:
        """Refuse to start anything once the home this executor opened is deleted or replaced
        (its records would be lost). Raises AuditError then."""
        if self._home is not None:
            self._home.check()

    def backend_for(self, profile: Profile, *, runtime: str | None = None) -> Backend:
        """The backend a run under ``profile`` in ``runtime`` (None: the profile's) gets: the
        rung the caller asked for, else the profile's default; built on first use and kept.
        Raises ConfigError for a rung below the profile's minimum, IsolationUnavailable for one
        this host cannot provide."""
        return self._backend_named(
            profile.backend_for(self._requested), runtime or profile.runtime.runtime, profile
        )

    def _backend_named(
        self, name: str, runtime: str = DEFAULT_RUNTIME, profile: Profile | None = None
    ) -> Backend:
        """One backend per rung, and with warm starts one per rung and runtime: a template or
        pool is made of one runtime (and preloads what the profile that first needed it says)."""
        key = name if self._warm is None or runtime == DEFAULT_RUNTIME else f"{name}:{runtime}"
        with self._backends_lock:
            found = self._backends.get(key)
            if found is None:
                warm = self._warm
                if warm is not None:
                    preload = profile.runtime.preload if profile is not None else None
                    warm = replace(
                        warm,
                        runtime=None if runtime == DEFAULT_RUNTIME else runtime,
                        preload=warm.preload if preload is None else preload,
                    )
                found = create_backend(name, warm=warm)
                self._backends[key] = found
            return found

    def check_runtime(self, request: RunRequest) -> None:
        """Refuse a request whose runtime is not built, or not what it was built as, before
        anything starts (ConfigError or IsolationUnavailable, with the command that builds it)."""
        runtime_for(request.language, request.runtime)

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for backend in list(self._backends.values()):
            backend.close()
        self.audit.close()
        self.approvals.close()

    def cancel_all(self, reason: str = "cancelled by the caller") -> int:
        """Stop every run of this executor that is in flight, from any thread.

        Each ends as ``killed`` with the reason ``"cancelled: <reason>"`` and is recorded like
        any other run. Returns how many runs were told to stop; runs that start later are not
        affected, so call it again until the callers of ``run`` have returned.
        """
        return sum(b.cancel_all(reason) for b in list(self._backends.values()))

    def cancel(self, run_id: str, reason: str = "cancelled by the caller") -> bool:
        """Stop the run ``run_id`` (an id given to :meth:`run`) if it is in flight now; it ends
        ``killed`` like under :meth:`cancel_all`. False when it is not (yet, or any more)
        running: a caller that wants it stopped calls again until ``run`` has returned."""
        return any(b.cancel(run_id, reason) for b in list(self._backends.values()))

    @staticmethod
    def _profile(profile: Profile | str) -> Profile:
        return profile if isinstance(profile, Profile) else load_profile(profile)

    async def run_async(
        self,
        request: RunRequest,
        *,
        profile: Profile | str | None = None,
        schema: Mapping[str, object] | None = None,
        model: type[pydantic.BaseModel] | None = None,
        invariants: Sequence[InvariantLike] = (),
        result_file: str | None = None,
        approve: ApprovalCallback | None = None,
        on_output: OutputListener | None = None,
    ) -> RunResult:
        """:meth:`run` for asyncio: the sandbox is supervised on a worker thread (and
        ``on_output`` is called from a thread of the run, not the event loop)."""
        import asyncio  # only asyncio callers pay for importing it

        return await asyncio.to_thread(
            self.run,
            request,
            profile=profile,
            schema=schema,
            model=model,
            invariants=invariants,
            result_file=result_file,
            approve=approve,
            on_output=on_output,
        )

    def run(
        self,
        request: RunRequest,
        *,
        profile: Profile | str | None = None,
        schema: Mapping[str, object] | None = None,
        model: type[pydantic.BaseModel] | None = None,
        invariants: Sequence[InvariantLike] = (),
        result_file: str | None = None,
        approve: ApprovalCallback | None = None,
        wrap: Callable[[RunRequest], RunRequest] | None = None,
        run_id: str | None = None,
        on_output: OutputListener | None = None,
        record_extra: Mapping[str, object] | None = None,
        post_collect: PostCollect | None = None,
    ) -> RunResult:
        """Run one program in a fresh sandbox, if the profile allows it.

        Outcomes are results, including ``denied`` and ``awaiting_approval``; only a request the
        profile cannot accept at all (an export or limit beyond it, a bad schema) raises
        ConfigError. ``schema``/``model``/``invariants``/``result_file`` declare a result to
        validate (on top of the profile's schema); ``approve`` decides at once for a run that
        needs approval instead of leaving it waiting in the store. ``wrap`` turns the request
        the profile admitted into the one the sandbox runs (the batch judge puts the program
        under its test harness): the checks judge the caller's code, not the wrapper's.
        ``run_id`` names the run in the sandbox and its record (default: a fresh one), so that
        :meth:`cancel` can reach it while it runs; a run that never starts gets its own id.
        ``on_output(stream, text)`` is told the program's stdout and stderr while it runs,
        decoded, redacted and capped as the final output is (:mod:`sandcell.live_output`),
        from another thread; it has had all of it when ``run`` returns.
        ``record_extra``: fields added to the run's record (a replay's link to its original,
        :mod:`sandcell.replay`); kept with an approval ticket for the run it approves.
        ``post_collect`` reshapes what the run exported while its workspace still exists (the
        patch workflow, :mod:`sandcell.changes`).
        """
        self.check_home()
        prof = self._profile(profile) if profile is not None else self.profile
        # A wrapped run's record holds the wrapped program, which the checks never judged: a
        # replay of it has to say so (sandcell.replay.plan).
        ran_extra = record_extra if wrap is None else {**(record_extra or {}), "wrapped": True}
        admission = admit(request, prof, result_file=result_file, cache=self.wheels)
        self.check_runtime(admission.request)
        backend = self.backend_for(prof, runtime=admission.request.runtime)
        validators = _Validators.make(admission, schema=schema, model=model, invariants=invariants)
        policy = admission.policy_record()
        verdict = admission.decision.verdict
        if verdict == "deny":
            return self._not_run(
                admission.request,
                Outcome.DENIED,
                f"denied by profile {prof.name!r}: {admission.decision.reason}",
                policy,
                backend,
                record_extra=record_extra,
            )
        if verdict == "approve":
            ticket = self.approvals.submit(
                admission.request,
                # The rung is part of what is approved: the run happens on it, or not at all.
                profile={**prof.to_record(), "backend": backend.name},
                findings=policy["findings"],  # type: ignore[arg-type]
                why=admission.decision.reason,
                declared=_with_record_extra(
                    _declared_for_storage(
                        schema=schema,
                        model=model,
                        invariants=invariants,
                        result_file=result_file,
                        waiting=approve is None,
                    ),
                    record_extra,
                ),
            )
            if approve is None:
                return self._not_run(
                    admission.request,
                    Outcome.AWAITING_APPROVAL,
                    f"waiting for approval {ticket.id} ({admission.decision.reason}); "
                    f"approve it with: sandcell approve {ticket.id}",
                    {**policy, "approval": {"id": ticket.id, "status": "pending"}},
                    backend,
                    record_extra=record_extra,
                )
            who = f"callback:{getattr(approve, '__qualname__', 'approve')}"
            if not approve(ticket):
                denied = self.approvals.deny(
                    ticket.id, by=who, reason="the approval callback refused"
                )
                return self._not_run(
                    admission.request,
                    Outcome.DENIED,
                    f"approval {ticket.id} was denied by {who}",
                    {**policy, "approval": _denial(denied)},
                    backend,
                    record_extra=record_extra,
                )
            approved = self.approvals.approve(ticket.id, by=who)
            result = self._execute(
                backend,
                prof,
                wrap(approved.request) if wrap is not None else approved.request,
                validators,
                {**policy, "approval": approval_record(approved.ticket)},
                run_id=run_id,
                on_output=on_output,
                record_extra=ran_extra,
                post_collect=post_collect,
            )
            self.approvals.mark_ran(ticket.id, result.run_id)
            return result
        admitted = wrap(admission.request) if wrap is not None else admission.request
        return self._execute(
            backend,
            prof,
            admitted,
            validators,
            policy,
            run_id=run_id,
            on_output=on_output,
            record_extra=ran_extra,
            post_collect=post_collect,
        )

    def session(
        self,
        *,
        profile: Profile | str | None = None,
        limits: Limits | None = None,
        inputs: Sequence[InputFile] = (),
        mode: IsolationMode = IsolationMode.STRICT,
        landlock: bool | None = None,
        idle_timeout_s: float | None = None,
        max_lifetime_s: float | None = None,
        runtime: str | None = None,
    ) -> Session:
        """Start a session: one sandbox kept alive across cells (see :mod:`sandcell.sessions`).

        Each cell is checked under ``profile`` and recorded as a run with the session's id;
        ``runtime`` (None: the profile's) is the session's for all its cells.
        """
        from sandcell.sessions import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_LIFETIME_S, Session

        self.check_home()
        return Session(
            self,
            profile=profile,
            limits=limits,
            inputs=inputs,
            mode=mode,
            landlock=landlock,
            idle_timeout_s=idle_timeout_s or DEFAULT_IDLE_TIMEOUT_S,
            max_lifetime_s=max_lifetime_s or DEFAULT_MAX_LIFETIME_S,
            runtime=runtime,
        )

    def run_approved(
        self,
        approval_id: str,
        *,
        by: str | None = None,
        reason: str = "",
        run_id: str | None = None,
        on_output: OutputListener | None = None,
    ) -> RunResult:
        """Approve a waiting run and run exactly the stored request (its hash is checked).

        The profile must still be the one the run was submitted under (same content hash).
        """
        self.check_home()
        ticket = self.approvals.get(approval_id)
        source = str(ticket.profile.get("source") or "")
        # A built-in is loaded by name; a user profile from the file it was loaded from.
        prof = self._profile(
            str(ticket.profile.get("name"))
            if source.startswith("builtin:") or not source
            else source
        )
        submitted = ticket.profile.get("backend")
        if isinstance(submitted, str):
            if self._requested is not None and self._requested != submitted:
                raise ConfigError(
                    f"approval {ticket.id} is for a run on backend {submitted!r}, not "
                    f"{self._requested!r}; approve it with --backend {submitted} (or none)"
                )
            backend = self._backend_named(
                prof.backend_for(submitted), ticket.request.runtime or prof.runtime.runtime, prof
            )
        else:  # submitted before backends were recorded with the approval
            backend = self.backend_for(prof, runtime=ticket.request.runtime)
        if prof.sha256 != ticket.profile.get("sha256"):
            raise ConfigError(
                f"profile {prof.name!r} changed since approval {ticket.id} was submitted; deny "
                "it and submit the run again under the current profile"
            )
        declared = ticket.declared or {}
        stored_file = declared.get("result_file")
        admission = admit(
            ticket.request,
            prof,
            result_file=stored_file if isinstance(stored_file, str) else None,
            cache=self.wheels,
        )
        stored_schema = declared.get("schema")
        stored_invariants = declared.get("invariants")
        validators = _Validators.make(
            admission,
            schema=stored_schema if isinstance(stored_schema, dict) else None,
            model=None,
            invariants=[str(i) for i in stored_invariants]
            if isinstance(stored_invariants, list)
            else (),
        )
        if admission.decision.verdict == "deny":
            # Same code, same profile: only the checks themselves changed since submission.
            raise ConfigError(
                f"the checks now deny the code of approval {ticket.id} "
                f"({admission.decision.reason}); deny it"
            )
        approved = self.approvals.approve(ticket.id, by=by or default_approver(), reason=reason)
        policy = {**admission.policy_record(), "approval": approval_record(approved.ticket)}
        try:
            result = self._execute(
                backend,
                prof,
                approved.request,
                validators,
                policy,
                run_id=run_id,
                on_output=on_output,
                record_extra=_stored_record_extra(declared),
            )
        except SandcellError:
            # Nothing ran: the ticket waits again rather than stay approved and unrunnable.
            self.approvals.reopen(ticket.id)
            raise
        self.approvals.mark_ran(ticket.id, result.run_id)
        return result

    def replay(
        self,
        run_id: str,
        *,
        use_current_profile: bool = False,
        backend: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputListener | None = None,
        run_id_of_replay: str | None = None,
    ) -> ReplayReport:
        """Run the recorded run ``run_id`` again as its record says, and compare the results.

        The replay is a new run under the same policy gate (it may wait for approval again),
        recorded with ``replay_of``; see :mod:`sandcell.replay` for what is refused (a changed
        profile unless ``use_current_profile``, a changed or missing input, a session cell) and
        what is only reported (a changed runtime, a ``backend`` override).
        ``run_id_of_replay`` names the replay's own run (as ``run_id`` does for :meth:`run`).
        """
        from sandcell.replay import replay

        return replay(
            self,
            run_id,
            use_current_profile=use_current_profile,
            backend=backend,
            env=env,
            on_output=on_output,
            run_id_of_replay=run_id_of_replay,
        )

    def deny_approval(self, approval_id: str, *, reason: str, by: str | None = None) -> RunResult:
        """Deny a waiting run; the denial is recorded as a run that did not happen."""
        ticket = self.approvals.deny(approval_id, by=by or default_approver(), reason=reason)
        record = {
            "profile": ticket.profile,
            "verdict": "approve",
            "reason": ticket.reason_for_approval,
            "findings": list(ticket.findings),
            "approval": _denial(ticket),
        }
        return self._not_run(
            ticket.request,
            Outcome.DENIED,
            f"approval {ticket.id} was denied by {ticket.decided_by}: {ticket.decision_reason}",
            record,
            record_extra=_stored_record_extra(ticket.declared or {}),
        )

    # -- internals ----------------------------------------------------------------------------

    def open_sockets(
        self, profile: Profile, request: RunRequest, *, run_id: str | None = None
    ) -> RunSockets | None:
        """The ways out of a run (or a session) under ``profile``: its egress proxy and tool
        gateway, started; None when the profile allows nothing outside. A call needing approval
        waits at most the run's wall time, for :attr:`tool_approver` or else the approval queue
        (its tickets name ``run_id``)."""
        from sandcell.tools.queue_approver import open_run_sockets

        return open_run_sockets(
            profile,
            store=self.approvals,
            approver=self.tool_approver,
            approval_timeout_s=request.effective_limits.wall_time_s,
            resolver=self.resolver,
            run_id=run_id,
        )

    def live_output(
        self, listener: OutputListener | None, request: RunRequest, *, secrets: Sequence[str] = ()
    ) -> LiveOutput | None:
        """The output sink a backend is given for ``listener``: the run's caps, and the same
        secrets redacted as in its final output (the host's and ``secrets``, the gateway's)."""
        if listener is None:
            return None
        from sandcell.live_output import LiveOutput

        limits = request.effective_limits
        return LiveOutput(
            listener,
            caps={"stdout": limits.stdout_bytes, "stderr": limits.stderr_bytes},
            known_secrets=(*self.known_secrets, *secrets),
        )

    def _execute(
        self,
        backend: Backend,
        profile: Profile,
        request: RunRequest,
        validators: _Validators,
        policy: Mapping[str, object],
        *,
        run_id: str | None = None,
        on_output: OutputListener | None = None,
        record_extra: Mapping[str, object] | None = None,
        post_collect: PostCollect | None = None,
    ) -> RunResult:
        globs = validate_globs(request.exports)
        inputs = inspect_inputs(request.inputs)
        run_id = run_id or uuid.uuid4().hex
        started_at = _now()

        displayed: list[DisplayCollection] = []
        collected_fields: dict[str, object] = {}

        def collect(ws: Path) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
            if request.display:
                # First, and the output directory goes with it: never exported as a file.
                displayed.append(take_outputs(ws, self.store))
            found: tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]] = ((), ())
            if globs:
                found = collect_exports(ws, globs, self.store, self.export_limits)
            if post_collect is None:
                return found
            artifacts, rejected, fields = post_collect(ws, *found)
            collected_fields.update(fields)
            return artifacts, rejected

        sockets = self.open_sockets(profile, request, run_id=run_id)
        live = self.live_output(
            on_output, request, secrets=sockets.secrets if sockets is not None else ()
        )
        try:
            br = backend.run(
                request,
                run_id=run_id,
                collect=collect,
                sockets=sockets.sandbox if sockets is not None else None,
                on_output=live,
            )
        except InfraError as exc:
            br = _infra_result(str(exc), backend.name)
        finally:
            if live is not None:
                live.close()
            outside = sockets.close() if sockets is not None else None
        if displayed and br.outcome is not Outcome.INFRA_ERROR:
            shown = displayed[0]
            rejected = br.rejected_exports + shown.rejected
            br = replace(br, outputs=br.outputs + shown.outputs, rejected_exports=rejected)
        return self.finish(
            request,
            br,
            validators,
            policy,
            run_id=run_id,
            started_at=started_at,
            inputs=inputs,
            backend=backend,
            outside=outside,
            secrets=sockets.secrets if sockets is not None else (),
            record_extra={**(record_extra or {}), **collected_fields},
        )

    def finish(
        self,
        request: RunRequest,
        br: BackendResult,
        validators: _Validators,
        policy: Mapping[str, object],
        *,
        run_id: str,
        started_at: str,
        inputs: list[dict[str, object]],
        session_id: str | None = None,
        backend: Backend | None = None,
        outside: Mapping[str, object] | None = None,
        secrets: Sequence[str] = (),
        record_extra: Mapping[str, object] | None = None,
    ) -> RunResult:
        """What happens after a sandbox ran: validate the declared result, scan for leaks, write
        the record, return the typed result. Shared by one-shot runs and session cells.

        ``outside``: what the run's egress proxy and tool gateway saw
        (:meth:`RunSockets.take_record`); ``secrets``: the gateway's credentials, looked for in
        every output like the host's own; ``record_extra``: fields added to the record."""
        known_secrets = (*self.known_secrets, *secrets)
        stdout = br.stdout.decode("utf-8", errors="replace")
        stderr = br.stderr.decode("utf-8", errors="replace")
        outcome, reason = br.outcome, br.reason
        validation: dict[str, object] | None = None
        report = validate_output(
            stdout=stdout,
            stderr=stderr,
            result_file=self._result_bytes(br.artifacts, validators.result_file),
            schema=validators.schema,
            model=validators.model,
            invariants=validators.invariants,
            known_secrets=known_secrets,
        )
        leaks = [_leak_dict(leak) for leak in report.leaks]
        for artifact in br.artifacts:
            data = self.store.path_for(artifact.sha256).read_bytes()
            found = scan_artifact(data, path=artifact.path, known_secrets=known_secrets)
            leaks += [_leak_dict(leak) for leak in found]
        if validators.declared and outcome is Outcome.OK:
            missing = _missing_result(br, validators.result_file)
            valid = report.valid and missing is None
            errors = [missing] if missing is not None else list(report.errors)
            validation = {
                "valid": valid,
                "errors": errors,
                "value": report.value if valid else None,
            }
            if not valid:
                outcome = Outcome.INVALID_OUTPUT
                reason = "the declared result failed validation: " + "; ".join(errors[:3])
        runtime = runtime_for(request.language, request.runtime)
        result = RunResult(
            run_id=run_id,
            outcome=outcome,
            exit_code=br.exit_code,
            signal=br.signal,
            stdout=report.stdout,
            stderr=report.stderr,
            stdout_truncated=br.stdout_truncated,
            stderr_truncated=br.stderr_truncated,
            usage=br.usage,
            artifacts=br.artifacts,
            rejected_exports=br.rejected_exports,
            enforcement=br.enforcement,
            reason=reason,
            started_at=started_at,
            policy=policy,
            validation=validation,
            leaks=tuple(leaks),
            outputs=br.outputs,
            start=br.start,
            session_id=session_id,
            network=_mapping(outside, "network"),
            tools=_mapping(outside, "tools"),
            runtime=runtime_ref(runtime, request.runtime),
        )
        record = self._record(request, result, br, inputs, backend or self.backend, runtime=runtime)
        self.audit.append(
            {
                # First, so that no extra field can replace one the executor wrote.
                **(record_extra or {}),
                **record,
                "network": result.network,
                "tools": result.tools,
                "declared": declared_record(
                    schema=validators.schema,
                    model=validators.model,
                    invariants=validators.invariants,
                    result_file=validators.result_file,
                ),
            }
        )
        return result

    def _result_bytes(self, artifacts: Sequence[Artifact], result_file: str | None) -> bytes | None:
        if result_file is None:
            return None
        for a in artifacts:
            if a.path == result_file:
                return self.store.path_for(a.sha256).read_bytes()
        return b""  # declared but not written: validation says so

    def _not_run(
        self,
        request: RunRequest,
        outcome: Outcome,
        reason: str,
        policy: Mapping[str, object],
        backend: Backend | None = None,
        *,
        record_extra: Mapping[str, object] | None = None,
    ) -> RunResult:
        runtime = runtime_for(request.language, request.runtime)
        result = RunResult(
            run_id=uuid.uuid4().hex,
            outcome=outcome,
            exit_code=None,
            signal=None,
            stdout="",
            stderr="",
            stdout_truncated=False,
            stderr_truncated=False,
            usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
            artifacts=(),
            rejected_exports=(),
            enforcement=None,
            reason=reason,
            started_at=_now(),
            policy=policy,
            runtime=runtime_ref(runtime, request.runtime),
        )
        record = self._record(
            request,
            result,
            None,
            inspect_inputs(request.inputs),
            backend or self.backend,
            runtime=runtime,
        )
        self.audit.append({**(record_extra or {}), **record})
        return result

    def _record(
        self,
        request: RunRequest,
        result: RunResult,
        br: BackendResult | None,
        inputs: list[dict[str, object]],
        backend: Backend,
        *,
        runtime: Runtime,
    ) -> Mapping[str, object]:
        enforcement = result.enforcement
        return {
            "run_id": result.run_id,
            "started_at": result.started_at,
            "finished_at": _now(),
            "code": request.code,
            "code_sha256": _sha256(request.code.encode()),
            "language": request.language,
            "runtime": runtime_record(runtime, request.runtime),
            "backend": {"name": backend.name, **backend.versions()},
            "host": {"kernel": platform.release(), "machine": platform.machine()},
            "limits": asdict(request.effective_limits),
            "mode": request.mode.value,
            "env_names": sorted(request.env),
            "inputs": inputs,
            "stdin_sha256": _sha256(request.stdin),
            "exports": list(request.exports),
            "display": request.display,
            "outcome": result.outcome.value,
            "reason": result.reason,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "usage": asdict(result.usage),
            "stdout_sha256": _sha256(br.stdout if br else b""),
            "stderr_sha256": _sha256(br.stderr if br else b""),
            "stdout": result.stdout,
            "stderr": result.stderr,
            "stdout_truncated": result.stdout_truncated,
            "stderr_truncated": result.stderr_truncated,
            "artifacts": [asdict(a) for a in result.artifacts],
            "rejected_exports": [asdict(r) for r in result.rejected_exports],
            "policy": None if result.policy is None else dict(result.policy),
            "validation": _validation_record(result.validation),
            "leaks": list(result.leaks),
            "outputs": [output_to_dict(o) for o in result.outputs],
            "start": start_to_dict(result.start),
            "session_id": result.session_id,
            "record_version": RECORD_VERSION,
            "stdin_kept": keep_stdin(self.store, request.stdin),
            "packages": packages_record(request.packages, self.wheels),
            "landlock": request.landlock,
            "enforcement": None
            if enforcement is None
            else {
                "backend": enforcement.backend,
                "mode": enforcement.mode.value,
                "layers": dict(enforcement.layers),
                "weakened": list(enforcement.weakened),
            },
        }


def _mapping(record: Mapping[str, object] | None, key: str) -> Mapping[str, object] | None:
    value = None if record is None else record.get(key)
    return value if isinstance(value, Mapping) else None


def _validation_record(validation: Mapping[str, object] | None) -> dict[str, object] | None:
    """The validation as the run record keeps it: a pydantic model's value in its JSON form
    (the result keeps the model instance for the caller)."""
    if validation is None:
        return None
    value = validation.get("value")
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return {**validation, "value": dump(mode="json")}
    return dict(validation)


def _missing_result(br: BackendResult, result_file: str | None) -> str | None:
    """Why the declared result file is not among the run's artifacts; None when it is (or when
    the result comes from stdout)."""
    if result_file is None or any(a.path == result_file for a in br.artifacts):
        return None
    for rejected in br.rejected_exports:
        if rejected.path == result_file:
            return f"the result file {result_file!r} was not exported: {rejected.reason}"
    return f"the result file {result_file!r} was not written by the program"


def _infra_result(reason: str, backend: str) -> BackendResult:
    return BackendResult.not_run(
        Outcome.INFRA_ERROR,
        reason,
        Enforcement(backend=backend, layers={}, mode=IsolationMode.STRICT),
    )


class _Validators:
    """What the run's declared result is checked against, prepared before the run so that a bad
    schema or invariant is refused before anything runs."""

    def __init__(
        self,
        *,
        schema: Mapping[str, object] | None,
        model: type[pydantic.BaseModel] | None,
        invariants: Sequence[InvariantLike],
        result_file: str | None,
    ) -> None:
        self.schema = schema
        self.model = model
        self.invariants = invariants
        self.result_file = result_file

    @property
    def declared(self) -> bool:
        return bool(self.schema or self.model or self.invariants or self.result_file)

    @classmethod
    def make(
        cls,
        admission: Admission,
        *,
        schema: Mapping[str, object] | None,
        model: type[pydantic.BaseModel] | None,
        invariants: Sequence[InvariantLike],
    ) -> _Validators:
        schema = schema if schema is not None else admission.profile.validation.result_schema
        if schema is not None:
            # In a confined worker: the schema is the requester's, and checking a large one
            # would hold the service's interpreter lock for seconds.
            default_checks().check_schema(schema)
        parsed = [parse_invariant(i) if isinstance(i, str) else i for i in invariants]
        return cls(schema=schema, model=model, invariants=parsed, result_file=admission.result_file)


def _declared_for_storage(
    *,
    schema: Mapping[str, object] | None,
    model: type[pydantic.BaseModel] | None,
    invariants: Sequence[InvariantLike],
    result_file: str | None,
    waiting: bool,
) -> dict[str, object] | None:
    """The caller's declared result in a form the approval store keeps (JSON), so that the
    approved run, later, is validated as the caller asked. A pydantic model or a callable cannot
    be stored: a run that must wait for a person cannot use them."""
    if waiting and (model is not None or any(callable(i) for i in invariants)):
        raise ConfigError(
            "this run needs approval and will wait for it, but a pydantic model or a callable "
            "invariant cannot be stored with it; pass approve=... to decide now, or declare the "
            "result with a JSON Schema and textual invariants"
        )
    texts = [i if isinstance(i, str) else getattr(i, "source", None) for i in invariants]
    if not (schema or texts or result_file):
        return None
    return {
        "schema": dict(schema) if schema else None,
        "invariants": [t for t in texts if isinstance(t, str)],
        "result_file": result_file,
    }


def _with_record_extra(
    declared: dict[str, object] | None, record_extra: Mapping[str, object] | None
) -> dict[str, object] | None:
    """The declared result stored with an approval ticket, plus the fields the approved run's
    record gets (so a replay that waited for approval stays linked to its original)."""
    if not record_extra:
        return declared
    base = declared or {"schema": None, "invariants": [], "result_file": None}
    return {**base, "record_extra": dict(record_extra)}


def _stored_record_extra(declared: Mapping[str, object]) -> Mapping[str, object] | None:
    extra = declared.get("record_extra")
    return extra if isinstance(extra, Mapping) else None


def _denial(ticket: Ticket) -> dict[str, object]:
    return {
        "approval_id": ticket.id,
        "denied_by": ticket.decided_by,
        "denied_at": ticket.decided_at,
        "decision_reason": ticket.decision_reason,
        "requested_because": ticket.reason_for_approval,
    }
