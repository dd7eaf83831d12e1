"""The LangChain tool, called the way an agent calls it: a fake chat model (langchain-core's
own) emits tool calls, and the tool answers them with ToolMessages, sync and async, from runs in
real sandboxes."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is not installed (the test extra)")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from pydantic import ValidationError

from sandcell.adapters.langchain import sandcell_tool
from sandcell.executor import Executor
from sandcell.spec import Outcome, RunResult

pytestmark = pytest.mark.timeout(300)


def _model_calling(*calls: dict[str, object]) -> GenericFakeChatModel:
    message = AIMessage(
        content="",
        tool_calls=[
            {"name": "run_code", "args": args, "id": f"call-{i}", "type": "tool_call"}
            for i, args in enumerate(calls)
        ],
    )
    return GenericFakeChatModel(messages=iter([message]))


def test_tool_calls_from_a_chat_model_run_in_the_sandbox(executor: Executor) -> None:
    tool = sandcell_tool(executor, profile="strict", display=True)
    reply = _model_calling(
        {"code": "x = 6 * 7\nprint('x is', x)\nx + 1"},
        {"code": "echo $((6*7)) >&2; false", "language": "bash"},
    ).invoke("compute")
    assert isinstance(reply, AIMessage)
    ok, failed = (tool.invoke(call) for call in reply.tool_calls)
    assert isinstance(ok, ToolMessage) and ok.tool_call_id == "call-0"
    assert ok.content.startswith("outcome: ok\n")
    assert "stdout:\nx is 42" in ok.content
    assert "value: 43" in ok.content
    # The result itself rides along for the program around the agent.
    assert isinstance(ok.artifact, RunResult) and ok.artifact.outcome is Outcome.OK
    assert isinstance(failed, ToolMessage) and failed.tool_call_id == "call-1"
    assert failed.content.startswith("outcome: error (exit status 1)\n")
    assert "stderr:\n42" in failed.content


def test_the_tool_runs_asynchronously(executor: Executor) -> None:
    tool = sandcell_tool(executor, profile="strict")
    (call,) = _model_calling({"code": "print(sum(range(10)))"}).invoke("sum").tool_calls

    async def both() -> list[ToolMessage]:
        return list(await asyncio.gather(tool.ainvoke(call), tool.ainvoke(call)))

    for message in asyncio.run(both()):
        assert message.content.startswith("outcome: ok\n")
        assert "stdout:\n45" in message.content


def test_bad_arguments_from_the_model_are_refused_by_the_schema(executor: Executor) -> None:
    tool = sandcell_tool(executor)
    with pytest.raises(ValidationError, match="language"):
        tool.invoke({"code": "print(1)", "language": "ruby"})
    with pytest.raises(ValidationError, match="code"):
        tool.invoke({"language": "python"})
