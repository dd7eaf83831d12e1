"""Browser sessions of the approval pages: a random id in a cookie, everything else here.

A browser cannot send ``Authorization: Bearer`` on a link or a form, so ``/ui`` trades a
tenant's key (its API key, or one of its approver keys), once, at the login form, for a
session. The cookie carries only the session's
random id (32 bytes); the key itself is never stored, in the cookie or here. The server keeps,
per session, the tenant it belongs to (by id), the SHA-256 of the key it logged in with (what the
service store keeps too: it authenticates nothing, and lets the pages end the session when the
key is rotated) and its CSRF token. A session exists before login too (``tenant`` None), so
that the login form carries a token like every other form; logging in replaces it with a new
id, so an id planted in a browser before login never becomes a logged-in one.

Anonymous sessions (the login form's) and logged-in ones are kept in two tables, each bounded
on its own: however many login forms are loaded, they only ever push out other anonymous
sessions, never a logged-in one (and :class:`LoginLimiter` caps how fast one address loads
them or tries keys).

Sessions live in memory: a restart of the service logs every browser out, which costs a login
and keeps no bearer secret on disk. They end after :data:`IDLE_S` without a request, after
:data:`LIFETIME_S` in any case, at logout, and when their tenant is removed or its key rotated
(checked on every request, see :mod:`sandcell.service.ui.pages`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

__all__ = ["IDLE_S", "LIFETIME_S", "BrowserSession", "BrowserSessions", "LoginLimiter"]

IDLE_S = 3600.0
"""A session with no request for this long has ended."""
LIFETIME_S = 12 * 3600.0
"""No session outlives this, however busy."""
MAX_SESSIONS = 10_000
"""Sessions kept at once in each table (anonymous, logged in); past it the least recently used
of that table go first (anonymous ones are cheap to make, so a flood of login-page loads must
not grow memory without bound)."""
LOGINS_PER_MINUTE = 60
"""Anonymous login steps (a login form loaded without a session, a wrong key tried) per client
address in any 60 seconds. Not against guessing (a 256-bit key cannot be guessed) but against a
flood: each step makes a session or costs a key lookup."""
_LIMITED_ADDRESSES = 10_000


def _key(session_id: str) -> str:
    # Looked up by a hash of the id: the dict's comparisons then leak nothing about live ids.
    return hashlib.sha256(session_id.encode("utf-8", errors="surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class BrowserSession:
    """One browser's session: whose it is (None before login) and its form token."""

    id: str
    tenant: str | None
    """The id of the tenant it is logged in as (None before login)."""
    csrf: str
    created: float
    last_seen: float
    key_sha256: str = ""
    """The hash of the key the session logged in with; empty before login (and a session
    without one is refused by the pages: a tenant's session that cannot be checked has ended)."""

    def token_matches(self, token: str) -> bool:
        """Whether a form's token is this session's (compared in constant time)."""
        return hmac.compare_digest(self.csrf.encode(), token.encode("utf-8", "surrogatepass"))


class BrowserSessions:
    """The live browser sessions of one service process."""

    def __init__(
        self,
        *,
        idle_s: float = IDLE_S,
        lifetime_s: float = LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._idle_s = idle_s
        self._lifetime_s = lifetime_s
        self._lock = threading.Lock()
        self._by_key: dict[str, BrowserSession] = {}
        """Logged-in sessions."""
        self._anonymous: dict[str, BrowserSession] = {}

    def new(self, tenant: str | None, *, key_sha256: str = "") -> BrowserSession:
        """A session: anonymous (``tenant`` None, for the login form), or the tenant's that
        logged in with the key of hash ``key_sha256``."""
        now = self._clock()
        session = BrowserSession(
            id=secrets.token_urlsafe(32),
            tenant=tenant,
            csrf=secrets.token_urlsafe(32),
            created=now,
            last_seen=now,
            key_sha256=key_sha256,
        )
        table = self._anonymous if tenant is None else self._by_key
        with self._lock:
            if len(table) >= MAX_SESSIONS:
                self._evict(table, now)
            table[_key(session.id)] = session
        return session

    def get(self, session_id: str | None) -> BrowserSession | None:
        """The live session with this id (its idle clock restarted), or None."""
        if not session_id:
            return None
        now = self._clock()
        key = _key(session_id)
        with self._lock:
            table = self._by_key if key in self._by_key else self._anonymous
            session = table.get(key)
            if session is None:
                return None
            if self._expired(session, now):
                del table[key]
                return None
            session = replace(session, last_seen=now)
            table[key] = session
            return session

    def end(self, session_id: str) -> None:
        with self._lock:
            self._by_key.pop(_key(session_id), None)
            self._anonymous.pop(_key(session_id), None)

    def end_tenant(self, tenant: str) -> int:
        """End every session of ``tenant``; how many there were."""
        with self._lock:
            keys = [k for k, s in self._by_key.items() if s.tenant == tenant]
            for k in keys:
                del self._by_key[k]
        return len(keys)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key) + len(self._anonymous)

    def _expired(self, session: BrowserSession, now: float) -> bool:
        return now - session.last_seen > self._idle_s or now - session.created > self._lifetime_s

    def _evict(self, table: dict[str, BrowserSession], now: float) -> None:
        """Drop the expired sessions of ``table``, then its least recently used tenth (caller
        holds the lock)."""
        for k in [k for k, s in table.items() if self._expired(s, now)]:
            del table[k]
        if len(table) >= MAX_SESSIONS:
            oldest = sorted(table, key=lambda k: table[k].last_seen)
            for k in oldest[: max(1, MAX_SESSIONS // 10)]:
                del table[k]


class LoginLimiter:
    """How many anonymous login steps (a login form loaded without a session, a key tried) one
    client address may take in any minute: past it, :meth:`take` says how long to wait."""

    def __init__(
        self,
        *,
        per_minute: int = LOGINS_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._steps: dict[str, deque[float]] = {}

    def wait_s(self, address: str) -> int | None:
        """How long ``address`` must wait before its next step (None: it may take one now),
        without counting one."""
        now = self._clock()
        with self._lock:
            steps = self._steps.get(address)
            if steps is None:
                return None
            while steps and steps[0] <= now - 60.0:
                steps.popleft()
            if len(steps) >= self._per_minute:
                return max(1, math.ceil(steps[0] + 60.0 - now))
            return None

    def take(self, address: str) -> int | None:
        """Count one step of ``address``; None when allowed, else the seconds to wait."""
        now = self._clock()
        with self._lock:
            steps = self._steps.get(address)
            if steps is None:
                if len(self._steps) >= _LIMITED_ADDRESSES:
                    self._forget_idle(now)
                steps = self._steps[address] = deque()
            while steps and steps[0] <= now - 60.0:
                steps.popleft()
            if len(steps) >= self._per_minute:
                return max(1, math.ceil(steps[0] + 60.0 - now))
            steps.append(now)
            return None

    def _forget_idle(self, now: float) -> None:
        for address in [a for a, s in self._steps.items() if not s or s[-1] <= now - 60.0]:
            del self._steps[address]
        if len(self._steps) >= _LIMITED_ADDRESSES:
            # Every address busy within the minute: the longest-quiet half goes.
            quiet = sorted(self._steps, key=lambda a: self._steps[a][-1])
            for address in quiet[: _LIMITED_ADDRESSES // 2]:
                del self._steps[address]
