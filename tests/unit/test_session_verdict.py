"""The verdict on a session cell, from what the host saw (pure, no sandbox)."""

from __future__ import annotations

import signal

from sandcell.backends.cell.verdict import classify_cell
from sandcell.backends.host.cgroups import CgroupUsage
from sandcell.spec import IsolationMode, Limits, Outcome

LIMITS = Limits(cpu_time_s=10)


def _verdict(**kw: object) -> tuple[Outcome, str, int | None, int | None]:
    args: dict[str, object] = {
        "reply": None,
        "stopped_by": None,
        "ended_why": None,
        "timeout_s": 5.0,
        "limits": LIMITS,
        "mode": IsolationMode.STRICT,
        "cg": None,
        "kernel_status": None,
        "protocol_error": None,
    }
    return classify_cell(**{**args, **kw})  # type: ignore[arg-type]


def test_replies() -> None:
    assert _verdict(reply={"status": "ok"})[:1] == (Outcome.OK,)
    assert _verdict(reply={"status": "exit", "exit_code": 3})[::2] == (Outcome.ERROR, 3)
    assert _verdict(reply={"status": "error", "error": "ValueError"})[1] == (
        "the cell raised ValueError"
    )
    timeout = _verdict(reply={"status": "interrupted"}, stopped_by="wall_time")
    assert (timeout[0], timeout[3]) == (Outcome.TIMEOUT, signal.SIGINT)
    assert "state are kept" in timeout[1]
    memory = _verdict(reply={"status": "error", "error": "MemoryError"}, mode=IsolationMode.RLIMITS)
    assert memory[0] is Outcome.MEMORY_LIMIT


def test_the_session_ends() -> None:
    grace = _verdict(ended_why="grace", stopped_by="stdout")
    assert (grace[0], grace[3]) == (Outcome.OUTPUT_LIMIT, signal.SIGKILL)
    assert _verdict(ended_why="lifetime")[0] is Outcome.TIMEOUT
    killed = _verdict(ended_why="kernel", kernel_status=signal.SIGKILL)
    assert killed[0] is Outcome.KILLED and killed[1].endswith("; the session ended")
    cpu = CgroupUsage(
        cpu_ms=10_000.0, peak_memory_bytes=None, oom_killed=False, pids_limit_hit=False
    )
    assert _verdict(ended_why="kernel", kernel_status=signal.SIGKILL, cg=cpu)[0] is (
        Outcome.TIMEOUT
    )
    exited = _verdict(ended_why="kernel", kernel_status=2 << 8)
    assert exited[::2] == (Outcome.ERROR, 2)
    broken = _verdict(ended_why="kernel", protocol_error="frame too long")
    assert "broke its protocol" in broken[1]
