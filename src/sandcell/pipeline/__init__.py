"""The run pipeline every run and session cell goes through.

1. :func:`~sandcell.pipeline.prepare.prepare`: admit the request under the profile, choose the
   backend, prepare the validators of the declared result, read the verdict.
2. The verdict: ``deny`` is recorded as a run that did not happen
   (:func:`~sandcell.pipeline.finish.not_run`); ``approve`` goes through the approval flow
   (:mod:`sandcell.policy.approval_flow`); ``allow`` runs.
3. :func:`~sandcell.pipeline.execute.execute`: a one-shot run in a fresh sandbox (a session cell
   runs in its session's sandbox, :mod:`sandcell.sessions.session`).
4. :func:`~sandcell.pipeline.finish.finish`: validate the result, scan for leaks, write the
   record (:mod:`sandcell.audit.record`), return the typed result.

:class:`sandcell.Executor` and :class:`sandcell.sessions.Session` are thin surfaces over it.
"""

from __future__ import annotations

from sandcell.pipeline.execute import Host, PostCollect, execute
from sandcell.pipeline.finish import Books, finish, not_run
from sandcell.pipeline.prepare import Prepared, prepare
from sandcell.pipeline.validators import Validators

__all__ = [
    "Books",
    "Host",
    "PostCollect",
    "Prepared",
    "Validators",
    "execute",
    "finish",
    "not_run",
    "prepare",
]
