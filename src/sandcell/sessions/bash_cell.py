"""A Bash cell in a session: the Python cell that runs a Bash program in the session's sandbox.

A session's kernel runs Python, so a Bash cell travels to it as a small generated Python cell
that starts ``/bin/bash -l -c PROGRAM`` in the same sandbox and workspace; the program's output
goes straight to the cell's streams and its exit status becomes the cell's. What the profile
judges, and what the record keeps, is the Bash program itself (see
:meth:`sandcell.sessions.Session.run`), never this wrapper.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["bash_cell"]

_WRAPPER = """
def _sandcell_bash_cell(program, env, cwd):
    import os, subprocess
    full = dict(os.environ)
    full.update(env)
    done = subprocess.run(["/bin/bash", "-l", "-c", program], env=full, cwd=cwd,
                          stdin=subprocess.DEVNULL, check=False)
    return done.returncode if done.returncode >= 0 else 128 - done.returncode

try:
    raise SystemExit(_sandcell_bash_cell({program!r}, {env!r}, {cwd!r}))
finally:
    del _sandcell_bash_cell
"""


def bash_cell(program: str, *, env: Mapping[str, str], cwd: str | None) -> str:
    """The Python cell that runs ``program`` with Bash, with ``env`` added to the kernel's
    environment, in ``cwd`` (a path in the sandbox; None: the kernel's working directory)."""
    return _WRAPPER.format(program=program, env={str(k): str(v) for k, v in env.items()}, cwd=cwd)
