"""What a task runs (program, then its test) and whether the run met the task's expectation.

A task passes when its run ends ``ok`` (exit status 0), its ``test``, if any, ran to the end, and
its stdout matches ``expected_stdout``, if given. The test is appended to the program and followed
by a completion marker written to stderr: a program that exits early (``sys.exit(0)`` before the
test, ``os._exit``) leaves no marker and does not pass. The marker holds a nonce drawn per run.

Security limitations: the marker defeats programs that exit before their test, not a program
that reads its own source file inside the sandbox to learn the nonce and prints it. The test runs
in the same interpreter as the program, so a program can also replace what the test calls
(builtins, ``assert``-free monkeypatching). Use these verdicts as a harness's, not as proof.
"""

from __future__ import annotations

import secrets

from sandcell.batch.tasks import Compare, Task
from sandcell.spec import Outcome, RunResult

_MARKER_PREFIX = "sandcell-batch: test completed "


def new_marker() -> str:
    """A fresh completion marker for one run."""
    return _MARKER_PREFIX + secrets.token_hex(12)


def program_for(task: Task, marker: str) -> str:
    """The code the sandbox runs: the program, then the test and its completion marker."""
    if task.test is None:
        return task.request.code
    code = task.request.code
    sep = "" if code.endswith("\n") else "\n"
    if task.request.language == "python":
        line = "\n" + marker + "\n"
        tail = f"import sys as _sandcell_sys\n_sandcell_sys.stderr.write({line!r})\n"
    else:
        tail = f"printf '\\n%s\\n' '{marker}' >&2\n"
    test = task.test if task.test.endswith("\n") else task.test + "\n"
    return f"{code}{sep}\n{test}{tail}"


def strip_marker(stderr: str, marker: str) -> str:
    """The program's stderr without the runner's marker line."""
    return stderr.replace("\n" + marker + "\n", "", 1)


def judge(task: Task, result: RunResult, marker: str) -> tuple[bool, str | None]:
    """``(passed, mismatch)``: mismatch says why a run that ended ``ok`` did not pass."""
    if result.outcome is not Outcome.OK:
        return False, None
    if task.test is not None and ("\n" + marker + "\n") not in result.stderr:
        return False, (
            "the test did not run to completion: the program ended before it (sys.exit, "
            "os._exit or exec in the program)"
        )
    if task.expected_stdout is not None:
        diff = stdout_difference(task.expected_stdout, result.stdout, task.compare)
        if diff is not None:
            return False, diff
    return True, None


def _normal(text: str, compare: Compare) -> list[str]:
    if compare == "exact":
        return text.split("\n")
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def stdout_difference(expected: str, actual: str, compare: Compare) -> str | None:
    """None when ``actual`` matches ``expected`` under ``compare``, else where they differ."""
    want, got = _normal(expected, compare), _normal(actual, compare)
    if want == got:
        return None
    for i, (w, g) in enumerate(zip(want, got, strict=False), start=1):
        if w != g:
            return f"stdout differs ({compare} compare) at line {i}: expected {w!r}, got {g!r}"
    i = min(len(want), len(got)) + 1
    if len(want) > len(got):
        return f"stdout differs ({compare} compare): line {i} missing, expected {want[i - 1]!r}"
    return f"stdout differs ({compare} compare): unexpected line {i}: {got[i - 1]!r}"


__all__ = ["judge", "new_marker", "program_for", "stdout_difference", "strip_marker"]
