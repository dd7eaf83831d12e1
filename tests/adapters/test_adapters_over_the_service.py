"""The adapters given a Client instead of an Executor: the same tools against a real
``sandcell serve`` on a loopback port (one service for the module)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx2", reason="httpx2 is not installed (the client extra)")
pytest.importorskip("langchain_core", reason="langchain-core is not installed (the test extra)")
pytest.importorskip("smolagents", reason="smolagents is not installed (the test extra)")

from smolagents.default_tools import FinalAnswerTool
from smolagents.monitoring import AgentLogger, LogLevel
from tests.service.server import ServiceProcess, add_tenant

from sandcell.adapters.langchain import sandcell_tool
from sandcell.adapters.smolagents import SandcellPythonExecutor
from sandcell.client import Client
from sandcell.sessions import SessionEnded

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    if os.geteuid() != 0:
        pytest.skip("the service runs sandboxes as root; run as root")
    home: Path = tmp_path_factory.mktemp("adapters-service")
    service = ServiceProcess(home, args=("--start", "cold")).start()
    try:
        with Client(service.url, add_tenant(home, "adapters")) as c:
            yield c
    finally:
        assert service.stop() == -signal.SIGTERM


def test_the_langchain_tool_runs_on_the_service(client: Client) -> None:
    tool = sandcell_tool(client, profile="strict", exports=("out.txt",))
    message = tool.invoke(
        {
            "name": "run_code",
            "args": {"code": "open('out.txt', 'w').write('42')\nprint('written')"},
            "id": "call-1",
            "type": "tool_call",
        }
    )
    assert message.content.startswith("outcome: ok\n")
    assert "stdout:\nwritten" in message.content
    (artifact,) = message.artifact.artifacts
    assert client.artifact(artifact.sha256) == b"42"


def test_the_smolagents_executor_keeps_a_remote_session(client: Client) -> None:
    quiet = AgentLogger(level=LogLevel.OFF)
    with SandcellPythonExecutor(client, profile="strict", logger=quiet) as ex:
        ex.send_tools({"final_answer": FinalAnswerTool()})
        ex.send_variables({"base": 40})
        assert ex("x = base + 2\nx").output == "42"
        out = ex("final_answer(x)")
        assert out.is_final_answer and out.output == 42
        session = ex.session
    # Leaving the executor ended the session on the service.
    with pytest.raises(SessionEnded):
        session.run("x")
