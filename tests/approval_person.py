"""A person at another terminal who decides the first pending tool-call ticket."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandcell.policy.approvals import ApprovalStore
from sandcell.policy.tool_tickets import ToolTicket


def person(path: Path, decide: Callable[[ApprovalStore, ToolTicket], object]) -> threading.Thread:
    """A started thread that polls the store at ``path``, as ``approvals list`` would, until a
    tool ticket is pending (at most 60 s), and hands it to ``decide``."""

    def run() -> None:
        with ApprovalStore(path) as s:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pending = s.list_tools()
                if pending:
                    decide(s, pending[0])
                    return
                time.sleep(0.02)

    thread = threading.Thread(target=run)
    thread.start()
    return thread
