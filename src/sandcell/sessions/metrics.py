"""A session's resource samples over time (E2B's ``get_metrics``, ``sandcell session show``).

The watchdog samples the sandbox (:meth:`~sandcell.backends.cell.CellSandbox.metrics`) every
:data:`SAMPLE_EVERY_S` while no cell holds the session's lock, and a caller can ask for one now;
the last :data:`KEPT` samples are kept (an hour at the default pace)."""

from __future__ import annotations

import threading
from collections import deque

from sandcell.backends.cell.state import SandboxMetrics

SAMPLE_EVERY_S = 5.0
KEPT = 720


class MetricsHistory:
    """The newest samples, oldest first; thread-safe."""

    def __init__(self, kept: int = KEPT) -> None:
        self._samples: deque[SandboxMetrics] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def add(self, sample: SandboxMetrics) -> None:
        with self._lock:
            self._samples.append(sample)

    def since(self, timestamp: str | None = None) -> list[SandboxMetrics]:
        """The samples taken at or after ``timestamp`` (ISO 8601; None: all kept)."""
        with self._lock:
            samples = list(self._samples)
        if timestamp is None:
            return samples
        return [s for s in samples if s.timestamp >= timestamp]

    @property
    def last(self) -> SandboxMetrics | None:
        with self._lock:
            return self._samples[-1] if self._samples else None


__all__ = ["KEPT", "SAMPLE_EVERY_S", "MetricsHistory"]
