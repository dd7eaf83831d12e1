"""An upstream MCP server as a governed tool, through the official ``mcp`` SDK (extra ``tools``).

The server is started on the host (``command``, stdio) or reached at ``url`` (streamable HTTP).
The credential goes to it the way each transport allows: as the environment variable named by
``credential_env`` of the started process (which otherwise gets only the SDK's minimal
environment), or as ``Authorization: Bearer`` on every HTTP request. Neither reaches the sandbox.

Each call opens its own session (and, for stdio, its own server process): no state survives
between calls, at the cost of a start per call. Tool schemas are read once, on first use.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from types import MappingProxyType
from typing import Any, TypeVar

from sandcell.errors import ConfigError
from sandcell.tools.definitions import McpTool
from sandcell.tools.upstream import Operation, UpstreamError

_T = TypeVar("_T")

try:
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
except ImportError as exc:  # the optional extra is missing
    raise ConfigError(
        "MCP tools need the official mcp SDK: install sandcell with the 'tools' extra "
        f"(pip install 'sandcell[tools]'); {exc}"
    ) from None


class McpUpstream:
    """Calls one MCP server with the credential the gateway read at start."""

    def __init__(self, tool: McpTool, credential: str | None) -> None:
        self.tool = tool
        self._credential = credential
        self._operations: tuple[Operation, ...] | None = None

    def operations(self) -> tuple[Operation, ...]:
        if self._operations is None:
            listed = self._run(self._list)
            self._operations = tuple(op for op in listed if op.name in self.tool.allow)
        return self._operations

    def call(self, operation: str, args: Mapping[str, object]) -> object:
        async def call(session: ClientSession) -> object:
            result = await session.call_tool(operation, dict(args))
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        return self._run(call)

    def close(self) -> None:
        """Nothing is held between calls."""

    async def _list(self, session: ClientSession) -> tuple[Operation, ...]:
        found: list[Operation] = []
        cursor: str | None = None
        for _ in range(100):  # pages; a server paging forever is cut off
            params = None if cursor is None else {"cursor": cursor}
            page = await session.list_tools(params=params)  # type: ignore[arg-type]
            for t in page.tools:
                schema = MappingProxyType(dict(t.input_schema))
                found.append(
                    Operation(name=t.name, description=t.description or "", input_schema=schema)
                )
            cursor = page.next_cursor
            if not cursor:
                break
        return tuple(found)

    def _run(self, action: Callable[[ClientSession], Awaitable[_T]]) -> _T:
        async def main() -> _T:
            with anyio.fail_after(self.tool.limits.timeout_s):
                async with AsyncExitStack() as stack:
                    streams = await stack.enter_async_context(await self._transport(stack))
                    read, write = streams[0], streams[1]
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await session.initialize()
                    return await action(session)

        try:
            return anyio.run(main)
        except TimeoutError:
            raise UpstreamError(
                f"tool {self.tool.name} did not answer within {self.tool.limits.timeout_s:g} s"
            ) from None
        except Exception as exc:
            raise UpstreamError(
                f"tool {self.tool.name}: the MCP server failed ({_describe(exc)})"
            ) from None

    async def _transport(self, stack: AsyncExitStack) -> Any:
        if self.tool.command:
            env = {}
            if self.tool.credential_env and self._credential is not None:
                env[self.tool.credential_env] = self._credential
            params = StdioServerParameters(
                command=self.tool.command[0], args=list(self.tool.command[1:]), env=env
            )
            errlog = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115
            return stdio_client(params, errlog=errlog)
        assert self.tool.url is not None
        headers = {}
        if self._credential is not None:
            headers["Authorization"] = f"Bearer {self._credential}"
        client = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        return streamable_http_client(self.tool.url, http_client=client)


def _describe(exc: BaseException) -> str:
    """The innermost exception types of a (group of) exception(s), never their messages."""
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(_describe(e) for e in exc.exceptions)
    return type(exc).__name__
