"""The pydantic-ai tool, driven by pydantic-ai's own FunctionModel: the model calls the tool, a
real sandbox runs the code, and the model sees the tool's text."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed (the test extra has it)")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandcell.adapters.pydantic_ai import sandcell_tool
from sandcell.executor import Executor

pytestmark = pytest.mark.timeout(300)


def _scripted(calls: list[dict[str, Any]]) -> FunctionModel:
    """A model that makes the given tool calls one per turn, then answers with every tool
    return it saw, as JSON."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if len(returns) < len(calls):
            args = calls[len(returns)]
            return ModelResponse(parts=[ToolCallPart("run_code", args, f"call-{len(returns)}")])
        return ModelResponse(parts=[TextPart(json.dumps(returns))])

    return FunctionModel(respond)


def test_an_agent_runs_python_and_bash_through_the_tool(executor: Executor) -> None:
    tool = sandcell_tool(executor, profile="strict")
    agent = Agent(
        _scripted(
            [
                {"code": "import sys\nprint(6 * 7)\nprint('careful', file=sys.stderr)"},
                {"code": "echo from-bash; exit 3", "language": "bash"},
            ]
        ),
        tools=[tool],
    )
    returns = json.loads(agent.run_sync("what is 6*7?").output)
    ok, failed = returns
    assert ok.startswith("outcome: ok\n")
    assert "stdout:\n42" in ok
    assert "stderr:\ncareful" in ok
    assert failed.startswith("outcome: error (exit status 3)\n")
    assert "stdout:\nfrom-bash" in failed


def test_the_tool_schema_offers_code_and_language(executor: Executor) -> None:
    agent = Agent(_scripted([]), tools=[sandcell_tool(executor)])
    seen: list[Any] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("no run")])

    agent.run_sync("hi", model=FunctionModel(respond))
    (definition,) = seen
    assert definition.name == "run_code"
    schema = definition.parameters_json_schema
    assert schema["required"] == ["code"]
    assert schema["properties"]["language"]["enum"] == [
        "python",
        "bash",
        "javascript",
        "typescript",
    ]
    assert "sandbox" in (definition.description or "")


def test_a_program_the_profile_denies_is_a_result_the_model_sees(executor: Executor) -> None:
    agent = Agent(
        _scripted([{"code": "import socket\nsocket.create_connection(('127.0.0.1', 1))"}]),
        tools=[sandcell_tool(executor, profile="strict")],
    )
    (denied,) = json.loads(agent.run_sync("connect").output)
    assert denied.startswith("outcome: awaiting_approval\n"), denied
    assert "py.network" in denied
