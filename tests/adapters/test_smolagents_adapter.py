"""smolagents' CodeAgent on a sandcell session: a scripted smolagents Model writes fixed code
blobs, the agent hands them to SandcellPythonExecutor, and a real sandbox runs them: state kept
across steps, tools defined in the sandbox, final_answer's value back on the host, errors shown
to the model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("smolagents", reason="smolagents is not installed (the test extra has it)")

from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.utils import AgentError

from sandcell.adapters.smolagents import SandcellPythonExecutor
from sandcell.errors import ConfigError
from sandcell.executor import Executor
from sandcell.spec import InputFile, Limits

pytestmark = pytest.mark.timeout(300)


class ScriptedModel(Model):  # type: ignore[misc]
    """Answers each step with the next fixed code blob; remembers what it was shown."""

    def __init__(self, blobs: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.blobs = list(blobs)
        self.seen: list[str] = []

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        last = messages[-1]
        content = last.content if hasattr(last, "content") else last["content"]
        self.seen.append(str(content))
        code = self.blobs.pop(0)
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=f"Thought: go.\n<code>\n{code}\n</code>"
        )


@tool
def celsius_to_fahrenheit(celsius: float) -> float:
    """Converts a temperature.

    Args:
        celsius: the temperature in degrees Celsius
    """
    return celsius * 9 / 5 + 32


@pytest.fixture
def quiet() -> AgentLogger:
    return AgentLogger(level=LogLevel.OFF)


@pytest.fixture
def sandcell_executor(executor: Executor, quiet: AgentLogger) -> Iterator[SandcellPythonExecutor]:
    with SandcellPythonExecutor(executor, profile="strict", logger=quiet) as ex:
        yield ex


def _agent(model: ScriptedModel, ex: SandcellPythonExecutor, tools: list[Any]) -> CodeAgent:
    return CodeAgent(tools=tools, model=model, executor=ex, max_steps=4, verbosity_level=-1)


def test_a_code_agent_runs_its_steps_in_a_sandcell_session(
    sandcell_executor: SandcellPythonExecutor,
) -> None:
    model = ScriptedModel(
        [
            "import os\nwhere = os.getcwd()\nhot = celsius_to_fahrenheit(100)\nprint('hot', hot)",
            "final_answer({'where': where, 'pid': os.getpid(), 'hot': hot})",
        ]
    )
    with _agent(model, sandcell_executor, [celsius_to_fahrenheit]) as agent:
        answer = agent.run("How hot is boiling water?")
    assert answer["hot"] == 212.0
    # The code ran in the sandbox, not in this process: its working directory, its own pids.
    assert answer["where"] == "/sandbox"
    assert answer["pid"] != os.getpid()
    # The first step's output was the model's observation for the second.
    assert "hot 212.0" in model.seen[-1]


def test_an_error_is_shown_to_the_model_and_the_agent_goes_on(
    sandcell_executor: SandcellPythonExecutor,
) -> None:
    model = ScriptedModel(["x = start + 1\nprint('before')\n1 / 0", "final_answer(x + 1)"])
    agent = _agent(model, sandcell_executor, [])
    # additional_args reach the sandbox through send_variables.
    assert agent.run("compute", additional_args={"start": 40}) == 42
    assert "ZeroDivisionError" in model.seen[-1]
    assert "before" in model.seen[-1]


def test_final_answer_leaves_the_marker_out_of_the_logs(
    sandcell_executor: SandcellPythonExecutor,
) -> None:
    agent = _agent(ScriptedModel([]), sandcell_executor, [])
    sandcell_executor.send_tools(agent.tools)
    sandcell_executor.send_variables({"json": "shadowed", "rows": [1, 2, 3]})
    out = sandcell_executor("print('sum', sum(rows))\nfinal_answer(list(rows) + [sum(rows)])")
    assert out.is_final_answer
    assert out.output == [1, 2, 3, 6]
    assert out.logs == "sum 6\n"
    plain = sandcell_executor("rows[0] * 10")
    assert not plain.is_final_answer and plain.output == "10"
    assert sandcell_executor("json").output == "'shadowed'"


def test_a_step_the_profile_refuses_is_an_error_for_the_model(
    sandcell_executor: SandcellPythonExecutor,
) -> None:
    model = ScriptedModel(
        ["import socket\nsocket.create_connection(('127.0.0.1', 9))", "final_answer('gave up')"]
    )
    agent = _agent(model, sandcell_executor, [])
    assert agent.run("connect") == "gave up"
    assert "py.network" in model.seen[-1]


def test_a_tool_needing_a_missing_package_is_refused(
    executor: Executor, quiet: AgentLogger
) -> None:
    @tool
    def fetch(url: str) -> str:
        """Fetches a page.

        Args:
            url: the address
        """
        import sandcell_no_such_module

        return str(sandcell_no_such_module.get(url))

    with (
        SandcellPythonExecutor(executor, profile="strict", logger=quiet) as ex,
        pytest.raises(ConfigError, match="sandcell_no_such_module"),
    ):
        ex.send_tools({"fetch": fetch})


def test_a_variable_json_cannot_hold_is_refused(
    sandcell_executor: SandcellPythonExecutor,
) -> None:
    with pytest.raises(ConfigError, match="'when'"):
        sandcell_executor.send_variables({"when": object()})
    with pytest.raises(ConfigError, match="identifier"):
        sandcell_executor.send_variables({"not a name": 1})


def test_the_agent_reads_the_session_inputs(
    executor: Executor, quiet: AgentLogger, tmp_path: Path
) -> None:
    data = tmp_path / "numbers.csv"
    data.write_text("n\n4\n38\n")
    model = ScriptedModel(
        [
            "import csv\nrows = list(csv.DictReader(open('/inputs/numbers.csv')))\n"
            "final_answer(sum(int(r['n']) for r in rows))"
        ]
    )
    inputs = (InputFile(host_path=data, name="numbers.csv"),)
    with SandcellPythonExecutor(executor, profile="strict", inputs=inputs, logger=quiet) as ex:
        assert _agent(model, ex, []).run("add them up") == 42


def test_a_tool_using_the_runtime_s_numpy_runs_in_the_sandbox(
    executor: Executor, quiet: AgentLogger
) -> None:
    @tool
    def mean(values: list[float]) -> float:
        """The mean of some values.

        Args:
            values: the values
        """
        import numpy

        return float(numpy.mean(values))

    model = ScriptedModel(["final_answer(mean([40, 44]))"])
    with SandcellPythonExecutor(executor, profile="analysis", logger=quiet) as ex:
        assert _agent(model, ex, [mean]).run("the mean") == 42.0


def test_a_session_killed_at_its_memory_limit_fails_the_later_steps(
    executor: Executor, quiet: AgentLogger
) -> None:
    limits = Limits(memory_bytes=128 * 2**20)
    with SandcellPythonExecutor(executor, profile="strict", limits=limits, logger=quiet) as ex:
        ex("x = 1")
        with pytest.raises(AgentError, match="memory_limit"):
            ex("b = bytearray(400 * 2**20)")
        with pytest.raises(AgentError, match="session has ended"):
            ex("x")
