"""The middle step of a one-shot run: the admitted request runs in a fresh sandbox.

Opens the run's ways out (egress proxy, tool gateway) and its live output, runs the request on
the backend, collects the declared exports and rich outputs while the workspace still exists,
then hands everything to :func:`sandcell.pipeline.finish.finish`. A session cell runs in its
session's sandbox instead (:mod:`sandcell.sessions.session`) and meets this pipeline again at
``finish``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sandcell.artifacts import ExportLimits, collect_exports, validate_globs
from sandcell.audit.record import utc_now
from sandcell.backends.base import Backend, BackendResult
from sandcell.display import DisplayCollection, take_outputs
from sandcell.errors import ConfigError, InfraError
from sandcell.inputs import inspect_inputs
from sandcell.pipeline.finish import Books, finish
from sandcell.pipeline.validators import Validators
from sandcell.policy.profiles import Profile
from sandcell.run_sockets import RunSockets
from sandcell.spec import (
    Artifact,
    Enforcement,
    IsolationMode,
    Outcome,
    RejectedExport,
    RunRequest,
    RunResult,
)

if TYPE_CHECKING:
    from sandcell.live_output import LiveOutput, OutputListener

PostCollect = Callable[
    [Path, tuple[Artifact, ...], tuple[RejectedExport, ...]],
    tuple[tuple[Artifact, ...], tuple[RejectedExport, ...], Mapping[str, object]],
]
"""Called after the exports were collected, with the workspace (still there) and what was
exported; returns the run's artifacts and rejections, and fields for the run's record that the
host computed from them (``--workdir-from`` turns the sandbox's change archive into the change
set here and names it in the record, :mod:`sandcell.changes`: a record field, unlike an artifact's
path, is something the sandboxed program cannot write)."""


class Host(Books, Protocol):
    """What a run needs of the executor besides its books: export limits, the run's ways out
    and its live output."""

    @property
    def export_limits(self) -> ExportLimits: ...

    def open_sockets(
        self, profile: Profile, request: RunRequest, *, run_id: str | None = None
    ) -> RunSockets | None: ...

    def live_output(
        self, listener: OutputListener | None, request: RunRequest, *, secrets: Sequence[str] = ()
    ) -> LiveOutput | None: ...


def execute(
    host: Host,
    request: RunRequest,
    *,
    backend: Backend,
    profile: Profile,
    validators: Validators,
    policy: Mapping[str, object],
    run_id: str | None = None,
    on_output: OutputListener | None = None,
    record_extra: Mapping[str, object] | None = None,
    post_collect: PostCollect | None = None,
) -> RunResult:
    """Run ``request`` (admitted under ``profile``) on ``backend`` and finish it: the result is
    recorded. A backend's InfraError becomes an ``infra_error`` result, recorded like any."""
    if post_collect is not None and getattr(backend, "collects_elsewhere", False):
        # A backend whose workspace is on another machine (a cluster's node) collects there
        # and never calls this host's collector: the hook would silently not run.
        raise ConfigError(
            "this run reshapes its exports on this host (the changes workflow, --workdir-from), "
            "which needs its workspace here; run it without --cluster"
        )
    globs = validate_globs(request.exports)
    inputs = inspect_inputs(request.inputs)
    run_id = run_id or uuid.uuid4().hex
    started_at = utc_now()

    displayed: list[DisplayCollection] = []
    collected_fields: dict[str, object] = {}

    def collect(ws: Path) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
        if request.display:
            # First, and the output directory goes with it: never exported as a file.
            displayed.append(take_outputs(ws, host.store))
        found: tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]] = ((), ())
        if globs:
            found = collect_exports(ws, globs, host.store, host.export_limits)
        if post_collect is None:
            return found
        artifacts, rejected, fields = post_collect(ws, *found)
        collected_fields.update(fields)
        return artifacts, rejected

    sockets = host.open_sockets(profile, request, run_id=run_id)
    secrets = sockets.secrets if sockets is not None else ()
    live = host.live_output(on_output, request, secrets=secrets)
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
    return finish(
        host,
        request,
        br,
        validators,
        policy,
        backend=backend,
        run_id=run_id,
        started_at=started_at,
        inputs=inputs,
        outside=outside,
        secrets=secrets,
        record_extra={**(record_extra or {}), **collected_fields},
    )


def _infra_result(reason: str, backend: str) -> BackendResult:
    return BackendResult.not_run(
        Outcome.INFRA_ERROR,
        reason,
        Enforcement(backend=backend, layers={}, mode=IsolationMode.STRICT),
    )
