"""A sandboxed program meets signals as on a fresh login, whatever its caller ignored.

An ignored signal stays ignored across fork and exec: ``nohup sandcell serve`` ignores SIGHUP, a
shell's background job SIGINT and SIGQUIT. Before the boot reset them (``_boot._default_signals``,
also applied by the namespaces template before it forks a run), every program and every process a
session spawned inherited them: ``kill -HUP`` of a session's process did nothing, and a follow of
it waited for ever (found by a fresh-clone run started under ``nohup``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import backend_unavailable

_IGNORED_BY_CALLER = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
_PROGRAM = """
import signal, subprocess, sys
ASK = ("import signal; "
       "print(sorted(n for n in (1, 2, 3, 15) if signal.getsignal(n) == signal.SIG_IGN))")
exec(ASK)
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
print(subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True).stdout.strip())
"""


def _ignore_them() -> None:
    for number in _IGNORED_BY_CALLER:
        signal.signal(number, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("backend", "start"), [("namespaces", "cold"), ("namespaces", "template"), ("gvisor", "cold")]
)
def test_signals_the_caller_ignored_are_back_at_their_defaults(
    tmp_path: Path, backend: str, start: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root CLI's paths (template start, gVisor) are the ones checked here")
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path), "SANDCELL_PROFILE": "unchecked"}
    argv = [sys.executable, "-m", "sandcell", "run", "--json", "--backend", backend]
    argv += ["--start", start, "-c", _PROGRAM]
    # The point: a caller that ignores signals.
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=120, preexec_fn=_ignore_them
    )
    if proc.returncode != 0 and "not usable" in proc.stderr + proc.stdout:
        backend_unavailable(backend, proc.stderr.strip() or proc.stdout.strip())
    result = json.loads(proc.stdout)
    assert result["outcome"] == "ok", result
    program, interrupt, child = result["stdout"].splitlines()
    assert (program, interrupt, child) == ("[]", "True", "[]"), result["stdout"]
    if start == "template":
        assert "template" in json.dumps(result.get("start")), result.get("start")
