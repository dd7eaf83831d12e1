"""The cell loop every rung shares, driven through a scripted in-process rung.

The rungs' own adapters (a real kernel behind bubblewrap, gVisor or a microVM) are exercised by
the session contract tests; here each rule of the loop is pinned down on its own: the reply, the
wall time, the interrupt waiting for ``started``, the grace, the caps, a cancel, the session's
end of life, the kernel's end, and a rung's periodic check.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from sandcell.backends.cell import loop as cell_loop
from sandcell.backends.cell.loop import CellRung, supervise_cell
from sandcell.backends.cell.verdict import CellCancel

_ID = 7
Step = Callable[["ScriptedRung"], str | None]


class ScriptedRung(CellRung):
    """A kernel in a list: ``steps`` are what successive pumps do (then: wait, nothing
    happens); an interrupt is answered with an ``interrupted`` reply when ``obeys``."""

    def __init__(
        self, *steps: Step, starts: bool = True, obeys: bool = True, past_end: bool = False
    ) -> None:
        self.steps = list(steps)
        self.starts = starts
        self.obeys = obeys
        self.reads_past_end = past_end
        self.messages: list[dict[str, object]] = []
        self.log: list[str] = []

    def say(self, op: str, **more: object) -> None:
        self.messages.append({"op": op, "id": _ID, **more})
        self.log.append(op)

    def send(self, message: bytes) -> None:
        self.log.append("send")
        if self.starts:
            self.say("started")

    def next_message(self) -> dict[str, object] | None:
        return self.messages.pop(0) if self.messages else None

    def pump(self, timeout_s: float) -> str | None:
        if self.steps:
            return self.steps.pop(0)(self)
        time.sleep(min(max(timeout_s, 0.0), 0.005))
        return None

    def interrupt(self) -> None:
        self.log.append("interrupt")
        if self.obeys:
            self.say("done", status="interrupted")

    def settle(self) -> None:
        self.log.append("settle")


def _reply(rung: ScriptedRung) -> str | None:
    rung.say("done", status="ok")
    return None


def _run(rung: CellRung, **kw: object) -> cell_loop.CellEnd:
    args: dict[str, object] = {"timeout_s": 5.0, "hard_deadline": None} | kw
    return supervise_cell(rung, b"cell", cell_id=_ID, **args)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cell_loop, "INTERRUPT_GRACE_S", 0.05)


def test_the_reply_ends_the_cell_and_is_settled() -> None:
    rung = ScriptedRung(_reply)
    end = _run(rung)
    assert end.reply == {"op": "done", "id": _ID, "status": "ok"}
    assert (end.stopped_by, end.ended_why) == (None, None)
    assert rung.log == ["send", "started", "done", "settle"]
    assert end.wall_ms >= 0


def test_another_cells_reply_is_not_this_ones() -> None:
    def stale(rung: ScriptedRung) -> str | None:
        rung.messages.append({"op": "done", "id": _ID - 1, "status": "ok"})
        return None

    end = _run(ScriptedRung(stale, _reply))
    assert end.reply is not None and end.reply["status"] == "ok"


def test_wall_time_interrupts_once_and_keeps_the_session() -> None:
    rung = ScriptedRung()
    end = _run(rung, timeout_s=0.02)
    assert end.stopped_by == "wall_time" and end.ended_why is None
    assert end.reply is not None and end.reply["status"] == "interrupted"
    assert rung.log.count("interrupt") == 1


def test_the_interrupt_waits_for_the_kernel_to_start_the_cell() -> None:
    def late_start(rung: ScriptedRung) -> str | None:
        time.sleep(0.03)  # past the wall time before the kernel says it started
        return None

    def start(rung: ScriptedRung) -> str | None:
        rung.say("started")
        return None

    rung = ScriptedRung(late_start, lambda r: None, start, starts=False)
    end = _run(rung, timeout_s=0.01)
    assert end.stopped_by == "wall_time" and end.ended_why is None
    assert rung.log == ["send", "started", "interrupt", "done", "settle"]


def test_a_cell_that_ignores_its_interrupt_ends_the_session_after_the_grace() -> None:
    rung = ScriptedRung(obeys=False)
    t0 = time.monotonic()
    end = _run(rung, timeout_s=0.02)
    assert (end.stopped_by, end.ended_why, end.reply) == ("wall_time", "grace", None)
    assert rung.log.count("interrupt") == 1 and "settle" not in rung.log
    assert time.monotonic() - t0 >= 0.02 + 0.05


def test_an_output_cap_interrupts_and_the_first_reason_is_kept() -> None:
    cancel = CellCancel()

    def cancel_and_cap(rung: ScriptedRung) -> str | None:
        cancel.request("too late")
        return "stderr"

    rung = ScriptedRung(lambda r: "stdout", cancel_and_cap, obeys=False)
    end = _run(rung, cancel=cancel)
    assert (end.stopped_by, end.ended_why) == ("stdout", "grace")
    assert rung.log.count("interrupt") == 1


def test_a_cancel_interrupts_as_at_the_wall_time() -> None:
    cancel = CellCancel()

    def ask(rung: ScriptedRung) -> str | None:
        cancel.request("the user asked")
        return None

    rung = ScriptedRung(ask)
    end = _run(rung, cancel=cancel)
    assert end.stopped_by == "cancel" and end.ended_why is None
    assert end.reply is not None and end.reply["status"] == "interrupted"
    assert rung.log.count("interrupt") == 1


def test_an_ignored_cancel_ends_the_session_after_the_grace() -> None:
    cancel = CellCancel()
    cancel.request("stop")
    end = _run(ScriptedRung(obeys=False), cancel=cancel)
    assert (end.stopped_by, end.ended_why) == ("cancel", "grace")


def test_the_sessions_end_of_life_comes_before_everything_but_a_reply() -> None:
    cancel = CellCancel()
    cancel.request("stop")
    rung = ScriptedRung()
    end = _run(rung, hard_deadline=time.monotonic(), cancel=cancel)
    assert (end.stopped_by, end.ended_why, end.reply) == (None, "lifetime", None)
    assert "interrupt" not in rung.log


def test_the_kernels_end_ends_the_session() -> None:
    end = _run(ScriptedRung(lambda r: "ended"))
    assert (end.stopped_by, end.ended_why, end.reply) == (None, "kernel", None)


def test_a_reply_queued_with_the_end_is_read_first_where_the_rung_says_so() -> None:
    def reply_and_end(rung: ScriptedRung) -> str | None:
        rung.say("done", status="ok")
        return "ended"

    kept = _run(ScriptedRung(reply_and_end, past_end=True))
    assert kept.ended_why is None and kept.reply is not None
    lost = _run(ScriptedRung(reply_and_end))
    assert lost.ended_why == "kernel" and lost.reply is None


def test_a_limit_the_rung_checks_from_the_host_ends_the_session() -> None:
    class Metered(ScriptedRung):
        check_every_s = 0.01

        def __init__(self) -> None:
            super().__init__()
            self.checks = 0

        def exhausted(self) -> bool:
            self.checks += 1
            return self.checks >= 3

    rung = Metered()
    t0 = time.monotonic()
    end = _run(rung)
    assert (end.stopped_by, end.ended_why) == (None, "kernel")
    assert rung.checks == 3 and time.monotonic() - t0 >= 0.02
