"""sandcell as a pydantic-ai tool (``pip install 'sandcell[pydantic-ai]'``).

>>> from pydantic_ai import Agent                                  # doctest: +SKIP
>>> agent = Agent("openai:gpt-4.1-mini", tools=[sandcell_tool(Executor(), profile="analysis")])

The tool ``run_code(code, language)`` runs each call in a fresh sandbox and answers with
:func:`sandcell.adapters.common.describe`'s text. It is asynchronous: the run is supervised on a
worker thread, so the agent's event loop keeps going.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Tool

from sandcell.adapters.common import (
    TOOL_DESCRIPTION,
    TOOL_NAME,
    CodeTool,
    Runner,
    ToolLanguage,
)
from sandcell.spec import Limits

__all__ = ["sandcell_tool"]


def sandcell_tool(
    runner: Runner,
    *,
    profile: str | None = None,
    limits: Limits | None = None,
    exports: tuple[str, ...] = (),
    display: bool = False,
    name: str = TOOL_NAME,
    description: str = TOOL_DESCRIPTION,
) -> Tool[Any]:
    """A pydantic-ai tool that runs code on ``runner`` (an Executor or a Client) under
    ``profile``; see :class:`~sandcell.adapters.common.CodeTool` for ``limits``, ``exports`` and
    ``display``."""
    tool = CodeTool(runner, profile=profile, limits=limits, exports=exports, display=display)

    async def run_code(code: str, language: ToolLanguage = "python") -> str:
        """Run a program in a fresh sandbox.

        Args:
            code: the program's full source text
            language: the program's language: python (default), bash, or javascript or
                typescript (Node.js 22)
        """
        return await tool.acall(code, language)

    return Tool(run_code, name=name, description=description, takes_ctx=False)
