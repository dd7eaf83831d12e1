"""When the host interrupts one cell: once, and only after the kernel said the cell started.

The cell loop (:func:`sandcell.backends.cell.loop.supervise_cell`, the same on every rung)
decides at most one reason to stop a cell (its wall time, an output cap, a cancel), and each
reason must reach the cell as exactly one SIGINT. A SIGINT the kernel gets before it started
the cell is ignored there (between cells an interrupt must not kill the kernel), so an
interrupt sent too early would be lost; re-sending it until the cell answers (as the loops once
did) lands a second KeyboardInterrupt inside the cell's own handler for the first whenever the
reply is slow to come back. Instead the kernel says ``started`` once its
SIGINT handler interrupts the cell, and the interrupt waits for that message.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CellInterrupt"]


class CellInterrupt:
    """The interrupt of one cell (``cell_id``): :meth:`request` it for a reason to stop,
    show the kernel's messages to :meth:`saw`; each returns True exactly once, when the
    caller must deliver the SIGINT now."""

    __slots__ = ("cell_id", "sent", "started", "wanted")

    def __init__(self, cell_id: int) -> None:
        self.cell_id = cell_id
        self.started = False
        self.wanted = False
        self.sent = False

    def request(self) -> bool:
        """A reason to stop the cell: whether to send the SIGINT now (False when it was sent
        already, or the cell has not started yet: then :meth:`saw` says when)."""
        self.wanted = True
        return self._due()

    def saw(self, message: Mapping[str, object]) -> bool:
        """A message from the kernel: whether it makes a requested SIGINT due now."""
        if message.get("op") == "started" and message.get("id") == self.cell_id:
            self.started = True
        return self._due()

    def _due(self) -> bool:
        if self.wanted and self.started and not self.sent:
            self.sent = True
            return True
        return False
