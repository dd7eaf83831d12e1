"""A pool of whole sandboxes started ahead, each used by one run and then destroyed.

The wasm rung's pool (Pyodide loaded and locked down, ``wasm/pool.py``) and the namespaces
rung's Node pool (Node started and waiting for its program, ``namespaces/node_pool.py``) are
both this: a filler thread keeps ``WarmConfig.pool_size`` sandboxes started, a run takes one
(:meth:`SandboxPool.take`), uses it once, and hands it back to be destroyed off the result path
(:meth:`SandboxPool.destroy`) while the filler starts its replacement. How a sandbox starts and
how a run uses it are the owner's.

A sandbox is made for one shape of run (:class:`Shape`): its limits (the cgroup, the
workspace's size), environment, packages and isolation mode are fixed when it starts. The pool
keeps the shape of the last run it served; a run of another shape starts cold and the pool
fills for that shape from then on (without ``WarmConfig.refill`` the pool is filled once and
keeps its shape). Within a shape, the next sandboxes are started for the last run's request:
what the shape leaves out may still prepare them for it (the Node pool's language). A pool
made without a first shape (``first=None``) starts nothing until a run
asks for one: a pool for a language few runs use costs nothing until one does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from sandcell.backends.warm import SandboxPoolStats, WarmConfig, idle_memory
from sandcell.spec import RunRequest

__all__ = ["PooledSandbox", "SandboxPool", "Shape"]

FILL_RETRY_S = 1.0
"""The pause after a failed start before the filler tries again."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What a pooled sandbox is made for (see module)."""

    limits: tuple[object, ...]
    env: tuple[tuple[str, str], ...]
    packages: tuple[str, ...]
    mode: str
    landlock: bool | None
    runtime: str | None
    display: bool

    @classmethod
    def of(cls, request: RunRequest) -> Shape:
        lim = request.effective_limits
        return cls(
            limits=(
                lim.memory_bytes,
                lim.max_pids,
                lim.workspace_bytes,
                lim.tmp_bytes,
                lim.stdout_bytes,
                lim.stderr_bytes,
                lim.cpu_time_s,
                lim.max_open_files,
                lim.max_file_bytes,
            ),
            env=tuple(sorted(request.env.items())),
            packages=tuple(str(p) for p in request.packages),
            mode=request.mode.value,
            landlock=request.landlock,
            runtime=request.runtime,
            display=request.display,
        )


def _blank(request: RunRequest) -> RunRequest:
    """The request a pooled sandbox is started for: ``request`` without its program."""
    return replace(request, code="", stdin=b"", exports=())


class PooledSandbox(Protocol):
    """What the pool needs of a sandbox it keeps."""

    sandbox_pid: int | None
    kernel_pid: int | None

    def alive(self) -> bool: ...

    def teardown(self) -> object: ...


S = TypeVar("S", bound=PooledSandbox)


class SandboxPool(Generic[S]):
    """Keeps ``warm.pool_size`` sandboxes of one shape ready (see module).

    ``start`` makes and starts one sandbox for a request of the pool's shape (its code empty);
    ``name`` names the threads; ``template_id`` is what runs and stats record.
    """

    def __init__(
        self,
        warm: WarmConfig,
        *,
        start: Callable[[RunRequest], S],
        name: str,
        template_id: str,
        first: RunRequest | None = RunRequest(code=""),  # noqa: B008 - frozen, shared safely
        runtime: str | None = None,
    ) -> None:
        self.warm = warm
        self.template_id = template_id
        self._start_one = start
        self._name = name
        self._runtime = runtime
        self._cond = threading.Condition()
        self._ready: deque[tuple[Shape, S]] = deque()
        self._shape_request: RunRequest | None = first
        self._closed = False
        self._starting = 0
        self.started = self.taken = self.discarded = self.refill_errors = 0
        self.last_error: str | None = None
        self._teardowns: list[threading.Thread] = []
        """Sandboxes being destroyed off the result path; :meth:`close` waits for them."""
        self._filler = threading.Thread(target=self._fill, name=f"sandcell-{name}", daemon=True)
        self._filler.start()

    # -- the filler ----------------------------------------------------------------------------

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                    self._shape_request is None
                    or len(self._ready) + self._starting >= self.warm.pool_size
                ):
                    self._cond.wait()
                # Without refill (a process that runs one program), the first fill is the last.
                if self._closed or (not self.warm.refill and self.started >= self.warm.pool_size):
                    return
                request = self._shape_request
                assert request is not None
                self._starting += 1
            sandbox = None
            try:
                sandbox = self._start_one(request)
            except Exception as exc:  # a failed start is reported, then retried after a pause
                with self._cond:
                    self.refill_errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
            with self._cond:
                self._starting -= 1
                if sandbox is not None:
                    if self._closed or Shape.of(request) != self._shape():
                        self.destroy(sandbox)
                        self.discarded += 1
                    else:
                        self._ready.append((Shape.of(request), sandbox))
                        self.started += 1
                        self.last_error = None
                self._cond.notify_all()
            if sandbox is None:
                time.sleep(FILL_RETRY_S)

    def destroy(self, sandbox: S) -> None:
        """Tear ``sandbox`` down on a thread of its own (:meth:`close` waits for it)."""
        thread = threading.Thread(target=sandbox.teardown, name=f"sandcell-{self._name}-teardown")
        thread.start()
        with self._cond:
            self._teardowns = [t for t in self._teardowns if t.is_alive()]
            self._teardowns.append(thread)

    def _shape(self) -> Shape | None:
        return None if self._shape_request is None else Shape.of(self._shape_request)

    # -- a run ---------------------------------------------------------------------------------

    def take(self, request: RunRequest) -> tuple[S | None, float, str]:
        """A ready sandbox of ``request``'s shape and the milliseconds waited for it, or None
        and why none (the run then starts cold; the pool now fills for its shape)."""
        shape = Shape.of(request)
        t0 = time.monotonic()
        deadline = t0 + self.warm.take_timeout_s
        with self._cond:
            if shape != self._shape():
                if not self.warm.refill:
                    return None, 0.0, "the pool was filled once for runs of another shape"
                # The pool follows the runs: drop what waits for another shape, fill for this one.
                first = self._shape_request is None
                self._shape_request = _blank(request)
                stale = list(self._ready)
                self._ready.clear()
                self.discarded += len(stale)
                self._cond.notify_all()
                for _, sb in stale:
                    self.destroy(sb)
                if first:
                    return None, 0.0, "the pool starts with the first run that needs it"
                return None, 0.0, "no pooled sandbox of this run's shape was ready"
            # The next sandboxes are made for this request (what its shape leaves out, such as
            # its language, may still let a sandbox prepare better for the runs to come).
            self._shape_request = _blank(request)
            while not self._closed:
                while self._ready:
                    got_shape, sb = self._ready.popleft()
                    self._cond.notify_all()
                    if got_shape == shape and sb.alive():
                        self.taken += 1
                        return sb, (time.monotonic() - t0) * 1000, ""
                    self.discarded += 1
                    self.destroy(sb)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None, 0.0, f"no pooled sandbox within {self.warm.take_timeout_s:g} s"
                if self._starting == 0 and self.last_error is not None:
                    return None, 0.0, f"the pool cannot start sandboxes: {self.last_error}"
                self._cond.wait(remaining)
        return None, 0.0, "the pool is closed"

    # -- report and end ------------------------------------------------------------------------

    def stats(self) -> SandboxPoolStats:
        """The pool now; ``size`` is 0 while a pool made without a first shape waits for one."""
        with self._cond:
            ready = [sb for _, sb in self._ready]
            pids = tuple(
                pid for sb in ready for pid in (sb.sandbox_pid, sb.kernel_pid) if pid is not None
            )
            pss, _ = idle_memory(pids)
            extra = {} if self._runtime is None else {"runtime": self._runtime}
            return SandboxPoolStats(
                mode="pool",
                template_id=self.template_id,
                preload=(),
                size=self.warm.pool_size if self._shape_request is not None else 0,
                ready=len(ready),
                started=self.started,
                taken=self.taken,
                discarded=self.discarded,
                refill_errors=self.refill_errors,
                last_error=self.last_error,
                idle_memory_bytes=pss,
                **extra,
            )

    def close(self) -> None:
        """Destroy what waits, stop the filler; returns once every sandbox is torn down."""
        with self._cond:
            self._closed = True
            stale = [sb for _, sb in self._ready]
            self._ready.clear()
            self._cond.notify_all()
        for sb in stale:
            sb.teardown()
        self._filler.join(timeout=60)
        with self._cond:
            pending = list(self._teardowns)
        for thread in pending:
            thread.join(timeout=60)
