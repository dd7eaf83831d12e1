"""The egress proxy of one run: a Unix socket on the host, served by its own event loop.

Usage::

    with EgressProxy(profile=p.name, allowlist=p.network.allowlist, socket_path=path) as proxy:
        ...                       # the sandbox reaches ``path`` (bridged to a loopback port)
    report = proxy.report         # every attempt, for the run record

Why asyncio on a thread of its own: the caps (connections at once, bytes, idle time) are plain
counters and deadlines when every connection lives on one loop, a hostile program opening
hundreds of connections costs coroutines rather than threads, and the loop is independent of
whether the caller is synchronous or itself async. Nothing outside the standard library.

The socket file is created with ``socket_mode`` (owner only by default) inside a directory the
caller owns; the proxy refuses to replace an existing file. Everything the program could reach
is decided by the allowlist: the socket itself grants nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from sandcell.errors import ConfigError, InfraError
from sandcell.network.addresses import Resolver, system_resolver
from sandcell.network.allowlist import Allowlist
from sandcell.network.caps import Budget, ProxyLimits
from sandcell.network.handler import Attempt, refuse, serve
from sandcell.network.records import ConnectionRecord, ProxyReport
from sandcell.network.relay import Flow, abort
from sandcell.network.targets import Gate

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 30.0


class EgressProxy:
    """One run's proxy: :meth:`start`, let the run use it, :meth:`stop` for the report."""

    def __init__(
        self,
        *,
        profile: str,
        allowlist: Allowlist,
        socket_path: Path,
        limits: ProxyLimits | None = None,
        resolver: Resolver = system_resolver,
        socket_mode: int = 0o600,
    ) -> None:
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"proxy socket path {str(socket_path)!r} is longer than {MAX_SOCKET_PATH} "
                "bytes; use a shorter directory"
            )
        self.profile = profile
        self.socket_path = socket_path
        self.limits = limits or ProxyLimits()
        self._allowlist = allowlist
        self._resolver = resolver
        self._mode = socket_mode
        self._budget = Budget(self.limits)
        self._records: list[ConnectionRecord] = []
        self._refused_kept = 0
        self._refused_dropped = 0
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._report: ProxyReport | None = None

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def records(self) -> tuple[ConnectionRecord, ...]:
        """The attempts recorded so far (a session takes each cell's share while it runs)."""
        return tuple(self._records)

    @property
    def refused_dropped(self) -> int:
        """Refused attempts so far that were past the cap on refused records."""
        return self._refused_dropped

    @property
    def report(self) -> ProxyReport:
        """The report of a stopped proxy.

        Raises:
            InfraError: if the proxy has not been stopped.
        """
        if self._report is None:
            raise InfraError("the egress proxy's report is ready only once it has stopped")
        return self._report

    def start(self) -> None:
        """Listen on the socket path; returns once connections are accepted.

        Raises:
            ConfigError: if the path exists already or its directory does not.
            InfraError: if the proxy could not start.
        """
        if self._thread is not None:
            raise InfraError("the egress proxy was started already; use one proxy per run")
        if self.socket_path.exists() or self.socket_path.is_symlink():
            raise ConfigError(
                f"proxy socket path {str(self.socket_path)!r} exists; give each run a new path"
            )
        if not self.socket_path.parent.is_dir():
            raise ConfigError(
                f"the directory of proxy socket {str(self.socket_path)!r} does not exist"
            )
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(os.fsencode(self.socket_path))
            os.chmod(self.socket_path, self._mode)
            listener.listen(128)
        except OSError as exc:
            listener.close()
            raise InfraError(
                f"the egress proxy cannot listen on {self.socket_path}: {exc}"
            ) from exc
        self._thread = threading.Thread(
            target=self._run, args=(listener,), name="sandcell-egress-proxy", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S) or self._failure is not None:
            self.stop()
            raise InfraError(f"the egress proxy did not start: {self._failure!r}")

    def stop(self) -> ProxyReport:
        """Close every connection, stop listening, remove the socket; return the report.

        Safe to call more than once (later calls return the same report).
        """
        if self._report is not None:
            return self._report
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended on its own
                loop.call_soon_threadsafe(_set_done, stopping)
        if thread is not None:
            thread.join(_STOP_TIMEOUT_S)
            if thread.is_alive():
                raise InfraError("the egress proxy did not stop within 30 s")
        with contextlib.suppress(FileNotFoundError):
            if self._thread is not None:
                self.socket_path.unlink()
        self._report = ProxyReport(
            profile=self.profile,
            records=tuple(self._records),
            refused_dropped=self._refused_dropped,
            bytes_up=self._budget.bytes_up,
            bytes_down=self._budget.bytes_down,
        )
        return self._report

    def _run(self, listener: socket.socket) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sandcell-egress-dns")
        try:
            loop.run_until_complete(self._serve(listener, executor))
        except BaseException as exc:  # reported to start(), which is waiting on _ready
            self._failure = exc
            self._ready.set()
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()

    async def _serve(self, listener: socket.socket, executor: ThreadPoolExecutor) -> None:
        gate = Gate(
            profile=self.profile,
            allowlist=self._allowlist,
            resolver=self._resolver,
            executor=executor,
            connect_timeout_s=self.limits.connect_timeout_s,
        )
        self._stopping = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connection(reader, writer, gate)

        server = await asyncio.start_unix_server(
            accept, sock=listener, limit=self.limits.max_head_bytes
        )
        self._ready.set()
        try:
            await self._stopping
        finally:
            server.close()
            # A connection accepted just now has a task that has not run yet: let each take
            # its first step (which registers it) so that it is cancelled and recorded too.
            for _ in range(3):
                await asyncio.sleep(0)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: Gate
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._seq += 1
        attempt = Attempt(
            seq=self._seq, flow=Flow(idle_s=self.limits.idle_timeout_s), started_at=time.time()
        )
        over = self._budget.admit()
        closed = False
        kept = False
        try:
            if over is not None:
                attempt.method = "UNREAD"
                await refuse(reader, writer, attempt, *over)
            else:
                try:
                    await serve(reader, writer, gate=gate, budget=self._budget, attempt=attempt)
                finally:
                    self._budget.release()
            # Kept before the program's end of the connection closes: a session cell that read
            # to the end has its connection in its own share of the record, however late this
            # loop gets to run on a loaded host (CI: the record landed after the cell's share).
            self._keep(attempt.finish())
            kept = True
            closed = await _flush_and_close(writer, self.limits.idle_timeout_s)
        except asyncio.CancelledError:
            attempt.reason = "the run ended"
        except Exception as exc:  # a defect must close this connection, never the proxy
            attempt.allowed, attempt.reason = False, f"proxy error: {exc!r}"
        finally:
            if not kept:
                self._keep(attempt.finish())
            self._tasks.discard(task)
            if not closed:  # at once: the run ended, or the program stopped reading
                abort(writer)

    def _keep(self, record: ConnectionRecord) -> None:
        """Record every attempt that reached the outside, refused ones up to their cap.

        An attempt the proxy connected for counts as reaching the outside even when it was
        refused afterwards (a tunnel's wrong SNI, a malformed body): the server saw a
        connection. Such attempts are admitted ones, so ``max_connections`` bounds them.
        """
        if record.allowed or record.address is not None:
            self._records.append(record)
        elif self._refused_kept < self.limits.max_refused_records:
            self._refused_kept += 1
            self._records.append(record)
        else:
            self._refused_dropped += 1


async def _flush_and_close(writer: asyncio.StreamWriter, grace_s: float) -> bool:
    """Close after what is buffered has been sent (``drain`` stops at the high-water mark, so
    aborting straight away could drop the end of a response), within ``grace_s``. Whether the
    transport is closed for good."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), grace_s)
    except (TimeoutError, ConnectionError, OSError):
        return False
    return True


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
