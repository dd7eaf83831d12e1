"""A run with a working directory: the executor's run, wrapped by :class:`WorkdirRun`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.changes.workdir import WorkdirRun
from sandcell.errors import ConfigError
from sandcell.policy.profiles import Profile, load_profile
from sandcell.spec import NODE_LANGUAGES, Outcome

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.spec import RunRequest, RunResult


def run_in_workdir(
    ex: Executor,
    request: RunRequest,
    source: Path,
    *,
    export_diff: bool = True,
    profile: Profile | str | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run ``request`` with a copy of ``source`` as its writable working directory; with
    ``export_diff``, its change set becomes artifacts of the run (:mod:`sandcell.changes`).
    ``kwargs`` go to :meth:`Executor.run`."""
    if profile is None:
        prof = ex.profile
    else:
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
    limits = request.limits if request.limits is not None else prof.limits_for({})
    with WorkdirRun.take(source, limits, leave_out=prof.workdir.leave_out) as wd:
        return run_prepared(ex, request, wd, prof, export_diff=export_diff, **kwargs)


def rerun_in_workdir(
    ex: Executor,
    request: RunRequest,
    recorded: Mapping[str, object],
    profile: Profile,
    **kwargs: Any,
) -> RunResult:
    """Run ``request`` again on the snapshot a recorded run kept (``recorded``: its record's
    ``workdir`` section), for a replay (:mod:`sandcell.replay`); ConfigError when the snapshot
    is gone or was changed."""
    kept = recorded.get("snapshot")
    if not isinstance(kept, Mapping):
        raise ConfigError("the record keeps no snapshot of its working directory")
    with WorkdirRun.from_store(ex.store, kept) as wd:
        export_diff = bool(recorded.get("export_diff", True))
        return run_prepared(ex, request, wd, profile, export_diff=export_diff, **kwargs)


def run_prepared(
    ex: Executor,
    request: RunRequest,
    wd: WorkdirRun,
    prof: Profile,
    *,
    export_diff: bool,
    **kwargs: Any,
) -> RunResult:
    """Run ``request`` on the snapshot ``wd`` under ``prof``: the snapshot is kept in the
    artifact store and the record names it, with the caller's program, so that the run can be
    replayed (``sandcell audit replay``)."""
    if request.language in NODE_LANGUAGES:
        # The changes are recorded by a Python frame that starts the program as its child;
        # Node's permission model lets a JavaScript program start no process, and the frame
        # cannot start Node from a Python sandbox either: refused, not run without a record.
        raise ConfigError(
            f"a {request.language} program cannot run in a working directory "
            "(--workdir-from): write it in python or bash, or run it without one"
        )
    hook = wd.post_collect(ex.store, ex.export_limits, ex.known_secrets)
    if not export_diff:
        hook = _drop_archive
    extra = dict(kwargs.pop("record_extra", None) or {})
    result = ex.run(
        request,
        profile=prof,
        wrap=wd.wrap,
        post_collect=hook,
        record_extra={
            **extra,
            "workdir": {
                **wd.record(),
                "export_diff": export_diff,
                # The record's code is the frame around the program (sandcell.changes.program):
                # the caller's own program is kept here, for a replay to run it again.
                "program": request.code,
                "program_sha256": hashlib.sha256(request.code.encode()).hexdigest(),
                "snapshot": wd.keep(ex.store),
            },
        },
        **kwargs,
    )
    if result.outcome is Outcome.AWAITING_APPROVAL:
        # The ticket holds the caller's request, not the snapshot (gone with this call):
        # approved later it would run in an empty directory, so it is closed now.
        approval = (result.policy or {}).get("approval")
        ticket = approval.get("id") if isinstance(approval, Mapping) else None
        why = (
            "a --workdir-from run cannot wait for approval (its snapshot lives only as long as "
            "the call); run it again under a profile that admits it, or pass an approve callback"
        )
        if isinstance(ticket, str):
            ex.approvals.deny(ticket, by="sandcell", reason=why)
        return replace(result, outcome=Outcome.DENIED, reason=f"{result.reason}; {why}")
    return result


def _drop_archive(
    ws: Path, artifacts: tuple[Any, ...], rejected: tuple[Any, ...]
) -> tuple[tuple[Any, ...], tuple[Any, ...], Mapping[str, object]]:
    from sandcell.changes.program import CHANGES_FILE

    del ws
    return (
        tuple(a for a in artifacts if a.path != CHANGES_FILE),
        tuple(r for r in rejected if r.path != CHANGES_FILE),
        {},
    )
