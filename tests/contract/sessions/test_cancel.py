"""``Session.cancel`` on every rung: the running cell is interrupted as at its wall time (state
kept), its result and record say it was cancelled, and a cell that ignores the interrupt ends
the session after the grace, as a timed-out one does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from tests.contract.sessions.rungs import open_session

from sandcell import Executor, Limits, Outcome, RunResult
from sandcell.backends.cell.verdict import CANCEL_POLL_S
from sandcell.sessions import Session
from sandcell.spec import MiB

SLOW = "import time\nfor _ in range(600):\n    time.sleep(0.1)\n"
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "print('ignoring', flush=True)\ntime.sleep(600)\n"
)


@pytest.fixture
def session(ex: Executor) -> Iterator[Session]:
    with open_session(ex, limits=Limits(wall_time_s=60, memory_bytes=256 * MiB)) as s:
        yield s


def _in_thread(
    session: Session, code: str, *, ready_on: str | None = None
) -> tuple[threading.Thread, list[RunResult]]:
    """Run ``code`` in a thread and cancel it once it runs (and, with ``ready_on``, once it
    has printed that: a cancel sent before the cell set up its handler tests nothing)."""
    results: list[RunResult] = []
    ready = threading.Event()

    def listen(stream: str, text: str) -> None:
        if ready_on is not None and ready_on in text:
            ready.set()

    worker = threading.Thread(target=lambda: results.append(session.run(code, on_output=listen)))
    worker.start()
    if ready_on is not None:
        assert ready.wait(60), "the cell never said it was ready"
    deadline = time.monotonic() + 60
    while not session.cancel("enough"):
        assert time.monotonic() < deadline, "the cell never started"
        time.sleep(0.05)
    return worker, results


def test_cancel_interrupts_the_cell_and_keeps_state(session: Session) -> None:
    assert session.cancel("nothing runs") is False
    session.run("kept = 41")
    worker, results = _in_thread(session, SLOW)
    worker.join(60)
    [cell] = results
    assert cell.outcome is Outcome.KILLED, cell.reason
    assert cell.reason.startswith("cancelled: enough") and "state are kept" in cell.reason
    record = session.executor.audit.get(cell.run_id)
    assert record is not None and record.record["outcome"] == "killed"
    assert session.ended is None
    assert session.run("print(kept + 1)").stdout == "42\n"
    assert session.cancel("after") is False


def test_a_cell_that_ignores_the_cancel_ends_the_session(session: Session) -> None:
    worker, results = _in_thread(session, STUBBORN, ready_on="ignoring")
    worker.join(60)
    [cell] = results
    assert cell.outcome is Outcome.KILLED, cell.reason
    assert cell.reason.startswith("cancelled: enough") and "did not stop" in cell.reason
    assert session.ended is not None


def test_one_cancel_interrupts_the_cell_once(session: Session) -> None:
    """A cell that handles the interrupt then counts any further SIGINT instead of dying of it:
    one cancel reaches it once, also while its handler runs for several of the host's cancel
    polls (once the host re-sent the SIGINT at each poll until the cell answered, and a second
    KeyboardInterrupt landed inside the program's own handler for the first)."""
    polls = 5
    code = (
        "import signal, time\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
        "except KeyboardInterrupt:\n"
        "    signal.signal(signal.SIGINT, lambda *a: print('again', flush=True))\n"
        "    print('caught', flush=True)\n"
        f"    time.sleep({polls * CANCEL_POLL_S})\n"
        "    print('handled', flush=True)\n"
    )
    worker, results = _in_thread(session, code, ready_on="ready")
    worker.join(60)
    [cell] = results
    assert "caught" in cell.stdout, cell
    assert "again" not in cell.stdout, cell.stdout
