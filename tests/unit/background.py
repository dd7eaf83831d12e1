"""Whole-program checks started as soon as the suite is collected, read by their tests later.

mypy over the package and importing every module on its own each take most of a minute of CPU in
a process of their own, and most of the suite's time is spent waiting on sandboxes with a CPU to
spare. A test that declares such a check with :func:`started_early` gets it started (at a lower
priority than the suite) when collection ends, and its body reads the finished result with
:func:`result`; tests/unit runs last, so by then the result is usually there. The check is the
same program with the same environment and the same assertions as when the test started it
itself; a check whose test was not selected is never started, and one still running when pytest
ends is killed with everything it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., object])


@dataclass(frozen=True)
class Check:
    """A program whose exit status and output a test asserts on."""

    name: str
    """Unique among the checks: the key its result is kept under."""
    argv: Callable[[], Sequence[str]]
    """The command, built when it starts (so collecting the test module stays cheap)."""
    cwd: Path
    env: Mapping[str, str] | None = None
    """Variables to set on top of this process's environment."""
    timeout_s: float = 600


@dataclass(frozen=True)
class _Running:
    proc: subprocess.Popen[bytes]
    outputs: Path
    """A private directory with the check's ``stdout`` and ``stderr`` (files: a pipe nobody
    reads until the test runs would fill up and stop the check)."""
    started: float


_RUNNING: dict[str, _Running] = {}
_DECLARED: dict[Callable[..., object], tuple[Check, ...]] = {}


def started_early(*checks: Check) -> Callable[[F], F]:
    """Declare the checks a test reads, so that they start when the suite is collected."""

    def mark(test: F) -> F:
        _DECLARED[test] = checks
        return test

    return mark


def start_declared(items: Sequence[pytest.Item]) -> None:
    """Start the checks that the selected tests declared (tests/unit/conftest.py)."""
    for item in items:
        for check in _DECLARED.get(getattr(item, "obj", None), ()):  # type: ignore[arg-type]
            start(check)


def start(check: Check) -> None:
    """Start ``check`` unless it already runs; low priority, in a process group of its own."""
    if check.name in _RUNNING:
        return
    nice = shutil.which("nice")
    argv = [*([nice, "-n", "10"] if nice else []), *check.argv()]
    outputs = Path(tempfile.mkdtemp(prefix="sandcell-check-"))
    with (outputs / "stdout").open("wb") as out, (outputs / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=check.cwd,
            env={**os.environ, **(check.env or {})},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    # Reaped the moment it ends, not when its test reads it: until then it would be a zombie
    # child of this process, and the leak tests count those.
    threading.Thread(target=proc.wait, name=f"reap {check.name}", daemon=True).start()
    _RUNNING[check.name] = _Running(proc, outputs, time.monotonic())


def result(check: Check) -> subprocess.CompletedProcess[str]:
    """The finished check (started now if it was not started early); fails the test when it
    runs past its timeout."""
    start(check)
    running = _RUNNING.pop(check.name)
    left = check.timeout_s - (time.monotonic() - running.started)
    try:
        code = running.proc.wait(timeout=max(left, 0.1))
    except subprocess.TimeoutExpired:
        _kill(running)
        pytest.fail(f"{check.name} ran past its {check.timeout_s:g} s")
    stdout, stderr = (
        (running.outputs / name).read_bytes().decode(errors="replace")
        for name in ("stdout", "stderr")
    )
    shutil.rmtree(running.outputs)
    return subprocess.CompletedProcess(running.proc.args, code, stdout, stderr)


def _kill(running: _Running) -> None:
    if running.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.proc.pid, signal.SIGKILL)
    running.proc.wait()
    shutil.rmtree(running.outputs, ignore_errors=True)


def stop_all() -> None:
    """Kill the checks no test read (the session ended early, or was interrupted)."""
    while _RUNNING:
        _, running = _RUNNING.popitem()
        _kill(running)
