"""The official MCP SDK's clients against a real ``sandcell mcp`` (a subprocess) or a real
streamable-HTTP server, and small readers of what comes back."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import ElicitationFnT
from mcp.types import CallToolResult, ImageContent, TextContent

REPO = Path(__file__).resolve().parents[2]


def server_params(home: Path, *args: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    env["SANDCELL_HOME"] = str(home)
    return StdioServerParameters(
        command=sys.executable, args=["-m", "sandcell", "mcp", *args], env=env, cwd=str(REPO)
    )


@contextlib.asynccontextmanager
async def stdio_session(
    home: Path, *args: str, elicit: ElicitationFnT | None = None
) -> AsyncIterator[ClientSession]:
    """A handshake-era client session with ``sandcell mcp ARGS`` started as a subprocess."""
    async with (
        stdio_client(server_params(home, *args)) as (read, write),
        ClientSession(read, write, elicitation_callback=elicit) as session,
    ):
        await session.initialize()
        yield session


def text(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


def images(result: CallToolResult) -> list[ImageContent]:
    return [b for b in result.content if isinstance(b, ImageContent)]


def structured(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, text(result)
    return dict(result.structured_content)


def assert_tool_error(result: CallToolResult, *needles: str) -> None:
    """A tool error for the model: isError, the words that say what was wrong, no traceback."""
    body = text(result)
    assert result.is_error, body
    assert "Traceback" not in body, body
    for needle in needles:
        assert needle in body, body


def names(items: Sequence[Any]) -> set[str]:
    return {str(getattr(i, "name", "")) for i in items}
