"""sandcell as a LangChain tool (``pip install 'sandcell[langchain]'``, langchain-core only).

>>> tool = sandcell_tool(Executor(), profile="analysis")           # doctest: +SKIP
>>> model.bind_tools([tool])                                        # doctest: +SKIP

``run_code(code, language)`` works with ``invoke`` and ``ainvoke`` (the run supervised on a
worker thread). Called with a model's tool call it answers a ``ToolMessage`` whose content is
:func:`sandcell.adapters.common.describe`'s text and whose ``artifact`` is the
:class:`~sandcell.spec.RunResult` itself, for the program around the agent.
"""

from __future__ import annotations

import asyncio

from langchain_core.tools import StructuredTool
from pydantic import BaseModel, ConfigDict, Field

from sandcell.adapters.common import (
    CODE_DESCRIPTION,
    LANGUAGE_DESCRIPTION,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    CodeTool,
    Runner,
    ToolLanguage,
    describe,
)
from sandcell.spec import Limits, RunResult

__all__ = ["RunCodeInput", "sandcell_tool"]


class RunCodeInput(BaseModel):
    """The tool's arguments, as the model sends them."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description=CODE_DESCRIPTION)
    language: ToolLanguage = Field(default="python", description=LANGUAGE_DESCRIPTION)


def sandcell_tool(
    runner: Runner,
    *,
    profile: str | None = None,
    limits: Limits | None = None,
    exports: tuple[str, ...] = (),
    display: bool = False,
    name: str = TOOL_NAME,
    description: str = TOOL_DESCRIPTION,
) -> StructuredTool:
    """A LangChain tool that runs code on ``runner`` (an Executor or a Client) under
    ``profile``; see :class:`~sandcell.adapters.common.CodeTool` for the other options."""
    tool = CodeTool(runner, profile=profile, limits=limits, exports=exports, display=display)

    def run_code(code: str, language: ToolLanguage = "python") -> tuple[str, RunResult]:
        result = tool.result(code, language)
        return describe(result), result

    async def arun_code(code: str, language: ToolLanguage = "python") -> tuple[str, RunResult]:
        return await asyncio.to_thread(run_code, code, language)

    return StructuredTool.from_function(
        func=run_code,
        coroutine=arun_code,
        name=name,
        description=description,
        args_schema=RunCodeInput,
        response_format="content_and_artifact",
    )
