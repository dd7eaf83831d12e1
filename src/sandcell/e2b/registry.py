"""The E2B sandboxes of the service: which tenant's session each id is, its access token, its
deadline, its code contexts; and the reaper that ends (or, with ``autoPause``, pauses) a sandbox
when its timeout passes.

A sandbox's id is its session's id, so a run record's ``session_id`` names the E2B sandbox it
ran in. Its access token (sent back as ``envdAccessToken`` and ``trafficAccessToken``, which the
SDKs then send on every envd and interpreter call) is what authorises those calls: they carry
no API key. The session itself is made with a day's idle time and lifetime (E2B's longest
sandbox); the E2B timeout, which ``set_timeout`` moves, is enforced here. A paused sandbox is
not here: it is its session's paused state under the home, with the sandbox's labels
(:mod:`sandcell.e2b.labels`), until a connect resumes it (:mod:`sandcell.e2b.pausing`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hmac
import itertools
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from sandcell.backends.cell.state import PauseMode
from sandcell.e2b.errors import E2BError
from sandcell.e2b.labels import AutoPause, SandboxLabels
from sandcell.e2b.node_kernels import NodeKernels, ender
from sandcell.errors import SandcellError
from sandcell.service.core import LiveSession, Service
from sandcell.service.saved_sessions import check_room
from sandcell.sessions import Session
from sandcell.sessions.states import StoredState

__all__ = ["MAX_TIMEOUT_S", "Context", "E2BSandbox", "SandboxRegistry"]

log = logging.getLogger("sandcell.e2b")
MAX_TIMEOUT_S = 86_400
"""The longest a sandbox may live (E2B's own limit), and the session's idle time and lifetime."""
_REAP_POLL_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """A code context of the interpreter: a scope of the session's kernel named by its id
    (:class:`~sandcell.backends.cell.CellScope`: variables of its own, the process
    shared), whose cells run in its working directory."""

    id: str
    language: str
    cwd: str
    """Its working directory as E2B names it (under ``/home/user``)."""
    path: str
    """The same directory inside the sandbox (under the workspace's own path)."""

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


@dataclass(slots=True, kw_only=True, eq=False)
class E2BSandbox:
    """One E2B sandbox: a live session of a tenant."""

    id: str
    tenant: str
    """The id of its tenant (:attr:`Tenant.id`, never its name)."""
    template: str
    live: LiveSession
    token: str
    workspace: str
    """The workspace's path inside the sandbox (``/home/user`` for E2B clients)."""
    metadata: dict[str, str]
    env: dict[str, str]
    started_at: dt.datetime
    deadline: float
    """Monotonic time at which the sandbox is ended (its E2B timeout)."""
    contexts: dict[str, Context] = field(default_factory=dict)
    pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    auto_pause: AutoPause = "off"
    """What its timeout does (``autoPause`` at create): ``off`` ends it, else it pauses."""
    ended: str | None = None
    """Why the sandbox ended, once the registry has ended it (a kill, its timeout): a call
    still running in it then reports the sandbox gone, not a failure of its own."""
    node: NodeKernels = field(default_factory=NodeKernels)
    """The Node sessions of its JavaScript and TypeScript contexts, ended with it."""

    @property
    def session(self) -> Session:
        return self.live.session

    @property
    def state(self) -> str:
        """E2B's state: a sandbox here is running (a paused one is a saved state)."""
        return "running"

    def end_at(self) -> dt.datetime:
        left = max(0.0, self.deadline - time.monotonic())
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=left)

    def set_timeout(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def labels(self) -> SandboxLabels:
        return SandboxLabels(
            template=self.template,
            metadata=self.metadata,
            env=self.env,
            token=self.token,
            key_sha256=self.live.key_sha256,
            started_at=self.started_at,
            workspace=self.workspace,
            auto_pause=self.auto_pause,
            contexts=tuple((c.id, c.language, c.cwd, c.path) for c in self.contexts.values()),
        )

    def remember(self) -> None:
        """Give the session what a state saved of it must keep of the sandbox: called when
        that changes (its start, its contexts) and before every save the API asks for."""
        self.session.labels = self.labels().to_labels()

    def restore_contexts(self, labels: SandboxLabels) -> None:
        for cid, language, cwd, path in labels.contexts:
            self.contexts[cid] = Context(id=cid, language=language, cwd=cwd, path=path)


def new_token() -> str:
    return secrets.token_hex(24)


class SandboxRegistry:
    """The live E2B sandboxes of every tenant. Thread-safe."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._lock = threading.Lock()
        self._boxes: dict[str, E2BSandbox] = {}
        self._wake = threading.Event()
        self._reaper: threading.Thread | None = None
        self._pausing: dict[str, threading.Event] = {}
        """Sandboxes being paused (their timeout, or a client): set once their state is saved
        or the pause failed."""

    def add(self, box: E2BSandbox) -> None:
        with self._lock:
            self._boxes[box.id] = box
            if self._reaper is None or not self._reaper.is_alive():
                self._reaper = threading.Thread(
                    target=self._reap, name="sandcell-e2b-reaper", daemon=True
                )
                self._reaper.start()
        self._wake.set()

    def owned(self, tenant: str, sandbox_id: str) -> E2BSandbox:
        """The tenant's running sandbox ``sandbox_id``, or 404: another tenant's is not found
        either."""
        box = self.find(tenant, sandbox_id)
        if box is None:
            raise E2BError(404, f"sandbox {sandbox_id!r} was not found")
        return box

    def find(self, tenant: str, sandbox_id: str) -> E2BSandbox | None:
        """The tenant's running sandbox ``sandbox_id``, or None."""
        box = self._alive(sandbox_id)
        return box if box is not None and box.tenant == tenant else None

    def reached(self, sandbox_id: str, token: str | None) -> E2BSandbox:
        """The sandbox an envd or interpreter call is for, if its token is the sandbox's."""
        box = self._alive(sandbox_id)
        if box is None:
            # What E2B's proxy answers for a sandbox that is gone: the SDKs read it as such.
            raise E2BError(502, f"The sandbox {sandbox_id} was not found")
        if token is None or not hmac.compare_digest(token.encode(), box.token.encode()):
            raise E2BError(401, "missing or wrong access token for this sandbox")
        return box

    def of_tenant(self, tenant: str) -> list[E2BSandbox]:
        with self._lock:
            boxes = [b for b in self._boxes.values() if b.tenant == tenant]
        return [b for b in boxes if self._alive(b.id) is not None]

    def live(self) -> list[E2BSandbox]:
        """Every tenant's sandboxes that are still alive (for a signed URL, which names none)."""
        with self._lock:
            ids = list(self._boxes)
        return [b for b in (self._alive(i) for i in ids) if b is not None]

    def set_timeout(self, box: E2BSandbox, seconds: float) -> None:
        """End ``box`` ``seconds`` from now: a shorter timeout takes effect when it passes,
        not at the reaper's next poll."""
        box.set_timeout(seconds)
        self._wake.set()

    def pausing(self, sandbox_id: str) -> bool:
        with self._lock:
            return sandbox_id in self._pausing

    def wait_paused(self, sandbox_id: str, timeout_s: float = 600.0) -> None:
        """Block until a pause of ``sandbox_id`` under way (its timeout's) is over, so that a
        connect right after the timeout resumes it instead of finding nothing."""
        with self._lock:
            pausing = self._pausing.get(sandbox_id)
        if pausing is not None:
            pausing.wait(timeout_s)

    def pause(self, box: E2BSandbox, mode: PauseMode, *, by: str) -> StoredState:
        """Pause ``box``'s session (blocking: the save) and forget the sandbox; its state, with
        the sandbox's labels, is what a connect resumes. A mode the rung refuses (or any other
        refusal that leaves the session alive) keeps the sandbox running, as it was."""
        with self._lock:
            if self._boxes.get(box.id) is not box or box.id in self._pausing:
                raise E2BError(404, f"sandbox {box.id!r} was not found")
            done = self._pausing[box.id] = threading.Event()
        return self._pause(box, mode, by=by, done=done)

    def _pause(
        self, box: E2BSandbox, mode: PauseMode, *, by: str, done: threading.Event
    ) -> StoredState:
        with self._lock:
            self._boxes.pop(box.id, None)
        try:
            tenant = self._service.tenants.by_id(box.tenant)
            if tenant is not None:
                # Over max_stored_bytes the pause is refused before its sandbox ends.
                check_room(self._service, tenant, box.session, mode)
            box.remember()
            state = box.session.pause(mode=mode, by=by)
        except BaseException:
            if box.session.ended is None:
                with self._lock:
                    self._boxes[box.id] = box
            else:
                box.ended = box.session.ended
                self._end_node(box, box.ended or "ended")
                self._service.end_session(box.live)
            raise
        finally:
            with self._lock:
                self._pausing.pop(box.id, None)
            done.set()
        box.ended = "paused"
        # A Node kernel's memory is not saved: the sandbox's JavaScript contexts come back
        # with it, empty, each opening a fresh kernel at its next cell.
        self._end_node(box, "paused")
        self._service.end_session(box.live)
        log.info("e2b sandbox %s of tenant %s paused (%s)", box.id, box.tenant, mode.value)
        return state

    def pause_for_stop(self) -> None:
        """The service is stopping: pause every sandbox whose timeout pauses it (its
        ``autoPause``), at once, so it outlives the service as it would its timeout; the others
        end with the service (their Node kernels here). Blocking; a sandbox that cannot pause
        ends."""
        with self._lock:
            boxes = [b for b in self._boxes.values() if b.auto_pause != "off"]
        threads = [
            threading.Thread(
                target=self._pause_quietly,
                args=(box, "e2b: the service stopped (autoPause)"),
                name="sandcell-e2b-stop",
            )
            for box in boxes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # The others' sessions end with the service's; their Node kernels are not among them.
        with self._lock:
            others = list(self._boxes.values())
        for box in others:
            self._end_node(box, "the service stopped")

    def _pause_quietly(self, box: E2BSandbox, why: str) -> None:
        try:
            self.pause(box, box.labels().auto_pause_mode(box.session.pause_modes), by=why)
        except Exception as exc:
            log.warning("e2b sandbox %s did not pause (%s): it ends", box.id, exc)

    def kill(self, box: E2BSandbox, why: str = "closed") -> None:
        """End the sandbox's session (blocking: its teardown) and forget it."""
        with self._lock:
            self._boxes.pop(box.id, None)
            box.ended = why
        # A cell still running holds the session: stop it, so the kill does not wait for it.
        box.session.cancel(f"the sandbox ended: {why}")
        try:
            box.session.close()
        finally:
            self._end_node(box, why)
            self._service.end_session(box.live)
        log.info("e2b sandbox %s of tenant %s ended: %s", box.id, box.tenant, why)

    def _end_node(self, box: E2BSandbox, why: str) -> None:
        box.node.end_all(why, ender(self._service, box.tenant, f"the sandbox ended: {why}"))

    def _alive(self, sandbox_id: str) -> E2BSandbox | None:
        with self._lock:
            box = self._boxes.get(sandbox_id)
        if box is None:
            return None
        if box.session.ended is not None:
            self._forget(box, box.session.ended)
            return None
        if box.deadline <= time.monotonic():
            # Timed out before the reaper came by.
            self._expire(box)
            return None
        if not self._service.key_current(box.live):
            # Its token came with a key since rotated (or a tenant since removed): it ends.
            self._forget(box, "its tenant's key was rotated or the tenant removed")
            return None
        return box

    def _expire(self, box: E2BSandbox) -> None:
        """Its timeout passed: it ends, or, with ``autoPause``, it pauses (on a thread of its
        own: a save takes seconds, and the reaper keeps the other sandboxes' timeouts)."""
        if box.auto_pause == "off":
            self._forget(box, "its timeout passed")
            return
        with self._lock:
            if box.id in self._pausing or self._boxes.get(box.id) is not box:
                return
            # Marked under the lock: a connect meanwhile waits for the pause to be over.
            done = self._pausing[box.id] = threading.Event()
        threading.Thread(
            target=self._pause_on_timeout, args=(box, done), name="sandcell-e2b-pause", daemon=True
        ).start()

    def _pause_on_timeout(self, box: E2BSandbox, done: threading.Event) -> None:
        try:
            mode = box.labels().auto_pause_mode(box.session.pause_modes)
            self._pause(box, mode, by="e2b: its timeout passed (autoPause)", done=done)
        except Exception as exc:
            # Whatever failed, a sandbox past its timeout does not live on.
            log.warning("e2b sandbox %s did not pause at its timeout (%s): it ends", box.id, exc)
            with self._lock:
                present = self._boxes.get(box.id) is box
            if present:
                self._forget(box, f"its timeout passed and it could not pause ({exc})")

    def _forget(self, box: E2BSandbox, why: str) -> None:
        with self._lock:
            if self._boxes.pop(box.id, None) is None:
                return
            box.ended = why
        threading.Thread(
            target=self._end_quietly, args=(box, why), name="sandcell-e2b-end", daemon=True
        ).start()

    def _end_quietly(self, box: E2BSandbox, why: str) -> None:
        with contextlib.suppress(Exception):
            box.session.cancel(f"the sandbox ended: {why}")
            box.session.close()
        self._end_node(box, why)
        self._service.end_session(box.live)
        log.info("e2b sandbox %s of tenant %s ended: %s", box.id, box.tenant, why)

    def _reap(self) -> None:
        while True:
            with self._lock:
                boxes = list(self._boxes.values())
                if not boxes:
                    self._reaper = None
                    return
            now = time.monotonic()
            try:
                keys: dict[str, str] | None = self._service.tenants.keys_now()
            except SandcellError:  # the store closing with the service: the timeouts still hold
                keys = None
            for box in boxes:
                if box.session.ended is not None:
                    self._forget(box, box.session.ended)
                elif box.deadline <= now:
                    self._expire(box)
                elif keys is not None and keys.get(box.tenant) != box.live.key_sha256:
                    self._forget(box, "its tenant's key was rotated or the tenant removed")
            with self._lock:
                later = [b.deadline for b in self._boxes.values()]
            wait = min([_REAP_POLL_S, *(d - time.monotonic() for d in later)])
            self._wake.wait(timeout=max(wait, 0.05))
            self._wake.clear()
