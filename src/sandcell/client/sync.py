"""The blocking client: :class:`Client` and the sessions it opens."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2

from sandcell.client import ops
from sandcell.client.errors import ServiceError, ServiceUnavailable, error_for
from sandcell.client.process_methods import ProcessMethods
from sandcell.client.streams import EventReader
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

__all__ = ["Client", "RemoteSession", "timeouts"]

T = TypeVar("T")


def timeouts(timeout: float | None) -> httpx2.Timeout:
    """``timeout``: the longest wait for an answer (a synchronous run answers when it ends, so
    None, no limit, is the default); connecting is given 10 s."""
    return httpx2.Timeout(timeout, connect=10.0)


def _headers(endpoint: Endpoint) -> dict[str, str]:
    headers = {"User-Agent": "sandcell-client"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    return headers


def refusal(
    endpoint: Endpoint, call: ops.Call[T], status: int, body: bytes, headers: Mapping[str, str]
) -> T:
    """The value (or the error raised) for a non-2xx answer to ``call``."""
    error = error_for(status, body, headers, what=call.what, where=endpoint.describe())
    if isinstance(error, ServiceError) and call.refused is not None:
        return call.refused(error)
    raise error


def unreachable(endpoint: Endpoint, call: ops.Call[Any], exc: Exception) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"cannot reach the sandcell service at {endpoint.describe()} ({call.what}): "
        f"{type(exc).__name__}: {exc or 'the connection failed'}; is `sandcell serve` running?"
    )


class Client:
    """The executor's ``run`` and ``session`` over the HTTP service, with the same result
    types: ``Executor(home=...)`` and ``Client(url, api_key)`` are interchangeable for them.

    >>> with Client("http://127.0.0.1:8790", key) as sc:        # doctest: +SKIP
    ...     sc.run(RunRequest(code="print(6*7)")).stdout
    '42\\n'
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        socket: str | Path | None = None,
        timeout: float | None = None,
    ) -> None:
        """``url`` of the service (``http://127.0.0.1:8790``) or its local Unix ``socket``,
        and the tenant's ``api_key``; ``timeout``: see :func:`timeouts`."""
        if (url is None) == (socket is None):
            raise ConfigError("give the service's url or its socket (one of them)")
        self.endpoint = (
            Endpoint(url.rstrip("/"), api_key)
            if url is not None
            else Endpoint("http://localhost", api_key, Path(socket))  # type: ignore[arg-type]
        )
        self._http = self._open(self.endpoint, timeout)

    @classmethod
    def from_env(cls, *, home: Path | None = None, timeout: float | None = None) -> Client:
        """``$SANDCELL_URL`` and ``$SANDCELL_API_KEY``, else the local socket of the service
        in the sandcell home (``home`` or ``$SANDCELL_HOME``)."""
        found = endpoint_from_env(home=home)
        client = cls.__new__(cls)
        client.endpoint = found
        client._http = cls._open(found, timeout)
        return client

    @staticmethod
    def _open(endpoint: Endpoint, timeout: float | None) -> httpx2.Client:
        transport = (
            httpx2.HTTPTransport(uds=str(endpoint.socket)) if endpoint.socket is not None else None
        )
        return httpx2.Client(
            base_url=endpoint.base_url,
            headers=_headers(endpoint),
            timeout=timeouts(timeout),
            transport=transport,
        )

    # -- plumbing -----------------------------------------------------------------------------

    def _do(self, call: ops.Call[T]) -> T:
        try:
            response = self._http.request(
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

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- runs ----------------------------------------------------------------------------------

    def run(
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
        """:meth:`sandcell.Executor.run` on the service: the same outcomes as results
        (``denied``, ``awaiting_approval``...), the same errors for a request the profile
        cannot take. ``request`` may be the code alone (in ``language``). Leaving (a signal, a
        closed client) cancels the run on the service; it is recorded as killed.
        ``on_output(stream, text)`` is told the run's output while it runs, as in-process (the
        run is then started and followed through its event stream)."""
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
            return self._do(ops.run(body))
        run_id = self._do(ops.submit(body))
        try:
            return self.wait(run_id, on_output=on_output)
        except BaseException:
            # As a synchronous run's client that goes away: the run is stopped, and recorded.
            with contextlib.suppress(Exception):
                self.cancel(run_id)
            raise

    async def run_async(self, request: RunRequest | str, **kwargs: Any) -> RunResult:
        """:meth:`run` for asyncio (as :meth:`sandcell.Executor.run_async`): on a worker
        thread. :class:`~sandcell.client.AsyncClient` does it without threads."""
        import asyncio  # only asyncio callers pay for importing it

        return await asyncio.to_thread(self.run, request, **kwargs)

    def submit(
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
        """Start a run without waiting; its id, for :meth:`wait` and :meth:`cancel`."""
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
        return self._do(ops.submit(body))

    def wait(self, run_id: str, *, on_output: OutputListener | None = None) -> RunResult:
        """The result of a run :meth:`submit` started, once it has finished (followed as the
        service's event stream); ``on_output`` is told its output, from the start, as it
        comes."""
        call = ops.Call("GET", ops.events_path(run_id), lambda b: b)
        found = self._stream(call, status_result, on_output)
        if found is not None:
            return found
        raise ServiceUnavailable(
            f"the service ended the event stream of run {run_id} before its result; ask again "
            "with wait(run_id)"
        )

    def _stream(
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
            with self._http.stream(call.method, call.path, json=call.body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_for(
                        response.status_code,
                        response.content,
                        response.headers,
                        what=call.what,
                        where=self.endpoint.describe(),
                    )
                for line in response.iter_lines():
                    found = reader.feed(line)
                    if found is not None:
                        return found
        except httpx2.HTTPError as exc:
            raise unreachable(self.endpoint, call, exc) from None
        return None

    def cancel(self, run_id: str) -> bool:
        """Stop a run :meth:`submit` started; False when it has already finished. It ends
        ``killed`` (reason ``cancelled: ...``) and is recorded."""
        return self._do(ops.cancel(run_id))

    def replay(
        self,
        run_id: str,
        *,
        use_current_profile: bool = False,
        backend: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[RunResult, dict[str, Any]]:
        """Run a recorded run of this tenant again as recorded (``Executor.replay`` on the
        service): the replay's result, and the comparison as ``sandcell audit replay --json``
        prints it (``matched``, ``notes``, ``comparison``)."""
        body = {"use_current_profile": use_current_profile, "backend": backend, "env": env or {}}
        return self._do(ops.replay(run_id, body))

    # -- sessions ------------------------------------------------------------------------------

    def session(
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
    ) -> RemoteSession:
        """:meth:`sandcell.Executor.session` on the service: one sandbox kept across cells.
        ``snapshot`` starts it from that snapshot of the tenant's (StateNotFound without
        one); ``on_idle="pause"`` pauses it at its idle timeout instead of ending it;
        ``language`` is its cells' (``python``, ``javascript``, ``typescript``, or ``js``,
        ``ts``)."""
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
        return RemoteSession(self, self._do(call))

    def resume(self, session_id: str) -> RemoteSession:
        """Bring the paused session back, live, under its id (as
        :meth:`sandcell.Executor.resume`; also after the service restarted). Raises
        StateNotFound when the tenant has no such paused session, StateTampered when its
        saved files changed."""
        return RemoteSession(self, self._do(ops.resume(session_id)))

    def fork_paused(
        self, session_id: str, n: int = 1, *, mode: str = "memory"
    ) -> list[RemoteSession]:
        """``n`` live copies of a paused session, which stays paused."""
        opened = self._do(ops.fork(session_id, n, mode, paused=True))
        return [RemoteSession(self, s) for s in opened]

    def paused(self) -> list[SavedSession]:
        """The tenant's paused sessions, oldest first."""
        return self._do(ops.paused())

    def delete_paused(self, session_id: str) -> SavedSession:
        """Forget a paused session for good."""
        return self._do(ops.delete_paused(session_id))

    def snapshots(self) -> list[SavedSession]:
        """The tenant's snapshots, oldest first."""
        return self._do(ops.snapshots())

    def delete_snapshot(self, name: str) -> SavedSession:
        """Forget a snapshot; sessions started from it go on."""
        return self._do(ops.delete_snapshot(name))

    # -- records -------------------------------------------------------------------------------

    def artifact(self, sha256: str) -> bytes:
        """The bytes of an artifact (an export, a figure) by the SHA-256 a result names."""
        return self._do(ops.artifact(sha256))

    def approvals(self, status: str = "pending", *, limit: int = 50) -> list[Approval]:
        """The tenant's runs waiting for approval (``status``: ``approved``, ``denied``,
        ``ran`` or ``all`` for others), newest first."""
        return self._do(ops.approvals(status, limit))

    def approval(self, approval_id: str) -> Approval:
        return self._do(ops.approval(approval_id))

    def approve(self, approval_id: str, *, reason: str = "") -> RunResult:
        """Approve a waiting run; the service runs exactly the stored request and this is its
        result (as :meth:`sandcell.Executor.run_approved`)."""
        return self._do(ops.approve(approval_id, reason))

    def deny(self, approval_id: str, *, reason: str) -> RunResult:
        """Deny a waiting run; the denial is recorded (as
        :meth:`sandcell.Executor.deny_approval`)."""
        return self._do(ops.deny(approval_id, reason))

    def audit(self, run_id: str) -> AuditEntry:
        """A run's record and its place in the hash chain (as ``executor.audit.get``)."""
        return self._do(ops.audit(run_id))

    def profiles(self) -> list[dict[str, Any]]:
        """The tenant's profiles, its default first."""
        return self._do(ops.profiles())


class RemoteSession(ProcessMethods):
    """A session on the service, used like :class:`sandcell.sessions.Session` (its background
    processes, terminals and watches too: :class:`~sandcell.client.process_methods.
    ProcessMethods`)."""

    def __init__(self, client: Client, opened: Mapping[str, Any]) -> None:
        self._client = client
        self.id = str(opened["id"])
        self._ended: str | None = None

    @property
    def ended(self) -> str | None:
        """Why the session ended, as far as this object knows (closed here), or None."""
        return self._ended

    def info(self) -> SessionInfo:
        return session_info_from_dict(self._client._do(ops.session_info(self.id)))

    def run(
        self,
        code: str,
        *,
        timeout_s: float | None = None,
        exports: Sequence[str] = (),
        on_output: OutputListener | None = None,
    ) -> RunResult:
        """Run one cell; raises SessionEnded once the session has ended. ``on_output(stream,
        text)`` is told the cell's output while it runs (``POST .../cells/stream``)."""
        call = ops.cell(self.id, code, timeout_s, tuple(exports), stream=on_output is not None)
        if on_output is None:
            return self._client._do(call)
        try:
            found = self._client._stream(call, result_from_dict, on_output)
        except ServiceError as error:
            assert call.refused is not None
            return call.refused(error)  # SessionEnded, as a cell without streaming raises
        if found is None:
            raise ServiceUnavailable(
                f"the service ended the stream of a cell of session {self.id} before its "
                "result; the cell is recorded (sandcell audit list)"
            )
        return found

    def cancel(self) -> bool:
        """Stop the cell now running (from another thread than the one waiting in
        :meth:`run`): it is interrupted, the session and its state are kept, and :meth:`run`
        returns its result, ``killed`` with a reason starting "cancelled". False when no cell
        is running, as :meth:`sandcell.sessions.Session.cancel`."""
        return self._client._do(ops.cell_cancel(self.id))

    def files(self) -> list[str]:
        """Paths of the regular files in the session's workspace, sorted."""
        return self._client._do(ops.session_files(self.id))

    def read_file(self, path: str) -> bytes:
        """A workspace file's bytes (exported by a cell: the profile's export checks apply)."""
        return self._client._do(ops.read_file(self.id, path))

    def write_file(self, path: str, data: bytes) -> RunResult:
        """Write ``data`` to a workspace file (by a cell, recorded; its result)."""
        return self._client._do(ops.write_file(self.id, path, data))

    def pause(self, *, mode: str = "memory") -> SavedSession:
        """Pause the session (as :meth:`sandcell.sessions.Session.pause`): its state is saved
        on the service and its sandbox ends; :meth:`Client.resume` brings it back. Raises
        PauseRefused for a mode its rung does not offer (the session goes on)."""
        saved = self._client._do(ops.pause(self.id, mode))
        self._ended = "paused"
        return saved

    def snapshot(
        self, name: str, *, mode: str = "memory", ttl_s: float | None = None
    ) -> SavedSession:
        """Keep a named copy of the session's state; the session goes on.
        ``client.session(snapshot=name)`` starts sessions from it."""
        return self._client._do(ops.snapshot(self.id, name, mode, ttl_s))

    def fork(self, n: int = 1, *, mode: str = "memory") -> list[RemoteSession]:
        """``n`` live copies of the session as it is now, each its own; this one goes on."""
        opened = self._client._do(ops.fork(self.id, n, mode, paused=False))
        return [RemoteSession(self._client, s) for s in opened]

    def metrics(self, since: str | None = None) -> list[SandboxMetrics]:
        """The session's resource samples at or after ``since`` (ISO 8601), oldest first."""
        return self._client._do(ops.metrics(self.id, since))

    def close(self, *, exports: Sequence[str] = ()) -> SessionEnd:
        """End the session, exporting the files matching ``exports`` first. Idempotent."""
        call = ops.session_close(self.id, tuple(exports))
        try:
            ended = session_end_from_dict(self._client._do(call))
        except ServiceError as exc:
            if exc.status != 404 or exports:
                raise
            from sandcell.sessions.session import SessionEnd

            ended = SessionEnd(artifacts=(), rejected_exports=(), reason=self._ended or "ended")
        self._ended = self._ended or ended.reason
        return ended

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
