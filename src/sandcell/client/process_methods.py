"""A remote session's background processes, terminals and watches, with the names and types of
:class:`sandcell.sessions.processes.ProcessControl`: :class:`ProcessMethods` for
:class:`~sandcell.client.RemoteSession`, :class:`AsyncProcessMethods` (awaited) for
:class:`~sandcell.client.AsyncRemoteSession`. The plans are :mod:`sandcell.client.process_ops`.

>>> with Client(url, key) as c, c.session() as s:                    # doctest: +SKIP
...     p = s.spawn("for i in 1 2 3; do echo $i; sleep 0.2; done")
...     b"".join(o.stdout for o in s.follow(p.pid))
b'1\\n2\\n3\\n'
"""

from __future__ import annotations

import signal as signals
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import httpx2

from sandcell.client import process_ops
from sandcell.client.errors import ServiceUnavailable
from sandcell.client.ops import Call

if TYPE_CHECKING:
    from sandcell.client.aio import AsyncClient
    from sandcell.client.sync import Client
    from sandcell.sessions.processes import ProcessInfo, ProcessOutput, WatchEvent

__all__ = ["AsyncProcessMethods", "ProcessMethods"]

Signal = int | signals.Signals | str
"""A signal: its number, or its name (``TERM``, ``SIGKILL``)."""


def _sig(sig: Signal) -> int | str:
    return sig if isinstance(sig, str) else int(sig)


def _follow_call(session_id: str, pid: int, stdout_from: int, stderr_from: int) -> Call[None]:
    return Call(
        "GET",
        process_ops.follow_path(session_id, pid),
        lambda b: None,
        params={"stdout_from": int(stdout_from), "stderr_from": int(stderr_from)},
        refused=process_ops.process_refused,
    )


def _refuse(client: Client | AsyncClient, call: Call[None], response: httpx2.Response) -> None:
    """Raise the error for a refused follow's answer, read to its end (``call.refused`` maps
    it, as for any other call)."""
    from sandcell.client.sync import refusal

    refusal(client.endpoint, call, response.status_code, response.content, response.headers)


def _cut_short(session_id: str, pid: int) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"the service ended the output stream of process {pid} of session {session_id} before "
        "the process exited; follow it again from the last offsets"
    )


class ProcessMethods:
    """The process, terminal and watch methods of a blocking remote session (see
    :class:`sandcell.sessions.processes.ProcessControl` for what each does)."""

    _client: Client
    id: str

    def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        tag: str | None = None,
    ) -> ProcessInfo:
        """Start ``cmd`` (a Bash command line or an argv) in the background; its
        :class:`~sandcell.sessions.processes.ProcessInfo` at once. Raises SpawnRefused when the
        profile does not admit it and SpawnFailed when it does not start."""
        call = process_ops.spawn(self.id, cmd, env=env, cwd=cwd, stdin=stdin, pty=pty, tag=tag)
        return self._client._do(call)

    def processes(self) -> list[ProcessInfo]:
        """Every process spawned in the session, running or exited, oldest first."""
        return self._client._do(process_ops.processes(self.id))

    def read_process(
        self, pid: int, *, stdout_from: int = 0, stderr_from: int = 0
    ) -> ProcessOutput:
        """Output of process ``pid`` from these byte offsets, and whether it exited."""
        return self._client._do(process_ops.read_process(self.id, pid, stdout_from, stderr_from))

    def follow(
        self, pid: int, *, stdout_from: int = 0, stderr_from: int = 0
    ) -> Iterator[ProcessOutput]:
        """The output of process ``pid`` as it comes (the service's event stream), until it
        exited and all it wrote was read; the last item has ``exited``."""
        from sandcell.client.sync import unreachable

        client = self._client
        call = _follow_call(self.id, pid, stdout_from, stderr_from)
        reader = process_ops.OutputEvents(what=call.what, where=client.endpoint.describe())
        try:
            with client._http.stream("GET", call.path, params=dict(call.params)) as response:
                if response.status_code >= 400:
                    response.read()
                    _refuse(client, call, response)
                for line in response.iter_lines():
                    got = reader.feed(line)
                    if got is not None:
                        yield got
                        if reader.done:
                            return
        except httpx2.HTTPError as exc:
            raise unreachable(client.endpoint, call, exc) from None
        raise _cut_short(self.id, pid)

    def send_stdin(self, pid: int, data: bytes | str) -> None:
        """Queue ``data`` for the process's input (its terminal's, for a PTY)."""
        self._client._do(process_ops.send_stdin(self.id, pid, data))

    def close_stdin(self, pid: int) -> None:
        """End the process's input once what was queued is written (a terminal gets ^D)."""
        self._client._do(process_ops.close_stdin(self.id, pid))

    def signal(self, pid: int, sig: Signal) -> None:
        """Send ``sig`` (a number or a name) to the process and its process group."""
        self._client._do(process_ops.signal(self.id, pid, _sig(sig)))

    def kill(self, pid: int) -> None:
        """SIGKILL to the process and its group."""
        self._client._do(process_ops.kill(self.id, pid))

    def resize(self, pid: int, rows: int, cols: int) -> None:
        """Set the size of the process's terminal (it gets SIGWINCH)."""
        self._client._do(process_ops.resize(self.id, pid, rows, cols))

    def watch(self, path: str, recursive: bool = False) -> int:
        """Watch a directory of the sandbox; the watch's id for :meth:`watch_events`."""
        return self._client._do(process_ops.watch(self.id, path, recursive))

    def watch_events(self, watch_id: int) -> list[WatchEvent]:
        """The changes seen since the last call, oldest first."""
        return self._client._do(process_ops.watch_events(self.id, watch_id))

    def unwatch(self, watch_id: int) -> None:
        """Stop the watch."""
        self._client._do(process_ops.unwatch(self.id, watch_id))


class AsyncProcessMethods:
    """:class:`ProcessMethods` for asyncio: each method is awaited, :meth:`follow` is an async
    iterator."""

    _client: AsyncClient
    id: str

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        tag: str | None = None,
    ) -> ProcessInfo:
        call = process_ops.spawn(self.id, cmd, env=env, cwd=cwd, stdin=stdin, pty=pty, tag=tag)
        return await self._client._do(call)

    async def processes(self) -> list[ProcessInfo]:
        return await self._client._do(process_ops.processes(self.id))

    async def read_process(
        self, pid: int, *, stdout_from: int = 0, stderr_from: int = 0
    ) -> ProcessOutput:
        return await self._client._do(
            process_ops.read_process(self.id, pid, stdout_from, stderr_from)
        )

    async def follow(
        self, pid: int, *, stdout_from: int = 0, stderr_from: int = 0
    ) -> AsyncIterator[ProcessOutput]:
        """As :meth:`ProcessMethods.follow`, as an async iterator."""
        from sandcell.client.sync import unreachable

        client = self._client
        call = _follow_call(self.id, pid, stdout_from, stderr_from)
        reader = process_ops.OutputEvents(what=call.what, where=client.endpoint.describe())
        try:
            async with client._http.stream("GET", call.path, params=dict(call.params)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _refuse(client, call, response)
                async for line in response.aiter_lines():
                    got = reader.feed(line)
                    if got is not None:
                        yield got
                        if reader.done:
                            return
        except httpx2.HTTPError as exc:
            raise unreachable(client.endpoint, call, exc) from None
        raise _cut_short(self.id, pid)

    async def send_stdin(self, pid: int, data: bytes | str) -> None:
        await self._client._do(process_ops.send_stdin(self.id, pid, data))

    async def close_stdin(self, pid: int) -> None:
        await self._client._do(process_ops.close_stdin(self.id, pid))

    async def signal(self, pid: int, sig: Signal) -> None:
        await self._client._do(process_ops.signal(self.id, pid, _sig(sig)))

    async def kill(self, pid: int) -> None:
        await self._client._do(process_ops.kill(self.id, pid))

    async def resize(self, pid: int, rows: int, cols: int) -> None:
        await self._client._do(process_ops.resize(self.id, pid, rows, cols))

    async def watch(self, path: str, recursive: bool = False) -> int:
        return await self._client._do(process_ops.watch(self.id, path, recursive))

    async def watch_events(self, watch_id: int) -> list[WatchEvent]:
        return await self._client._do(process_ops.watch_events(self.id, watch_id))

    async def unwatch(self, watch_id: int) -> None:
        await self._client._do(process_ops.unwatch(self.id, watch_id))
