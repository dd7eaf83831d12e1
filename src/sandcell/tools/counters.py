"""Per-tool call counters: the run's total and a sliding minute. Refuse, never queue."""

from __future__ import annotations

import threading
import time
from collections import deque

from sandcell.tools.definitions import ToolLimits


class CallCounter:
    """Counts the calls of one tool; safe to use from the gateway's connection threads."""

    def __init__(self, limits: ToolLimits, clock: object = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._total = 0
        self._recent: deque[float] = deque()
        self._lock = threading.Lock()

    def admit(self) -> str | None:
        """Count one call, or say why it is refused (and do not count it)."""
        now = self._clock()  # type: ignore[operator]
        with self._lock:
            while self._recent and now - self._recent[0] >= 60.0:
                self._recent.popleft()
            if self._total >= self.limits.max_calls:
                return f"the run has made its {self.limits.max_calls} calls of this tool"
            if len(self._recent) >= self.limits.rate_per_minute:
                return f"more than {self.limits.rate_per_minute} calls of this tool in a minute"
            self._total += 1
            self._recent.append(now)
            return None
