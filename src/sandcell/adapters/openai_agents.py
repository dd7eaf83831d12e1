"""sandcell as an OpenAI Agents SDK function tool (``pip install 'sandcell[openai-agents]'``).

>>> from agents import Agent                                         # doctest: +SKIP
>>> agent = Agent(name="analyst", tools=[sandcell_tool(Executor(), profile="analysis")])

``run_code(code, language)`` runs each call in a fresh sandbox, supervised on a worker thread so
the runner's event loop keeps going, and answers with
:func:`sandcell.adapters.common.describe`'s text.
"""

from __future__ import annotations

from agents import FunctionTool, function_tool

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
) -> FunctionTool:
    """A function tool that runs code on ``runner`` (an Executor or a Client) under
    ``profile``; see :class:`~sandcell.adapters.common.CodeTool` for the other options."""
    tool = CodeTool(runner, profile=profile, limits=limits, exports=exports, display=display)

    async def run_code(code: str, language: ToolLanguage = "python") -> str:
        """Run a program in a fresh sandbox.

        Args:
            code: the program's full source text
            language: the program's language: python (default), bash, or javascript or
                typescript (Node.js 22)
        """
        return await tool.acall(code, language)

    return function_tool(run_code, name_override=name, description_override=description)
