"""The Node sessions behind an E2B sandbox's JavaScript and TypeScript contexts.

A sandbox's own session has a Python kernel. A JavaScript or TypeScript context (and each
language's default context, which ``run_code(language="js")`` without a context uses) is a
Node session of its own: another sandbox of the same profile, holding one of the tenant's
sandbox slots, opened at the context's creation (a default one at its first cell) and ended
with the sandbox (its kill, its timeout, a pause) or when the context is restarted or removed.
Its files are its own: ``/home/user`` there is not the sandbox's (see docs/e2b.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from sandcell.e2b.errors import E2BError
from sandcell.service.core import Service
from sandcell.sessions import Session

__all__ = ["DEFAULT_KEYS", "NodeKernels", "ender"]

DEFAULT_KEYS = {"javascript": "default:javascript", "typescript": "default:typescript"}
"""The keys of the default contexts' kernels (a context's kernel is keyed by its id)."""

Ender = Callable[[Session], None]
"""Ends a kernel's session and gives back its slot."""


class NodeKernels:
    """The live Node sessions of one sandbox, by context. Thread-safe."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        # One opening at a time: two first cells of one context must not open two kernels.
        self._opening = threading.Lock()
        self._ended: str | None = None

    def kernel(self, key: str, open_kernel: Callable[[], Session], end: Ender) -> Session:
        """The live session of ``key``, opened by ``open_kernel`` when there is none (or the one
        there has ended: its lifetime, or a cell that ignored its interrupt). Blocking."""
        with self._opening:
            with self._lock:
                self._refuse_if_ended()
                found = self._sessions.get(key)
                if found is not None and found.ended is not None:
                    del self._sessions[key]
            if found is not None:
                if found.ended is None:
                    return found
                end(found)
            session = open_kernel()
            with self._lock:
                late = self._ended is not None
                if not late:
                    self._sessions[key] = session
            if late:
                end(session)
                self._refuse_if_ended()
            return session

    def live(self, key: str) -> Session | None:
        with self._lock:
            return self._sessions.get(key)

    def drop(self, key: str, end: Ender) -> None:
        """End ``key``'s kernel (a context restarted or removed): its next cell opens afresh."""
        with self._lock:
            session = self._sessions.pop(key, None)
        if session is not None:
            end(session)

    def end_all(self, why: str, end: Ender) -> None:
        """The sandbox ended (``why``): every kernel ends, and none opens from now on."""
        with self._lock:
            self._ended = why
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            with contextlib.suppress(Exception):
                end(session)

    def _refuse_if_ended(self) -> None:
        if self._ended is not None:
            raise E2BError(502, f"the sandbox ended: {self._ended}")


def ender(service: Service, tenant_id: str, why: str) -> Ender:
    """What ends a kernel of the tenant's sandbox: its cell stopped, its sandbox closed, its
    slot given back."""

    def end(session: Session) -> None:
        try:
            session.cancel(why)
            session.close()
        finally:
            service.quotas.release(tenant_id)

    return end
