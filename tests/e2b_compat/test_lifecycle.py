"""Sandbox lifecycle, errors, quotas, tenant isolation and the record, through the official SDK."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import (
    AuthenticationException,
    InvalidArgumentException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    TimeoutException,
)
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService
from tests.service.server import add_tenant


def test_create_connect_info_list_set_timeout_kill(e2b_service: E2BService) -> None:
    # Environment variables only, as in the issue: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY.
    sbx = Sandbox.create(metadata={"job": "lifecycle"}, timeout=120)
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"job": "lifecycle"}
        assert info.template_id == "code-interpreter-v1"
        first_end = info.end_at
        sbx.set_timeout(600)
        assert sbx.get_info().end_at > first_end
        listed = Sandbox.list(query=SandboxQuery(metadata={"job": "lifecycle"})).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(metadata={"job": "other"})).next_items() == []
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.run_code("21 * 2").text == "42"
        assert sbx.is_running()
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_the_timeout_ends_the_sandbox(e2b_service: E2BService) -> None:
    sbx = Sandbox.create(timeout=1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            Sandbox.get_info(sbx.sandbox_id)
        except SandboxNotFoundException:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the sandbox outlived its timeout by a minute")
    assert not sbx.is_running()


def test_unknown_sandbox_is_not_found(e2b_service: E2BService) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("0" * 32)
    assert Sandbox.kill("0" * 32) is False


def test_a_bad_key_is_an_authentication_error(e2b_service: E2BService) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="sc_not-a-key").next_items()


def test_a_profile_of_the_tenant_is_a_template(e2b_service: E2BService) -> None:
    with Sandbox.create(template="unchecked") as sbx:
        assert sbx.get_info().template_id == "unchecked"
        # unchecked lets through what strict holds for approval.
        ex = sbx.run_code("import socket\nisinstance(socket.gethostname(), str)")
        assert ex.error is None and ex.text == "True"


def test_tenant_b_cannot_reach_tenant_a_sandbox(e2b_service: E2BService) -> None:
    bob = {"api_key": e2b_service.bob}
    with Sandbox.create() as sbx:
        sbx.files.write("/home/user/secret.txt", "alice's")
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sbx.sandbox_id, **bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sbx.sandbox_id, **bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.set_timeout(sbx.sandbox_id, 5, **bob)
        assert Sandbox.kill(sbx.sandbox_id, **bob) is False
        assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**bob).next_items()]
        # Sandbox traffic without the sandbox's token: refused, whoever sends it.
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        for token in (None, e2b_service.bob, "0" * 48):
            sent = headers if token is None else {**headers, "X-Access-Token": token}
            read = httpx.get(
                f"{e2b_service.url}/files", params={"path": "/home/user/secret.txt"}, headers=sent
            )
            assert read.status_code == 401, read.text
            run = httpx.post(
                f"{e2b_service.url}/execute",
                json={"code": "open('secret.txt').read()"},
                headers={**sent, "E2b-Sandbox-Port": "49999"},
            )
            assert run.status_code == 401, run.text
            assert "alice's" not in read.text + run.text
        # Alice's sandbox is untouched.
        assert sbx.files.read("/home/user/secret.txt") == "alice's"


def test_over_quota_is_rate_limited(e2b_service: E2BService) -> None:
    key = add_tenant(e2b_service.proc.home, "carol", max_concurrent=1, runs_per_minute=4)
    with Sandbox.create(api_key=key) as sbx:
        with pytest.raises(RateLimitException, match="max_concurrent"):
            Sandbox.create(api_key=key)
        # create (1) and its setup cell (2) count; two commands more reach the limit of 4.
        sbx.commands.run("true")
        sbx.commands.run("true")
        with pytest.raises(RateLimitException, match="runs_per_minute"):
            sbx.commands.run("true")


def test_every_cell_and_command_is_in_the_record(e2b_service: E2BService) -> None:
    with Sandbox.create() as sbx:
        sbx.run_code("x = 1")
        sbx.commands.run("echo recorded")
        sbx.files.write("/home/user/r.txt", "r")
        sandbox_id = sbx.sandbox_id
    with e2b_service.proc.client(e2b_service.alice) as client:
        records = client.get("/v1/audit", params={"limit": 100}).json()
        mine = [r for r in records if r["session_id"] == sandbox_id]
        # The setup cell, the code cell, the command's start and end, and the write.
        assert len(mine) == 5, mine
        assert sorted(r["language"] for r in mine) == ["bash", "bash", "python", "python", "python"]
        bash = [
            client.get(f"/v1/audit/{r['run_id']}").json()["record"]
            for r in mine
            if r["language"] == "bash"
        ]
        assert {(r["code"], r["outcome"]) for r in bash} == {("echo recorded", "ok")}
        end = next(r for r in bash if r["reason"].startswith("the background process"))
        assert (end["exit_code"], end["stdout"]) == (0, "recorded\n")


def test_unserved_calls_say_why(e2b_service: E2BService) -> None:
    with Sandbox.create() as sbx:
        with pytest.raises(SandboxException, match="network rules come from") as refused:
            sbx.update_network({"allow_out": ["example.com"]})
        assert not isinstance(refused.value, SandboxNotFoundException)
        # The sandbox is still there and working.
        assert sbx.run_code("1 + 1").text == "2"


def test_calls_to_a_killed_sandbox_fail(e2b_service: E2BService) -> None:
    sbx = Sandbox.create()
    sbx.kill()
    with pytest.raises(SandboxException):
        sbx.run_code("1")
    with pytest.raises(SandboxException):
        sbx.files.read("/home/user/x.txt")
    with pytest.raises(SandboxException):
        sbx.commands.run("true")


def test_bad_environment_names_are_refused(e2b_service: E2BService) -> None:
    with pytest.raises(SandboxException, match="envVars"):
        Sandbox.create(envs={"A=B": "x"})
    with Sandbox.create() as sbx:
        with pytest.raises(InvalidArgumentException, match=r"process\.envs"):
            sbx.commands.run("true", envs={"bad name": "x"})
        with pytest.raises(SandboxException, match="env_vars"):
            sbx.run_code("1", envs={"1X": "y"})


def test_output_arrives_while_the_command_runs(e2b_service: E2BService) -> None:
    # The callback kills the sandbox on the first line: only output sent live can do that
    # before the command (which would otherwise go on to print "after") ends.
    sbx = Sandbox.create()
    seen: list[str] = []

    def on_stdout(line: str) -> None:
        seen.append(line)
        if "ready" in line:
            assert Sandbox.kill(sbx.sandbox_id) is True

    with pytest.raises(SandboxException):
        sbx.commands.run("echo ready; sleep 20; echo after", on_stdout=on_stdout)
    assert "ready" in "".join(seen)
    assert "after" not in "".join(seen)
    assert not sbx.is_running()


def test_code_output_arrives_while_the_cell_runs(e2b_service: E2BService) -> None:
    sbx = Sandbox.create()
    seen: list[str] = []

    def on_stdout(message: object) -> None:
        seen.append(str(getattr(message, "line", "")))
        if "ready" in seen[-1]:
            assert Sandbox.kill(sbx.sandbox_id) is True

    # The sandbox killed under it, run_code raises as E2B's does (TimeoutException).
    with pytest.raises(TimeoutException, match="killed while the request was in progress"):
        sbx.run_code(
            "import time\nprint('ready', flush=True)\ntime.sleep(20)\nprint('after')",
            on_stdout=on_stdout,
        )
    assert "after" not in "".join(seen)
    assert not sbx.is_running()


def test_list_pages(e2b_service: E2BService) -> None:
    made = [Sandbox.create(metadata={"job": "pages"}) for _ in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"job": "pages"}), limit=2)
        pages = []
        while paginator.has_next:
            pages.append([s.sandbox_id for s in paginator.next_items()])
        assert [len(p) for p in pages] == [2, 1]
        assert sorted(i for page in pages for i in page) == sorted(s.sandbox_id for s in made)
    finally:
        for sbx in made:
            sbx.kill()
