"""The asyncio client: :class:`AsyncClient` and the sessions it opens (the same operations
as :class:`~sandcell.client.Client`, awaited, without threads)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2

from sandcell.client import ops
from sandcell.client.errors import ServiceError, ServiceUnavailable, error_for
from sandcell.client.process_methods import AsyncProcessMethods
from sandcell.client.streams import EventReader
from sandcell.client.sync import refusal, timeouts, unreachable
from sandcell.client.wire import (
    Approval,
    Endpoint,
    SavedSession,
    as_request,
    endpoint_from_env,
    run_body,
    session_body,
    session_end_from_dict,
    session_info_from_dict,
    status_result,
)
from sandcell.errors import ConfigError
from sandcell.spec import (
    InputFile,
    IsolationMode,
    Language,
    Limits,
    RunRequest,
    RunResult,
    result_from_dict,
)

if TYPE_CHECKING:
    from sandcell.audit import AuditEntry
    from sandcell.backends.cell.state import SandboxMetrics
    from sandcell.live_output import OutputListener
    from sandcell.sessions.session import SessionEnd, SessionInfo

__all__ = ["AsyncClient", "AsyncRemoteSession"]

T = TypeVar("T")


class AsyncClient:
    """:class:`~sandcell.client.Client` for asyncio: ``await client.run(...)`` (as
    :meth:`sandcell.Executor.run_async`), ``async with client.session() as s``."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        socket: str | Path | None = None,
        timeout: float | None = None,
    ) -> None:
        if (url is None) == (socket is None):
            raise ConfigError("give the service's url or its socket (one of them)")
        endpoint = (
            Endpoint(url.rstrip("/"), api_key)
            if url is not None
            else Endpoint("http://localhost", api_key, Path(socket))  # type: ignore[arg-type]
        )
        self._setup(endpoint, timeout)

    @classmethod
    def from_env(cls, *, home: Path | None = None, timeout: float | None = None) -> AsyncClient:
        """As :meth:`Client.from_env <sandcell.client.Client.from_env>`."""
        client = cls.__new__(cls)
        client._setup(endpoint_from_env(home=home), timeout)
        return client

    def _setup(self, endpoint: Endpoint, timeout: float | None) -> None:
        self.endpoint = endpoint
        transport = (
            httpx2.AsyncHTTPTransport(uds=str(endpoint.socket))
            if endpoint.socket is not None
            else None
        )
        headers = {"User-Agent": "sandcell-client"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self._http = httpx2.AsyncClient(
            base_url=endpoint.base_url,
            headers=headers,
            timeout=timeouts(timeout),
            transport=transport,
        )

    async def _do(self, call: ops.Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                json=call.body,
                content=call.content,
                params=dict(call.params) or None,
            )
        except httpx2.HTTPError as exc:
            raise unreachable(self.endpoint, call, exc) from None
        if response.status_code >= 400:
            return refusal(
                self.endpoint, call, response.status_code, response.content, response.headers
            )
        return call.read(response.content)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- runs ----------------------------------------------------------------------------------

    async def run(
        self,
        request: RunRequest | str,
        *,
        language: Language | str = "python",
        profile: str | None = None,
        backend: str | None = None,
        schema: Mapping[str, object] | None = None,
        model: object = None,
        invariants: Sequence[object] = (),
        result_file: str | None = None,
        approve: object = None,
        on_output: OutputListener | None = None,
    ) -> RunResult:
        """As :meth:`Client.run <sandcell.client.Client.run>`; cancelling the task cancels
        the run on the service. ``on_output`` is called on the event loop (return quickly)."""
        body = run_body(
            as_request(request, language),
            profile=profile,
            backend=backend,
            schema=schema,
            model=model,
            invariants=invariants,
            result_file=result_file,
            approve=approve,
            wait=on_output is None,
        )
        if on_output is None:
            return await self._do(ops.run(body))
        run_id = await self._do(ops.submit(body))
        try:
            return await self.wait(run_id, on_output=on_output)
        except BaseException:
            # As a synchronous run's client that goes away: the run is stopped, and recorded.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.cancel(run_id))
            raise

    async def run_async(self, request: RunRequest | str, **kwargs: Any) -> RunResult:
        """The same as :meth:`run`: the name :meth:`sandcell.Executor.run_async` has."""
        return await self.run(request, **kwargs)

    async def submit(
        self,
        request: RunRequest | str,
        *,
        language: Language | str = "python",
        profile: str | None = None,
        backend: str | None = None,
        schema: Mapping[str, object] | None = None,
        invariants: Sequence[object] = (),
        result_file: str | None = None,
    ) -> str:
        body = run_body(
            as_request(request, language),
            profile=profile,
            backend=backend,
            schema=schema,
            model=None,
            invariants=invariants,
            result_file=result_file,
            approve=None,
            wait=False,
        )
        return await self._do(ops.submit(body))

    async def wait(self, run_id: str, *, on_output: OutputListener | None = None) -> RunResult:
        call = ops.Call("GET", ops.events_path(run_id), lambda b: b)
        found = await self._stream(call, status_result, on_output)
        if found is not None:
            return found
        raise ServiceUnavailable(
            f"the service ended the event stream of run {run_id} before its result; ask again "
            "with wait(run_id)"
        )

    async def _stream(
        self,
        call: ops.Call[Any],
        read_result: Callable[[Mapping[str, Any]], RunResult],
        on_output: OutputListener | None,
    ) -> RunResult | None:
        """Follow the event stream ``call`` answers with; its result (None: it ended first)."""
        reader = EventReader(
            read_result, on_output=on_output, what=call.what, where=self.endpoint.describe()
        )
        try:
            async with self._http.stream(call.method, call.path, json=call.body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_for(
                        response.status_code,
                        response.content,
                        response.headers,
                        what=call.what,
                        where=self.endpoint.describe(),
                    )
                async for line in response.aiter_lines():
                    found = reader.feed(line)
                    if found is not None:
                        return found
        except httpx2.HTTPError as exc:
            raise unreachable(self.endpoint, call, exc) from None
        return None

    async def cancel(self, run_id: str) -> bool:
        return await self._do(ops.cancel(run_id))

    async def replay(
        self,
        run_id: str,
        *,
        use_current_profile: bool = False,
        backend: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[RunResult, dict[str, Any]]:
        body = {"use_current_profile": use_current_profile, "backend": backend, "env": env or {}}
        return await self._do(ops.replay(run_id, body))

    # -- sessions ------------------------------------------------------------------------------

    async def session(
        self,
        *,
        profile: str | None = None,
        limits: Limits | None = None,
        inputs: Sequence[InputFile] = (),
        mode: IsolationMode = IsolationMode.STRICT,
        landlock: bool | None = None,
        idle_timeout_s: float | None = None,
        max_lifetime_s: float | None = None,
        on_idle: str = "end",
        paused_ttl_s: float | None = None,
        snapshot: str | None = None,
        language: str = "python",
    ) -> AsyncRemoteSession:
        """Open a session: ``async with await client.session() as s`` (``snapshot``,
        ``on_idle``: as :meth:`Client.session <sandcell.client.Client.session>`)."""
        body = session_body(
            profile=profile,
            limits=limits,
            inputs=inputs,
            mode=mode,
            landlock=landlock,
            idle_timeout_s=idle_timeout_s,
            max_lifetime_s=max_lifetime_s,
            on_idle=on_idle,
            paused_ttl_s=paused_ttl_s,
            snapshot=snapshot,
            language=language,
        )
        call = ops.session_from_snapshot(body) if snapshot else ops.session_open(body)
        return AsyncRemoteSession(self, await self._do(call))

    async def resume(self, session_id: str) -> AsyncRemoteSession:
        """Bring the paused session back, live, under its id (see
        :meth:`Client.resume <sandcell.client.Client.resume>`)."""
        return AsyncRemoteSession(self, await self._do(ops.resume(session_id)))

    async def fork_paused(
        self, session_id: str, n: int = 1, *, mode: str = "memory"
    ) -> list[AsyncRemoteSession]:
        opened = await self._do(ops.fork(session_id, n, mode, paused=True))
        return [AsyncRemoteSession(self, s) for s in opened]

    async def paused(self) -> list[SavedSession]:
        return await self._do(ops.paused())

    async def delete_paused(self, session_id: str) -> SavedSession:
        return await self._do(ops.delete_paused(session_id))

    async def snapshots(self) -> list[SavedSession]:
        return await self._do(ops.snapshots())

    async def delete_snapshot(self, name: str) -> SavedSession:
        return await self._do(ops.delete_snapshot(name))

    # -- records -------------------------------------------------------------------------------

    async def artifact(self, sha256: str) -> bytes:
        return await self._do(ops.artifact(sha256))

    async def approvals(self, status: str = "pending", *, limit: int = 50) -> list[Approval]:
        return await self._do(ops.approvals(status, limit))

    async def approval(self, approval_id: str) -> Approval:
        return await self._do(ops.approval(approval_id))

    async def approve(self, approval_id: str, *, reason: str = "") -> RunResult:
        return await self._do(ops.approve(approval_id, reason))

    async def deny(self, approval_id: str, *, reason: str) -> RunResult:
        return await self._do(ops.deny(approval_id, reason))

    async def audit(self, run_id: str) -> AuditEntry:
        return await self._do(ops.audit(run_id))

    async def profiles(self) -> list[dict[str, Any]]:
        return await self._do(ops.profiles())


class AsyncRemoteSession(AsyncProcessMethods):
    """A session on the service for asyncio callers; its methods are awaited (its processes'
    too: :class:`~sandcell.client.process_methods.AsyncProcessMethods`)."""

    def __init__(self, client: AsyncClient, opened: Mapping[str, Any]) -> None:
        self._client = client
        self.id = str(opened["id"])
        self._ended: str | None = None

    @property
    def ended(self) -> str | None:
        return self._ended

    async def info(self) -> SessionInfo:
        return session_info_from_dict(await self._client._do(ops.session_info(self.id)))

    async def run(
        self,
        code: str,
        *,
        timeout_s: float | None = None,
        exports: Sequence[str] = (),
        on_output: OutputListener | None = None,
    ) -> RunResult:
        """As :meth:`sandcell.client.sync.RemoteSession.run`; ``on_output`` is called on the
        event loop."""
        call = ops.cell(self.id, code, timeout_s, tuple(exports), stream=on_output is not None)
        if on_output is None:
            return await self._client._do(call)
        try:
            found = await self._client._stream(call, result_from_dict, on_output)
        except ServiceError as error:
            assert call.refused is not None
            return call.refused(error)  # SessionEnded, as a cell without streaming raises
        if found is None:
            raise ServiceUnavailable(
                f"the service ended the stream of a cell of session {self.id} before its "
                "result; the cell is recorded (sandcell audit list)"
            )
        return found

    async def cancel(self) -> bool:
        """Stop the cell now running (awaited in another task); see
        :meth:`sandcell.client.sync.RemoteSession.cancel`. Cancelling the task awaiting
        :meth:`run` closes its request, which cancels the cell too."""
        return await self._client._do(ops.cell_cancel(self.id))

    async def files(self) -> list[str]:
        return await self._client._do(ops.session_files(self.id))

    async def read_file(self, path: str) -> bytes:
        return await self._client._do(ops.read_file(self.id, path))

    async def write_file(self, path: str, data: bytes) -> RunResult:
        return await self._client._do(ops.write_file(self.id, path, data))

    async def pause(self, *, mode: str = "memory") -> SavedSession:
        """Pause the session (see :meth:`RemoteSession.pause
        <sandcell.client.RemoteSession.pause>`)."""
        saved = await self._client._do(ops.pause(self.id, mode))
        self._ended = "paused"
        return saved

    async def snapshot(
        self, name: str, *, mode: str = "memory", ttl_s: float | None = None
    ) -> SavedSession:
        return await self._client._do(ops.snapshot(self.id, name, mode, ttl_s))

    async def fork(self, n: int = 1, *, mode: str = "memory") -> list[AsyncRemoteSession]:
        opened = await self._client._do(ops.fork(self.id, n, mode, paused=False))
        return [AsyncRemoteSession(self._client, s) for s in opened]

    async def metrics(self, since: str | None = None) -> list[SandboxMetrics]:
        return await self._client._do(ops.metrics(self.id, since))

    async def close(self, *, exports: Sequence[str] = ()) -> SessionEnd:
        call = ops.session_close(self.id, tuple(exports))
        try:
            ended = session_end_from_dict(await self._client._do(call))
        except ServiceError as exc:
            if exc.status != 404 or exports:
                raise
            from sandcell.sessions.session import SessionEnd

            ended = SessionEnd(artifacts=(), rejected_exports=(), reason=self._ended or "ended")
        self._ended = self._ended or ended.reason
        return ended

    async def __aenter__(self) -> AsyncRemoteSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
