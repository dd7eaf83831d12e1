"""What a task runs and whether it passed, from a verdict the program cannot write.

A task passes when its run ends ``ok`` (exit status 0), its ``test``, if any, passed, and its
stdout matches ``expected_stdout``, if given.

A task with a test does not run its program and test as one script (a program can fake whatever
it shares a process with: print a success marker, exit before the test, patch the test's
functions). The policy checks see the program and the test as the caller gave them
(:func:`checked_request`); the sandbox runs them under the harness of
:mod:`sandcell.batch._harness` (:func:`sandbox_request`): the test in a process the program's code
never runs in, calling the program's functions in another process and getting plain data back.
The harness learns a secret drawn for the run (:func:`new_secret`) from its standard input only
once the program process cannot read it, and reports the test's verdict on one line of stderr
with that secret. :func:`judge` believes exactly one such line with this run's secret, nothing
else.

Only Python tasks can have a test: a shell test would run in the program's own shell.
"""

from __future__ import annotations

import ast
import secrets
from dataclasses import replace
from pathlib import Path

from sandcell.batch import _harness
from sandcell.batch.tasks import Compare, Task
from sandcell.spec import Outcome, RunRequest, RunResult

_VERDICT = _harness.VERDICT_PREFIX


def _harness_source() -> str:
    """The harness as sent with every task: its source without docstrings, which are a third of
    it and would be compiled again in every run."""
    tree = ast.parse(Path(_harness.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return (
        "# sandcell batch harness: src/sandcell/batch/_harness.py without its docstrings\n"
        + ast.unparse(tree)
    )


_HARNESS_SOURCE = _harness_source()


def new_secret() -> str:
    """A fresh secret for one run: the harness's verdict line must carry it."""
    return secrets.token_hex(_harness.SECRET_HEX // 2)


def checked_code(task: Task) -> str:
    """The program, then its test: what the policy checks judge."""
    if task.test is None:
        return task.request.code
    code = task.request.code
    sep = "" if code.endswith("\n") else "\n"
    test = task.test if task.test.endswith("\n") else task.test + "\n"
    return f"{code}{sep}\n{test}"


def checked_request(task: Task) -> RunRequest:
    """The request the profile admits: the program and its test as given."""
    return replace(task.request, code=checked_code(task))


def program_for(task: Task) -> str:
    """The code the sandbox runs: the program alone, or the harness over program and test."""
    if task.test is None:
        return task.request.code
    return f"{_HARNESS_SOURCE}\n\nmain({task.request.code!r}, {task.test!r})\n"


def stdin_for(task: Task, secret: str) -> bytes:
    """The standard input the sandbox gets: the secret line first when there is a test."""
    if task.test is None:
        return task.request.stdin
    return secret.encode("ascii") + b"\n" + task.request.stdin


def sandbox_request(admitted: RunRequest, task: Task, secret: str) -> RunRequest:
    """The admitted request (limits, packages resolved) as the sandbox runs it."""
    if task.test is None:
        return admitted
    return replace(admitted, code=program_for(task), stdin=stdin_for(task, secret))


def _verdicts(stderr: str, secret: str) -> list[str]:
    head = _VERDICT + secret + " "
    return [line[len(head) :] for line in stderr.split("\n") if line.startswith(head)]


def strip_verdict(stderr: str, secret: str) -> str:
    """The program's stderr without the harness's verdict line."""
    for verdict in _verdicts(stderr, secret):
        stderr = stderr.replace(f"\n{_VERDICT}{secret} {verdict}\n", "", 1)
    return stderr


def judge(task: Task, result: RunResult, secret: str) -> tuple[bool, str | None]:
    """``(passed, mismatch)``: mismatch says why a run that ended ``ok`` did not pass."""
    if result.outcome is not Outcome.OK:
        return False, None
    if task.test is not None:
        verdicts = _verdicts(result.stderr, secret)
        if len(verdicts) != 1:
            return False, (
                f"the test harness gave {len(verdicts)} verdicts for this run, not one: the run "
                "was tampered with or its stderr was cut"
            )
        if verdicts[0] != "passed":
            return False, verdicts[0].removeprefix("failed: ")
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


__all__ = [
    "checked_code",
    "checked_request",
    "judge",
    "new_secret",
    "program_for",
    "sandbox_request",
    "stdin_for",
    "stdout_difference",
    "strip_verdict",
]
