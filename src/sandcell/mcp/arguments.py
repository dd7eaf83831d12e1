"""Tool arguments checked against each tool's published input schema before the call, so that a
wrong call gets one plain sentence per problem (``run_python: bad arguments: code: 'code' is a
required property``) instead of the SDK's validation dump."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # ships no type information
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

_MAX_PROBLEMS = 5
_MAX_MESSAGE = 200


class ArgumentCheck:
    """Server middleware: a ``tools/call`` whose arguments break the tool's input schema is
    answered with a tool error (isError) naming each problem; anything else passes through."""

    def __init__(self, server: MCPServer[Any]) -> None:
        self._server = server
        self._validators: dict[str, Any] | None = None

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        params = ctx.params
        if ctx.method != "tools/call" or ctx.request_id is None or not isinstance(params, Mapping):
            return await call_next(ctx)
        name, arguments = params.get("name"), params.get("arguments")
        validator = (await self._load()).get(name) if isinstance(name, str) else None
        if validator is None or not isinstance(arguments, Mapping | None):
            return await call_next(ctx)
        problems = sorted(
            validator.iter_errors(dict(arguments or {})), key=lambda e: list(e.absolute_path)
        )
        if not problems:
            return await call_next(ctx)
        lines = [_line(e) for e in problems[:_MAX_PROBLEMS]]
        more = len(problems) - len(lines)
        text = f"{name}: bad arguments: " + "; ".join(lines)
        if more > 0:
            text += f"; and {more} more"
        text += "; call it again with arguments that match its input schema (tools/list)"
        return CallToolResult(content=[TextContent(text=text)], is_error=True)

    async def _load(self) -> dict[str, Any]:
        if self._validators is None:
            self._validators = {
                tool.name: jsonschema.Draft202012Validator(tool.input_schema)
                for tool in await self._server.list_tools()
            }
        return self._validators


def _line(error: Any) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "arguments"
    message = error.message
    # An optional argument is "T or null": say what was wrong with it as a T.
    as_value = [e for e in error.context or () if e.validator_value != "null"]
    if as_value:
        message = as_value[0].message
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    return f"{where}: {message}"
