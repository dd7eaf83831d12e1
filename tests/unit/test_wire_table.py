"""The one wire table (:mod:`sandcell.wire`) against every surface that answers with it.

Every exception class sandcell defines is in the one tree and resolves to a row; every row
names a class; and for one error of each row (and the statuses a carrier can carry), each
surface answers as the row says: the command line's exit status, the problem document a real
service app returns, the E2B JSON and Connect errors a real E2B app returns, the MCP tool
error, the Python client's exception for that answer and the command line's for the same.
Every outcome's exit status, MCP ``isError`` and E2B command ending are checked as well.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

import sandcell
from sandcell import status, wire
from sandcell.backends.cell.state import PauseRefused
from sandcell.cli import guarded
from sandcell.cli.remote import Response as RemoteResponse
from sandcell.cli.remote import Target, _problem
from sandcell.client.errors import (
    QuotaExceeded,
    ServiceError,
    ServiceIsolationUnavailable,
    ServiceUnavailable,
    error_for,
)
from sandcell.e2b.app import e2b_app
from sandcell.e2b.errors import E2BError
from sandcell.errors import (
    AuditError,
    ConfigError,
    InfraError,
    IsolationUnavailable,
    ModelError,
    ModelRateLimited,
    SandcellError,
    StoreUnavailable,
)
from sandcell.mcp.content import ContentLimits, run_content
from sandcell.mcp.tools import _tool_errors
from sandcell.network.ingress import PortClosed, PortNotAllowed
from sandcell.service.app import create_app, make_service
from sandcell.service.core import Service, ServiceConfig
from sandcell.service.problems import PROBLEM_JSON, ServiceProblem
from sandcell.sessions import SessionEnded
from sandcell.sessions.processes import ProcessNotFound, SpawnFailed, SpawnRefused
from sandcell.sessions.states import StateNotFound, StateTampered
from sandcell.spec import Outcome, RunResult, Usage

INSIDE = (
    "sandcell.backends.inside.",
    "sandcell.backends.microvm.guest.",
    "sandcell.batch._harness",
    "sandcell.tools.sandcell_tools",
)
"""Modules that run inside a sandbox or guest, where sandcell is not importable: their
exceptions never leave the sandbox as exceptions, so they stay outside the tree."""


def _import_all() -> None:
    for found in pkgutil.walk_packages(sandcell.__path__, "sandcell."):
        if not found.name.endswith("__main__"):
            importlib.import_module(found.name)


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    seen: set[type[BaseException]] = set()
    todo = [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_every_exception_of_sandcell_is_in_the_one_tree() -> None:
    _import_all()
    outside = sorted(
        _name(c)
        for c in _subclasses(Exception)
        if c.__module__.startswith("sandcell.")
        and not c.__module__.startswith(INSIDE)
        and not issubclass(c, SandcellError)
    )
    assert outside == []


def test_every_row_names_a_class_of_the_tree() -> None:
    _import_all()
    for key in wire.ERRORS:
        module, _, qualname = key.rpartition(".")
        cls = getattr(importlib.import_module(module), qualname)
        assert issubclass(cls, SandcellError), key
        assert wire.class_wire(cls) is wire.ERRORS[key]


def test_every_error_class_resolves_to_its_nearest_row() -> None:
    _import_all()
    for cls in _subclasses(SandcellError) | {SandcellError}:
        nearest = next(wire.ERRORS[_name(a)] for a in cls.__mro__ if _name(a) in wire.ERRORS)
        assert wire.class_wire(cls) is nearest, _name(cls)
    assert wire.class_wire(ServiceUnavailable).code == "infra_error"
    assert wire.class_wire(ServiceIsolationUnavailable).code == "isolation_unavailable"
    assert wire.class_wire(ServiceError).code == "invalid_request"


SAMPLES: list[SandcellError] = [
    SandcellError("an error of no class of its own"),
    ConfigError("limits.memory_mb: give a whole number"),
    SessionEnded("the session s-1 has ended (closed)"),
    StateNotFound("no paused session p-1"),
    StateTampered("the saved state p-1 changed on disk"),
    PauseRefused("the namespaces backend cannot save a session's memory here"),
    ProcessNotFound("no process 41 was started in this session"),
    SpawnRefused("not started: the command is denied by profile 'strict'"),
    SpawnFailed("the session's process limit is reached"),
    PortNotAllowed("port 9000 is not in the profile's [ingress] ports (8000)"),
    PortClosed("nothing accepted a connection on port 8000 in the sandbox: Connection refused"),
    QuotaExceeded("over quota", detail="3 runs at once", retry_after_s=2.0),
    IsolationUnavailable("gvisor", "runsc is not installed", "install gVisor's runsc"),
    InfraError("the sandbox could not be spawned"),
    StoreUnavailable("audit log: lost the connection to postgresql://db/sandcell"),
    AuditError("the audit log is locked"),
    ModelError("the provider refused the key", status=401),
    ModelRateLimited("slow down", retry_after_s=1.0),
    ServiceProblem(429, "over the runs-per-minute quota", headers={"Retry-After": "7"}),
    ServiceProblem(404, "no run r-1 here"),
    ServiceProblem(503, "the service is draining"),
    E2BError(404, "context 'c' was not found"),
]
"""One error of each row, and carriers with statuses of each kind."""


def _id(exc: BaseException) -> str:
    return f"{type(exc).__name__}-{getattr(exc, 'status', '')}"


def test_every_row_has_a_sample() -> None:
    assert {wire.class_wire(type(e)).code for e in SAMPLES} == {
        r.code for r in wire.ERRORS.values()
    }


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_exit_code(exc: SandcellError, capsys: pytest.CaptureFixture[str]) -> None:
    row = wire.error_wire(exc)
    assert status.exit_code_for_error(exc) == row.exit_code

    def fail() -> int:
        raise exc

    assert guarded(fail) == row.exit_code
    assert str(exc) in capsys.readouterr().err


def test_a_carrier_follows_its_status() -> None:
    assert wire.error_wire(ServiceProblem(429, "q")).exit_code == status.EXIT_INFRA
    assert wire.error_wire(ServiceProblem(429, "q")).retryable
    assert wire.error_wire(ServiceProblem(403, "no")).exit_code == status.EXIT_CONFIG
    assert wire.error_wire(ServiceProblem(502, "x")).retryable
    assert wire.error_wire(E2BError(404, "x", code="not_found")).connect == "not_found"


# -- HTTP: a real service app ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    served = make_service(ServiceConfig(home=tmp_path_factory.mktemp("wire-home")))
    yield served
    served.close()


def _raising(request: Request) -> Any:
    raise SAMPLES[int(request.path_params["index"])]


@pytest.fixture(scope="module")
def http(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(service, mcp=False)
    app.add_api_route("/v1/wire-probe/{index}", _raising, methods=["GET"])
    _, key = service.tenants.add(
        "wire",
        profiles=("strict",),
        max_concurrent=1,
        runs_per_minute=10,
        cpu_seconds_per_day=10,
        max_stored_bytes=1024,
    )
    client = TestClient(app, raise_server_exceptions=False)
    client.headers["Authorization"] = f"Bearer {key}"
    yield client


def _problem_answer(http: TestClient, exc: SandcellError) -> Any:
    return http.get(f"/v1/wire-probe/{SAMPLES.index(exc)}")


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_http_problem(http: TestClient, exc: SandcellError) -> None:
    row = wire.error_wire(exc)
    answer = _problem_answer(http, exc)
    assert answer.status_code == row.http_status
    assert answer.headers["content-type"] == PROBLEM_JSON
    assert answer.json() == {
        "type": "about:blank",
        "title": wire.title(row.http_status),
        "status": row.http_status,
        "detail": wire.public_message(exc),
    }


def _expected_remote(exc: SandcellError) -> tuple[int, bool]:
    """The exit code and retry a remote caller gets: the row's, except that a failure the
    service keeps to its log reaches it as a 5xx it cannot tell from a passing one."""
    row = wire.error_wire(exc)
    if not row.public:
        return status.EXIT_INFRA, True
    return row.exit_code, row.retryable


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_client_exception_for_the_answer(http: TestClient, exc: SandcellError) -> None:
    answer = _problem_answer(http, exc)
    got = error_for(
        answer.status_code,
        answer.content,
        {k.lower(): v for k, v in answer.headers.items()},
        what="GET /v1/x",
        where="http://svc",
    )
    assert isinstance(got, SandcellError)
    got_row = wire.error_wire(got)
    assert (got_row.exit_code, got_row.retryable) == _expected_remote(exc), type(got)
    if answer.status_code == 429:
        assert isinstance(got, QuotaExceeded)
        assert got.retry_after_s == (7.0 if "retry-after" in answer.headers else None)


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_cli_remote_exception_for_the_answer(http: TestClient, exc: SandcellError) -> None:
    answer = _problem_answer(http, exc)
    response = RemoteResponse(
        answer.status_code, {k.lower(): v for k, v in answer.headers.items()}, answer.content
    )
    got = _problem(response, Target(key="k", host="svc", port=80))
    assert isinstance(got, SandcellError)
    assert status.exit_code_for_error(got) == _expected_remote(exc)[0], type(got)
    assert wire.error_wire(got).retryable == _expected_remote(exc)[1]
    client_got = error_for(
        answer.status_code, answer.content, dict(response.headers), what="x", where="y"
    )
    assert type(got) is type(client_got)


def test_the_body_limit_answers_with_the_tables_title(http: TestClient, service: Service) -> None:
    answer = http.post("/v1/runs", content=b"x" * (service.config.max_body_bytes + 1))
    assert answer.status_code == 413
    assert answer.json()["title"] == wire.title(413)


# -- E2B: a real E2B app --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2b(service: Service) -> TestClient:
    app = e2b_app(service)
    app.router.routes.append(Route("/wire-probe/{index}", _raising))
    app.router.routes.append(Route("/process.Process/Probe{index}", _raising, methods=["POST"]))
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_e2b_json_and_connect_errors(e2b: TestClient, exc: SandcellError) -> None:
    row = wire.error_wire(exc)
    index = SAMPLES.index(exc)
    answer = e2b.get(f"/wire-probe/{index}")
    rpc = e2b.post(f"/process.Process/Probe{index}", content=b"{}")
    assert answer.status_code == rpc.status_code == row.e2b_status
    message = row.e2b_message.format(str(exc)) if row.public else row.detail
    assert answer.json() == {"code": row.e2b_status, "message": message}
    assert rpc.json() == {"code": row.connect, "message": message}
    if row.public and row.e2b_status in wire.SDK_RETRIED and not isinstance(exc, E2BError):
        assert answer.headers["should-retry"] == "false"
    if isinstance(exc, SessionEnded):
        assert "was not found" in message  # what the E2B SDKs read as a sandbox that is gone


# -- MCP ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_mcp_tool_error(exc: SandcellError) -> None:
    row = wire.error_wire(exc)
    with pytest.raises(ToolError) as raised, _tool_errors("run_python"):
        raise exc
    text = str(raised.value)
    assert text == wire.mcp_message(exc)
    assert str(exc) in text
    assert f"[{row.code}; " in text
    assert ("a retry may help" in text) is row.retryable


def test_mcp_keeps_an_isolation_fix() -> None:
    exc = IsolationUnavailable("gvisor", "runsc is not installed", "install gVisor's runsc")
    assert "Fix: install gVisor's runsc" in wire.mcp_message(exc)
    assert "do not retry" in wire.mcp_message(exc)


# -- outcomes -------------------------------------------------------------------------------------


def _result(outcome: Outcome, *, exit_code: int | None = None, signal: int | None = None) -> Any:
    return RunResult(
        run_id="r",
        outcome=outcome,
        exit_code=exit_code,
        signal=signal,
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=1.0, cpu_ms=None, peak_memory_bytes=None),
        artifacts=(),
        rejected_exports=(),
        enforcement=None,
        reason="why",
    )


def test_every_outcome_has_a_row() -> None:
    assert set(wire.OUTCOMES) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_outcome_surfaces(outcome: Outcome, tmp_path: Path) -> None:
    from sandcell.artifacts.store import ArtifactStore

    row = wire.outcome_wire(outcome)
    result = _result(outcome)
    assert status.exit_code_for(result) == row.exit_code
    content = run_content(result, ArtifactStore(tmp_path), ContentLimits())
    assert content.is_error is row.mcp_is_error


def test_the_program_and_the_signal_decide_some_exit_codes() -> None:
    assert status.exit_code_for(_result(Outcome.ERROR, exit_code=3)) == 3
    assert status.exit_code_for(_result(Outcome.KILLED, signal=15)) == 128 + 15
    assert status.exit_code_for(_result(Outcome.KILLED)) == 128 + 9


def test_the_table_is_printable() -> None:
    # The docstring's table is what the rows say.
    doc = wire.__doc__ or ""
    for row in wire.ERRORS.values():
        if not row.carries_status:
            line = next(x for x in doc.splitlines() if f" {row.code} " in f" {x} ")
            cells = line.split()
            assert str(row.exit_code) in cells and str(row.http_status) in cells, line
            assert row.connect in cells and ("yes" if row.retryable else "no") in cells, line


@pytest.mark.parametrize(("outcome", "code"), [(Outcome.OK, 0), (Outcome.ERROR, 3)])
def test_the_fast_entry_exits_as_the_table(outcome: Outcome, code: int | None) -> None:
    # sandcell._entry prints a plain ok/error answer without importing the table (it must
    # start fast): its exit status must still be the row's.
    from sandcell._entry import _print_plain
    from sandcell.spec import result_to_dict

    result = _result(outcome, exit_code=code)
    body = json.dumps({"result": result_to_dict(result)}).encode()
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    assert _print_plain(answer, as_json=False) == status.exit_code_for(result)
