"""The OpenAI Agents SDK function tool, run by the SDK's own Runner with a scripted Model (the
SDK's model interface): the model calls the tool, a real sandbox runs the code, the model sees
the tool's output. Tracing is off: nothing leaves this machine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed (the test extra has it)")

from agents import Agent, ModelResponse, RunConfig, Runner, Usage
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from sandcell.adapters.openai_agents import sandcell_tool
from sandcell.executor import Executor

pytestmark = pytest.mark.timeout(300)


class ScriptedModel(Model):
    """Calls ``run_code`` with each of ``calls`` in turn, then answers with the outputs of every
    tool call it was shown, as JSON; remembers the tools it was offered."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.offered: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items = kwargs["input"]
        self.offered = list(kwargs["tools"])
        outputs = [
            item["output"]
            for item in (items if isinstance(items, list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if len(outputs) < len(self.calls):
            n = len(outputs)
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call-{n}",
                name="run_code",
                arguments=json.dumps(self.calls[n]),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=json.dumps(outputs), annotations=[])
        message = ResponseOutputMessage(
            id="msg-final", role="assistant", status="completed", type="message", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run the agent without streaming")


def _run(model: ScriptedModel, tool: Any) -> list[str]:
    agent = Agent(name="analyst", instructions="Use run_code.", tools=[tool], model=model)
    config = RunConfig(tracing_disabled=True)
    result = asyncio.run(Runner.run(agent, "what is 6*7?", run_config=config))
    outputs = json.loads(result.final_output)
    assert isinstance(outputs, list)
    return outputs


def test_the_runner_calls_the_tool_and_sees_the_sandbox_result(executor: Executor) -> None:
    model = ScriptedModel(
        [
            {"code": "print(6 * 7)", "language": "python"},
            {"code": "echo sandboxed; cat /etc/hostname >/dev/null; exit 4", "language": "bash"},
        ]
    )
    ok, failed = _run(model, sandcell_tool(executor, profile="strict"))
    assert ok.startswith("outcome: ok\n") and "stdout:\n42" in ok
    assert failed.startswith("outcome: error (exit status 4)\n")
    assert "stdout:\nsandboxed" in failed
    (offered,) = model.offered
    assert offered.name == "run_code"
    assert offered.params_json_schema["properties"]["language"]["enum"] == [
        "python",
        "bash",
        "javascript",
        "typescript",
    ]


def test_an_exported_file_is_named_in_the_output(executor: Executor) -> None:
    model = ScriptedModel([{"code": "open('answer.txt', 'w').write('42')", "language": "python"}])
    (out,) = _run(model, sandcell_tool(executor, profile="strict", exports=("answer.txt",)))
    assert out.startswith("outcome: ok\n")
    assert "- answer.txt (2 bytes, text/plain, sha256 73475cb40a568e8d)" in out
