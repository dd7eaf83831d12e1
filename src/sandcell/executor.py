"""The executor: the one object every surface (CLI, Python, HTTP, MCP, the agent) runs code
through, and a thin surface over the run pipeline (:mod:`sandcell.pipeline`).

``Executor.run`` = admit the request under a profile (limits, exports, checks of the code) →
allow, deny, or wait for approval (:mod:`sandcell.policy.approval_flow`) → run it on a backend in
a fresh sandbox → export the declared files → validate the declared result → redact leaked
tokens → write the run record (:mod:`sandcell.audit.record`) → return the typed result.
``run_async`` is the same for asyncio. The executor owns what outlives one run: the backends
(one per rung, built on first use), the stores (audit log, artifacts, approvals, wheels) and
the home they live in.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from sandcell.artifacts import ArtifactStore, ExportLimits
from sandcell.audit import AuditLog
from sandcell.backends.base import Backend
from sandcell.errors import ConfigError
from sandcell.home import bulk_dir
from sandcell.home import data_dir as data_dir  # noqa: PLC0414 - re-exported from its old home
from sandcell.home_guard import HomeGuard
from sandcell.packages import WheelCache
from sandcell.pipeline import PostCollect as PostCollect  # noqa: PLC0414 - re-exported
from sandcell.pipeline import execute, not_run, outside, prepare
from sandcell.pipeline.backends import Backends, Placement
from sandcell.pipeline.outside import host_secrets as host_secrets  # noqa: PLC0414 - re-exported
from sandcell.policy import approval_flow
from sandcell.policy.approval_flow import ApprovalCallback as ApprovalCallback  # noqa: PLC0414
from sandcell.policy.approvals import ApprovalStore
from sandcell.policy.profiles import DEFAULT_PROFILE, Profile, load_profile
from sandcell.replay import ReplayReport
from sandcell.replay.run import replay as replay_run
from sandcell.run_sockets import RunSockets
from sandcell.runtimes import runtime_for
from sandcell.sessions.states import StateStore
from sandcell.sessions.surface import SessionCalls
from sandcell.spec import Outcome, RunRequest, RunResult
from sandcell.validation import InvariantLike

if TYPE_CHECKING:
    import pydantic

    from sandcell.backends.warm import WarmConfig
    from sandcell.live_output import LiveOutput, OutputListener
    from sandcell.network.addresses import Resolver
    from sandcell.tools.approval import Approver


class Executor(SessionCalls):
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
        cluster: Placement | None = None,
    ) -> None:
        """``tool_approver`` answers a governed tool call that needs approval while its run
        waits (None: the approval queue, where a person decides with ``sandcell approve`` or
        ``sandcell deny`` before the run's wall time is up; see
        :mod:`sandcell.tools.queue_approver`); ``resolver`` is the name lookup of the egress
        proxy (default: the host's). ``cluster``: place each run on a node of a cluster
        (:class:`sandcell.cluster.Cluster`; warm starts are then the nodes' own) instead of
        running it on this host; its owner closes it."""
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
        # The rung the caller asked for, else each run's profile's (pipeline/backends.py).
        self._backends = Backends(backend, warm, placement=cluster)
        self.backend: Backend = self.backend_for(self.profile)
        """The backend of a run under the executor's own profile."""
        self.audit = audit or AuditLog(base / "audit.sqlite3")
        self.store = store or ArtifactStore(bulk_dir(base) / "artifacts")
        self.approvals = approvals or ApprovalStore(base / "approvals.sqlite3")
        self.wheels = WheelCache(base / "wheels")
        self.states = StateStore(bulk_dir(base) / "states")
        """Paused sessions, snapshots and fork points (:mod:`sandcell.sessions.states`)."""
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
        return self._backends.for_profile(profile, runtime=runtime)

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
        for backend in self._backends.all():
            backend.close()
        self.audit.close()
        self.approvals.close()
        self.states.close()

    def cancel_all(self, reason: str = "cancelled by the caller") -> int:
        """Stop every run of this executor that is in flight, from any thread.

        Each ends as ``killed`` with the reason ``"cancelled: <reason>"`` and is recorded like
        any other run. Returns how many runs were told to stop; runs that start later are not
        affected, so call it again until the callers of ``run`` have returned.
        """
        return sum(b.cancel_all(reason) for b in self._backends.all())

    def cancel(self, run_id: str, reason: str = "cancelled by the caller") -> bool:
        """Stop the run ``run_id`` (an id given to :meth:`run`) if it is in flight now; it ends
        ``killed`` like under :meth:`cancel_all`. False when it is not (yet, or any more)
        running: a caller that wants it stopped calls again until ``run`` has returned."""
        return any(b.cancel(run_id, reason) for b in self._backends.all())

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
        prepared = prepare(
            request,
            prof,
            wheels=self.wheels,
            backend=functools.partial(self._backends.for_request, prof),
            result_file=result_file,
            schema=schema,
            model=model,
            invariants=invariants,
        )
        if prepared.verdict == "deny":
            return not_run(
                self,
                prepared.request,
                Outcome.DENIED,
                prepared.denial,
                policy=prepared.policy,
                backend=prepared.backend,
                record_extra=record_extra,
            )
        if prepared.verdict == "approve":
            return approval_flow.run_with_approval(
                self,
                prepared,
                approve=approve,
                schema=schema,
                model=model,
                invariants=invariants,
                result_file=result_file,
                record_extra=record_extra,
                ran_extra=ran_extra,
                wrap=wrap,
                run_id=run_id,
                on_output=on_output,
                post_collect=post_collect,
            )
        return execute(
            self,
            wrap(prepared.request) if wrap is not None else prepared.request,
            backend=prepared.backend,
            profile=prof,
            validators=prepared.validators,
            policy=prepared.policy,
            run_id=run_id,
            on_output=on_output,
            record_extra=ran_extra,
            post_collect=post_collect,
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
        return approval_flow.run_approved(
            self,
            approval_id,
            load=self._profile,
            backend=self._backends.for_ticket,
            by=by,
            reason=reason,
            run_id=run_id,
            on_output=on_output,
        )

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
        return replay_run(
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
        return approval_flow.deny_approval(self, approval_id, self.backend, reason=reason, by=by)

    # -- what the pipeline asks of the executor ---------------------------------------------------

    def open_sockets(
        self,
        profile: Profile,
        request: RunRequest,
        *,
        run_id: str | None = None,
        ingress: bool = False,
    ) -> RunSockets | None:
        """The ways out of a run (or a session) under ``profile``, started (None: it has none);
        a tool call needing approval asks :attr:`tool_approver`, else the approval queue.
        ``ingress`` (a session): the profile's ``[ingress] ports`` are served too."""
        approver, resolver = self.tool_approver, self.resolver
        return outside.open_sockets(
            profile,
            request,
            approvals=self.approvals,
            approver=approver,
            resolver=resolver,
            run_id=run_id,
            ingress=ingress,
        )

    def live_output(
        self, listener: OutputListener | None, request: RunRequest, *, secrets: Sequence[str] = ()
    ) -> LiveOutput | None:
        """The output sink a backend is given for ``listener``, redacting the host's secrets and
        ``secrets`` (the gateway's) as the final output is."""
        known = (*self.known_secrets, *secrets)
        return outside.live_output(listener, request, known_secrets=known)
