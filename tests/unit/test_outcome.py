"""The one outcome classifier every rung shares: its order of precedence, row by row (pure)."""

from __future__ import annotations

import signal

import pytest

from sandcell.backends.host.outcome import Seen, classify
from sandcell.spec import IsolationMode, Limits, Outcome

LIMITS = Limits(cpu_time_s=2, memory_bytes=32 << 20, stdout_bytes=10, stderr_bytes=20)
SIGINT, SIGKILL, SIGXCPU, SIGSEGV = signal.SIGINT, signal.SIGKILL, signal.SIGXCPU, signal.SIGSEGV

# Each row: what was seen (beside the defaults below), then (outcome, reason, exit code, signal).
# Rows come in pairs: the second holds the first's facts plus one of a stage below it, which must
# not change the outcome.
RUNS: list[tuple[dict[str, object], tuple[Outcome, str, int | None, int | None]]] = [
    (
        {"stopped_by": "cancel", "cancel_reason": "enough", "started": False},
        (Outcome.KILLED, "cancelled: enough", None, None),
    ),
    (
        {"stopped_by": "cancel", "signal": SIGKILL, "oom_killed": True},
        (Outcome.KILLED, "cancelled: no reason given", None, SIGKILL),
    ),
    (
        {"started": False, "stopped_by": "wall_time"},
        (
            Outcome.TIMEOUT,
            "wall-time limit of 1.5 s reached before the program started",
            None,
            None,
        ),
    ),
    (
        {"started": False, "boot_failed": True, "exit_code": 125, "detail": "no seccomp"},
        (
            Outcome.INFRA_ERROR,
            "the sandbox could not apply an isolation layer: no seccomp",
            125,
            None,
        ),
    ),
    (
        {"started": False, "exit_code": 1},
        (Outcome.INFRA_ERROR, "the sandbox did not start the program: no output", 1, None),
    ),
    (
        {"started": False, "failure": "the job could not be sent: eof", "reported": False},
        (Outcome.INFRA_ERROR, "the job could not be sent: eof", None, None),
    ),
    (
        {"failure": "the guest agent failed: x", "reported": False, "detail": "panic"},
        (Outcome.INFRA_ERROR, "the guest agent failed: x: panic", None, None),
    ),
    (
        {
            "failure": "the VM stopped during the run",
            "sandbox_died": True,
            "reported": False,
            "detail": "oops",
        },
        (
            Outcome.KILLED,
            "the VM stopped during the run (guest kernel crash or QEMU died): oops",
            None,
            None,
        ),
    ),
    (
        # A failure after the host's stop: the stop names the outcome.
        {"failure": "the guest did not report", "reported": False, "stopped_by": "wall_time"},
        (Outcome.TIMEOUT, "wall-time limit of 1.5 s reached", None, None),
    ),
    (
        {"stopped_by": "wall_time", "signal": SIGKILL, "oom_killed": True},
        (Outcome.TIMEOUT, "wall-time limit of 1.5 s reached", None, SIGKILL),
    ),
    (
        {"stopped_by": "stderr", "signal": SIGKILL, "oom_killed": True},
        (Outcome.OUTPUT_LIMIT, "stderr exceeded its cap of 20 bytes", None, SIGKILL),
    ),
    (
        {"oom_killed": True, "signal": SIGKILL, "cpu_ms": 5000.0},
        (Outcome.MEMORY_LIMIT, "memory limit of 33554432 bytes reached", None, SIGKILL),
    ),
    (
        {"signal": SIGKILL, "cpu_ms": 1990.0},
        (Outcome.TIMEOUT, "CPU-time limit of 2 s reached", None, SIGKILL),
    ),
    (
        {"signal": SIGXCPU, "cpu_ms": None},
        (Outcome.TIMEOUT, "CPU-time limit of 2 s reached", None, SIGXCPU),
    ),
    (
        {"signal": SIGKILL, "cpu_ms": 100.0},
        (Outcome.KILLED, "killed by signal 9 (SIGKILL)", None, SIGKILL),
    ),
    (
        {"signal": SIGSEGV, "mode": IsolationMode.RLIMITS, "error": "MemoryError"},
        (Outcome.KILLED, "killed by signal 11 (SIGSEGV)", None, SIGSEGV),
    ),
    (
        {
            "signal": SIGKILL,
            "oom_killed": True,
            "heap_limit_bytes": 1 << 20,
            "error": "MemoryError",
        },
        (Outcome.MEMORY_LIMIT, "memory limit of 33554432 bytes reached", None, SIGKILL),
    ),
    (
        {
            "exit_code": 1,
            "mode": IsolationMode.RLIMITS,
            "error": "MemoryError",
            "heap_limit_bytes": 1 << 20,
        },
        (Outcome.MEMORY_LIMIT, "Wasm heap maximum of 1048576 bytes reached", 1, None),
    ),
    (
        {"exit_code": 1, "mode": IsolationMode.RLIMITS, "error": "MemoryError"},
        (Outcome.MEMORY_LIMIT, "address-space limit of 33554432 bytes reached", 1, None),
    ),
    (
        {"exit_code": 1, "error": "MemoryError"},
        (Outcome.ERROR, "exited with status 1", 1, None),
    ),
    ({"exit_code": 0}, (Outcome.OK, "exited with status 0", 0, None)),
]

KEPT = "; the cell was interrupted, the session and its state are kept"
ENDED = "; the session ended"
CELLS: list[tuple[dict[str, object], tuple[Outcome, str, int | None, int | None]]] = [
    (
        {"ended": "lifetime", "stopped_by": "wall_time", "status": "interrupted"},
        (Outcome.TIMEOUT, "the session reached its maximum lifetime" + ENDED, None, None),
    ),
    (
        {"ended": "grace", "stopped_by": "wall_time"},
        (
            Outcome.TIMEOUT,
            "wall-time limit of 5 s reached and the cell did not stop within 2 s of the "
            "interrupt" + ENDED,
            None,
            SIGKILL,
        ),
    ),
    (
        {"ended": "grace", "stopped_by": "cancel", "cancel_reason": "enough"},
        (
            Outcome.KILLED,
            "cancelled: enough and the cell did not stop within 2 s of the interrupt" + ENDED,
            None,
            SIGKILL,
        ),
    ),
    (
        {"ended": "grace", "stopped_by": "stdout"},
        (
            Outcome.OUTPUT_LIMIT,
            "stdout exceeded its cap and the cell did not stop within 2 s of the interrupt" + ENDED,
            None,
            SIGKILL,
        ),
    ),
    (
        {"stopped_by": "cancel", "cancel_reason": "enough", "status": "interrupted"},
        (Outcome.KILLED, "cancelled: enough" + KEPT, None, SIGINT),
    ),
    (
        # The cell finished before the interrupt reached it: its own end counts.
        {"stopped_by": "cancel", "status": "ok"},
        (Outcome.OK, "the cell ran to the end", 0, None),
    ),
    (
        {"stopped_by": "wall_time", "status": "interrupted", "oom_killed": True},
        (Outcome.TIMEOUT, "wall-time limit of 5 s reached" + KEPT, None, SIGINT),
    ),
    (
        {"stopped_by": "stdout", "status": "error", "error": "ValueError"},
        (
            Outcome.OUTPUT_LIMIT,
            "stdout exceeded its cap of 10 bytes; the cell was interrupted, the session is kept",
            None,
            SIGINT,
        ),
    ),
    (
        # The kernel died after the host's stop: its death decides, as a run's does.
        {"ended": "kernel", "stopped_by": "stdout", "protocol_error": "frame too long"},
        (Outcome.ERROR, "the kernel broke its protocol (frame too long)" + ENDED, None, None),
    ),
    (
        {"ended": "kernel", "stopped_by": "wall_time", "oom_killed": True, "signal": SIGKILL},
        (
            Outcome.MEMORY_LIMIT,
            "memory limit of 33554432 bytes for the session reached, the kernel was killed" + ENDED,
            None,
            SIGKILL,
        ),
    ),
    (
        {"ended": "kernel", "signal": SIGKILL, "cpu_ms": 2000.0},
        (Outcome.TIMEOUT, "CPU-time limit of 2 s for the session reached" + ENDED, None, SIGKILL),
    ),
    (
        {"ended": "kernel", "signal": SIGKILL, "cpu_ms": None},
        (
            Outcome.KILLED,
            "the session's interpreter was killed by signal 9 (SIGKILL)" + ENDED,
            None,
            SIGKILL,
        ),
    ),
    (
        # A dead kernel's exit is an error even with status 0: the session is gone.
        {"ended": "kernel", "exit_code": 0, "status": "ok"},
        (Outcome.ERROR, "the session's interpreter exited with status 0" + ENDED, 0, None),
    ),
    (
        # A live kernel's reply: its cgroup's facts are the session's, not the cell's end.
        {"status": "ok", "oom_killed": True, "signal": SIGKILL},
        (Outcome.OK, "the cell ran to the end", 0, None),
    ),
    (
        {"status": "exit", "exit_code": 0},
        (Outcome.OK, "the cell called exit with status 0", 0, None),
    ),
    (
        {"status": "exit", "exit_code": 3, "mode": IsolationMode.RLIMITS, "error": "MemoryError"},
        (Outcome.ERROR, "the cell called exit with status 3", 3, None),
    ),
    (
        {"status": "error", "error": "MemoryError", "heap_limit_bytes": 1 << 20},
        (
            Outcome.MEMORY_LIMIT,
            "Wasm heap maximum of 1048576 bytes reached (a limit of the whole session); "
            "the session is kept",
            1,
            None,
        ),
    ),
    (
        {"status": "error", "error": "MemoryError", "mode": IsolationMode.RLIMITS},
        (
            Outcome.MEMORY_LIMIT,
            "address-space limit of 33554432 bytes reached (a limit of the whole session); "
            "the session is kept",
            1,
            None,
        ),
    ),
    (
        {"status": "interrupted"},
        (Outcome.ERROR, "the cell raised KeyboardInterrupt", 1, None),
    ),
    (
        {"status": "error", "error": "ValueError"},
        (Outcome.ERROR, "the cell raised ValueError", 1, None),
    ),
]


def _seen(subject: str, facts: dict[str, object]) -> Seen:
    base: dict[str, object] = {
        "subject": subject,
        "limits": LIMITS,
        "mode": IsolationMode.STRICT,
        "wall_time_s": 1.5 if subject == "run" else 5.0,
        "grace_s": 2.0,
    }
    return Seen(**{**base, **facts})  # type: ignore[arg-type]


@pytest.mark.parametrize(("facts", "verdict"), RUNS, ids=[str(i) for i in range(len(RUNS))])
def test_a_run(
    facts: dict[str, object], verdict: tuple[Outcome, str, int | None, int | None]
) -> None:
    assert classify(_seen("run", facts)) == verdict


@pytest.mark.parametrize(("facts", "verdict"), CELLS, ids=[str(i) for i in range(len(CELLS))])
def test_a_cell(
    facts: dict[str, object], verdict: tuple[Outcome, str, int | None, int | None]
) -> None:
    assert classify(_seen("cell", facts)) == verdict
