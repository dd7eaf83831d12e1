"""``commands.run``: a Bash program run as a Bash cell of the sandbox's session.

The session runs it in the same sandbox and workspace, and the profile judges (and the record
keeps) the Bash program itself (:mod:`sandcell.sessions.bash_cell`): a profile that allows Bash
but not Python's ``subprocess`` lets ``ls -la`` run, and a denied command is denied by the shell
checks.
"""

from __future__ import annotations

from sandcell.e2b.runner import OutputListener
from sandcell.sessions import Session
from sandcell.spec import RunResult

__all__ = ["run_bash"]


def run_bash(
    session: Session,
    command: str,
    *,
    env: dict[str, str],
    cwd: str,
    timeout_s: float | None,
    on_output: OutputListener | None = None,
) -> RunResult:
    """Run ``command`` in the session's sandbox; one run in the record, as Bash.

    E2B's timeouts are the caller's wish: one above the session's wall-time limit is held to
    that limit rather than refused.
    """
    ceiling = session.request.effective_limits.wall_time_s
    return session.run(
        command,
        language="bash",
        env=env,
        cwd=cwd,
        timeout_s=None if timeout_s is None else min(timeout_s, ceiling),
        on_output=on_output,
    )
