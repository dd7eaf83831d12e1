"""``sandcell.client`` against the real service: the executor's run and session API over
HTTP with the same result types, errors as sandcell's own, real sandboxes."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
from tests.conftest import runtime_required
from tests.service.server import ServiceProcess, add_approver, add_tenant

from sandcell.client import AsyncClient, Client, QuotaExceeded, ServiceError, ServiceUnavailable
from sandcell.errors import ConfigError, InfraError
from sandcell.executor import Executor
from sandcell.sessions import SessionEnded
from sandcell.spec import InputFile, Limits, Outcome, RunRequest, RunResult, result_to_dict

pytestmark = pytest.mark.timeout(300)

_VARIES = ("run_id", "usage", "started_at", "start", "session_id")
"""What differs between two runs of the same program: ids, timings, the start's wait."""


def _same(result: RunResult) -> dict[str, object]:
    return {k: v for k, v in result_to_dict(result).items() if k not in _VARIES}


def _analyse(ex: Executor | Client, data: Path) -> RunResult:
    """Code written against the executor's API, given an executor or a client."""
    request = RunRequest(
        code=(
            "import json, os, sys\n"
            "n = int(os.environ['N']) * int(open('/inputs/n.txt').read())\n"
            "json.dump({'n': n}, open('out.json', 'w'))\n"
            "print(n, sys.stdin.read())\n"
        ),
        inputs=(InputFile(host_path=data, name="n.txt"),),
        exports=("out.json",),
        stdin=b"!",
        env={"N": "3"},
        limits=Limits(wall_time_s=20),
    )
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return ex.run(request, profile="strict", schema=schema, result_file="out.json")


def _notebook(ex: Executor | Client) -> tuple[RunResult, list[str]]:
    with ex.session(profile="strict") as s:
        s.run("x = 6 * 7\nopen('x.txt', 'w').write(str(x))")
        return s.run("x"), s.files()


def test_the_same_code_in_process_and_over_the_service(
    service: ServiceProcess, home: Path, tmp_path: Path
) -> None:
    key = add_tenant(home, "client-switch")
    data = tmp_path / "n.txt"
    data.write_text("14")
    local_home = tmp_path / "local"
    local_home.mkdir()
    results: dict[str, tuple[RunResult, RunResult, list[str]]] = {}
    with Executor(home=local_home) as ex:
        results["in-process"] = (_analyse(ex, data), *_notebook(ex))
    with Client(service.url, key) as ex:  # the one line that changes
        results["service"] = (_analyse(ex, data), *_notebook(ex))

    here, there = results["in-process"], results["service"]
    assert here[0].stdout == "42 !\n" and here[0].outcome is Outcome.OK, here[0]
    assert _same(there[0]) == _same(here[0])
    assert there[0].artifacts[0].sha256 == here[0].artifacts[0].sha256
    assert _same(there[1]) == _same(here[1])
    assert there[1].outputs[0].data["text/plain"] == "42"
    assert there[2] == here[2] == ["x.txt"]
    with Client(service.url, key) as c:
        assert c.artifact(there[0].artifacts[0].sha256) == b'{"n": 42}'
        entry = c.audit(there[0].run_id)
        assert entry.run_id == there[0].run_id and entry.record["outcome"] == "ok"


def test_sessions_files_and_their_end(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-session")
    with Client(service.url, key) as c:
        s = c.session(profile="strict", idle_timeout_s=120)
        assert s.info().profile == "strict"
        assert s.write_file("out/in.txt", b"hello").outcome is Outcome.OK
        assert s.run("print(open('out/in.txt').read().upper())").stdout == "HELLO\n"
        assert s.files() == ["out/in.txt"]
        assert s.read_file("out/in.txt") == b"hello"
        end = s.close(exports=("out/*.txt",))
        assert end.reason == "closed" and [a.path for a in end.artifacts] == ["out/in.txt"]
        with pytest.raises(SessionEnded, match="start a new one"):
            s.run("1")
        assert s.close().reason == "closed"  # idempotent, as in-process


def test_a_javascript_session_over_the_service(service: ServiceProcess, home: Path) -> None:
    runtime_required("node")
    key = add_tenant(home, "client-node", profiles=("unchecked",))
    with Client(service.url, key) as c:
        s = c.session(language="js", idle_timeout_s=120)
        assert s.info().language == "javascript"
        assert s.run("const _ = require('lodash'); let xs = [40, 2];").outcome is Outcome.OK
        done = s.run("console.log(_.sum(xs)); xs.length")
        assert (done.outcome, done.stdout) == (Outcome.OK, "42\n"), done.stderr
        assert s.close().reason == "closed"
        with pytest.raises(ConfigError, match="unknown language 'ruby'"):
            c.session(language="ruby")  # never sent
        with pytest.raises(ServiceError, match=r"body\.language") as e:
            c.session(language="bash")  # no kernel runs bash: bash cells run in python's
        assert e.value.status == 422


def test_errors_are_sandcells_own(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-errors", runs_per_minute=2)
    with Client(service.url, "sc_wrong") as c, pytest.raises(ServiceError) as refused:
        c.run("print(1)")
    assert refused.value.status == 401 and "refused the API key" in str(refused.value)

    with Client(service.url, key) as c:
        with pytest.raises(ServiceError, match="not one of tenant 'client-errors'") as e:
            c.run("print(1)", profile="analysis")
        assert e.value.status == 403 and isinstance(e.value, ConfigError)
        with pytest.raises(ConfigError, match="validates with a Python class"):
            c.run("print(1)", model=dict)
        # An unknown language is never sent.
        with pytest.raises(ConfigError, match="unknown language 'ruby'"):
            c.run("puts 1", language="ruby")
        with pytest.raises(ServiceError, match=r"POST /v1/runs: .*wall_time_s") as e:
            c.run(RunRequest(code="1", limits=Limits(wall_time_s=10_000)))
        assert e.value.status == 400
        # The first of its two runs this minute; a language by a short name is sent by its
        # full one (strict runs JavaScript).
        assert c.run("console.log(1)", language="js").stdout == "1\n"
        with pytest.raises(QuotaExceeded, match="runs_per_minute 2") as over:
            for _ in range(2):
                c.run("print(2)")
        assert over.value.retry_after_s is not None and over.value.retry_after_s > 0
        assert over.value.status == 429

    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with Client(f"http://127.0.0.1:{port}", key) as c, pytest.raises(ServiceUnavailable) as gone:
        c.run("print(1)")
    assert isinstance(gone.value, InfraError) and "cannot reach" in str(gone.value)


def test_async_client_cancel_and_approvals(service: ServiceProcess, home: Path) -> None:
    key = add_tenant(home, "client-async")
    approver = add_approver(home, "client-async")

    async def scenario() -> dict[str, Any]:
        async with AsyncClient(service.url, key) as c, AsyncClient(service.url, approver) as a:
            slow = await c.submit("import time\ntime.sleep(60)")
            assert await c.cancel(slow)
            killed = await c.wait(slow)
            assert await c.cancel(slow) is False  # finished: nothing to stop
            waiting = await c.run_async("import subprocess\nprint('approved')")
            pending = await c.approvals()
            approved = await a.approve(pending[0].id, reason="fine")
            other = await c.run("import subprocess\nprint('no')")
            denied = await c.deny((await c.approvals())[0].id, reason="not today")
            async with await c.session() as s:
                cell = await s.run("print(sum(range(5)))")
            return locals()

    got = anyio.run(scenario)
    assert got["killed"].outcome is Outcome.KILLED and got["killed"].reason.startswith("cancell")
    assert got["waiting"].outcome is Outcome.AWAITING_APPROVAL
    assert [a.code for a in got["pending"]] == ["import subprocess\nprint('approved')"]
    assert got["approved"].stdout == "approved\n" and got["approved"].outcome is Outcome.OK
    assert got["other"].outcome is Outcome.AWAITING_APPROVAL
    assert got["denied"].outcome is Outcome.DENIED and "not today" in got["denied"].reason
    assert got["cell"].stdout == "10\n"


def test_from_env_finds_the_local_socket(
    service: ServiceProcess, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = add_tenant(home, "client-env")
    monkeypatch.delenv("SANDCELL_URL", raising=False)
    monkeypatch.setenv("SANDCELL_HOME", str(home))
    monkeypatch.setenv("SANDCELL_API_KEY", key)
    with Client.from_env() as c:
        assert c.endpoint.socket == service.socket
        assert c.run("print('by socket')").stdout == "by socket\n"
    monkeypatch.setenv("SANDCELL_URL", service.url)
    with Client.from_env() as c:
        assert c.endpoint.socket is None
        assert c.run("print('by url')").stdout == "by url\n"
    monkeypatch.delenv("SANDCELL_API_KEY")
    with pytest.raises(ConfigError, match="SANDCELL_API_KEY is not set"):
        Client.from_env()
    monkeypatch.delenv("SANDCELL_URL")
    monkeypatch.setenv("SANDCELL_HOME", str(home / "nowhere"))
    with pytest.raises(ConfigError, match="no sandcell service to talk to"):
        Client.from_env()
