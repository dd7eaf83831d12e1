"""The verdict on a session cell someone cancelled (pure, no sandbox): killed with the reason
given, the session kept when the cell answered the interrupt, ended when it did not."""

from __future__ import annotations

import signal

from sandcell.backends.cell.verdict import CellCancel, classify_cell
from sandcell.spec import IsolationMode, Limits, Outcome


def _verdict(**kw: object) -> tuple[Outcome, str, int | None, int | None]:
    cancel = CellCancel()
    cancel.request("enough")
    cancel.request("a later reason does not replace the first")
    args: dict[str, object] = {
        "reply": None,
        "stopped_by": "cancel",
        "ended_why": None,
        "timeout_s": 5.0,
        "limits": Limits(),
        "mode": IsolationMode.STRICT,
        "cg": None,
        "kernel_status": None,
        "protocol_error": None,
        "cancel": cancel,
    }
    return classify_cell(**{**args, **kw})  # type: ignore[arg-type]


def test_an_interrupted_cell_is_killed_and_the_session_kept() -> None:
    outcome, reason, code, sig = _verdict(reply={"status": "interrupted"})
    assert (outcome, code, sig) == (Outcome.KILLED, None, signal.SIGINT)
    assert (
        reason == "cancelled: enough; the cell was interrupted, the session and its state are kept"
    )


def test_a_cell_that_did_not_stop_ends_the_session() -> None:
    outcome, reason, _, sig = _verdict(ended_why="grace")
    assert (outcome, sig) == (Outcome.KILLED, signal.SIGKILL)
    assert reason.startswith("cancelled: enough and the cell did not stop within")
    assert reason.endswith("; the session ended")


def test_a_cell_that_finished_first_keeps_its_outcome() -> None:
    assert _verdict(reply={"status": "ok"})[0] is Outcome.OK
    assert _verdict(reply={"status": "error", "error": "ValueError"})[0] is Outcome.ERROR
