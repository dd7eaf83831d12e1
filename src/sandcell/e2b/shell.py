"""``commands.run``: a Bash program run in a session's sandbox, gated and recorded as Bash.

A session's kernel runs Python, so the command runs as a generated Python cell that starts
``/bin/bash -l -c COMMAND`` in the same sandbox and workspace (its output goes straight to the
cell's streams; its exit status becomes the cell's). What the profile judges, and what the record
keeps, is the Bash program itself: a profile that allows Bash but not Python's ``subprocess``
lets ``ls -la`` run, and a denied command is denied by the shell checks.

This mirrors :meth:`sandcell.sessions.Session.run` for a request in another language than the
kernel's, so it uses the session's internals (its lock, its sandbox, its sockets); a
``language=`` on ``Session.run`` would let it shrink to one call.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from sandcell.e2b.runner import OutputListener
from sandcell.policy.gate import admit
from sandcell.sessions import Session
from sandcell.spec import RunResult

__all__ = ["run_bash", "wrapper_cell"]

_WRAPPER = """
def _sandcell_e2b_cmd(command, env, cwd):
    import os, subprocess
    full = dict(os.environ)
    full.update(env)
    done = subprocess.run(["/bin/bash", "-l", "-c", command], env=full, cwd=cwd,
                          stdin=subprocess.DEVNULL, check=False)
    return done.returncode if done.returncode >= 0 else 128 - done.returncode

try:
    raise SystemExit(_sandcell_e2b_cmd({command!r}, {env!r}, {cwd!r}))
finally:
    del _sandcell_e2b_cmd
"""


def wrapper_cell(command: str, *, env: dict[str, str], cwd: str) -> str:
    """The Python cell that runs ``command`` with Bash in ``cwd`` (a path in the sandbox)."""
    return _WRAPPER.format(command=command, env={str(k): str(v) for k, v in env.items()}, cwd=cwd)


def run_bash(
    session: Session,
    command: str,
    *,
    env: dict[str, str],
    cwd: str,
    timeout_s: float | None,
    on_output: OutputListener | None = None,
) -> RunResult:
    """Run ``command`` in the session's sandbox; one run in the record, as Bash."""
    from sandcell.executor import _Validators
    from sandcell.sessions.session import _now

    with session._lock:
        session._check_alive()
        limits = session.request.effective_limits
        if timeout_s is not None:
            limits = limits.with_(wall_time_s=min(timeout_s, limits.wall_time_s))
        request = replace(session.request, code=command, language="bash", exports=(), limits=limits)
        admission = admit(request, session.profile, cache=session.executor.wheels)
        request = replace(admission.request, packages=session.request.packages)
        validators = _Validators.make(admission, schema=None, model=None, invariants=())
        policy = admission.policy_record()
        run_id = uuid.uuid4().hex
        started_at = _now()
        verdict = admission.decision.verdict
        if verdict != "allow":
            reason = (
                f"denied by profile {session.profile.name!r}: {admission.decision.reason}"
                if verdict == "deny"
                else f"the command needs approval under profile {session.profile.name!r} "
                f"({admission.decision.reason})"
            )
            br = session._not_run(reason)
        else:
            cell = replace(request, code=wrapper_cell(command, env=env, cwd=cwd), language="python")
            br = session._run_cell(cell, run_id, on_output)
        session.cells += 1
        sockets = session._sockets
        result = session.executor.finish(
            request,
            br,
            validators,
            policy,
            run_id=run_id,
            started_at=started_at,
            inputs=session._inputs_record,
            session_id=session.id,
            backend=session._sandbox.backend,
            outside=sockets.take_record() if sockets is not None else None,
            secrets=sockets.secrets if sockets is not None else (),
        )
        session._last_active = time.monotonic()
        if session._sandbox.ended is not None and session._ended is None:
            session._end(session._sandbox.ended)
        session._wake.set()
        return result
