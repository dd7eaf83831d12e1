"""The E2B layer's pure parts: paths, Connect framing, the interpreter's messages."""

from __future__ import annotations

import json

import pytest

from sandcell.e2b.connect_rpc import STREAM_TYPE, end_of_stream, envelope, read_message
from sandcell.e2b.errors import E2BError
from sandcell.e2b.fs_cells import MARK, reply_of
from sandcell.e2b.paths import e2b_path, workspace_relative
from sandcell.e2b.results import HeldReport, messages, split_error
from sandcell.spec import DisplayOutput, Outcome, RunResult, Usage


def result(
    outcome: Outcome, *, reason: str = "", stdout: str = "", stderr: str = "", **kw: object
) -> RunResult:
    return RunResult(
        run_id="r",
        outcome=outcome,
        exit_code=0 if outcome is Outcome.OK else 1,
        signal=None,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=1.0, cpu_ms=None, peak_memory_bytes=None),
        artifacts=(),
        rejected_exports=(),
        enforcement=None,
        reason=reason,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("path", "relative"),
    [
        ("/home/user", ""),
        ("/home/user/a/b.txt", "a/b.txt"),
        ("a/./b.txt", "a/b.txt"),
        ("/sandbox/x", "x"),
        ("x", "x"),
    ],
)
def test_workspace_paths(path: str, relative: str) -> None:
    assert workspace_relative(path, workspace="/sandbox") == relative


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "/home/user/../../etc", "/home/userx/a", "", "a\x00b", "/"]
)
def test_paths_outside_the_workspace_are_refused(path: str) -> None:
    with pytest.raises(E2BError) as info:
        workspace_relative(path, workspace="/sandbox")
    assert info.value.status == 400


def test_e2b_path() -> None:
    assert e2b_path("") == "/home/user"
    assert e2b_path("a/b") == "/home/user/a/b"


def test_connect_framing() -> None:
    body = envelope({"process": {"cmd": "ls"}})
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    assert read_message(body, STREAM_TYPE) == {"process": {"cmd": "ls"}}
    assert read_message(b'{"path": "/x"}', "application/json") == {"path": "/x"}
    end = end_of_stream(E2BError(403, "no"))
    assert end[0] == 2
    assert json.loads(end[5:]) == {"error": {"code": "permission_denied", "message": "no"}}
    assert json.loads(end_of_stream()[5:]) == {}
    with pytest.raises(E2BError):
        read_message(b"\x00\x00\x00\x00\x09{}", STREAM_TYPE)
    with pytest.raises(E2BError):
        read_message(b"[1]", "application/json")


def test_a_raised_exception_becomes_the_error_not_output() -> None:
    report = "Traceback (most recent call last):\n  File \"<cell 1>\", line 1\nKeyError: 'k'\n"
    r = result(Outcome.ERROR, reason="the cell raised KeyError", stderr="warn\n" + report)
    stderr, error = split_error(r)
    assert stderr == "warn\n"
    assert error == {"type": "error", "name": "KeyError", "value": "'k'", "traceback": report}


def test_limits_and_denials_are_errors_saying_why() -> None:
    _, timeout = split_error(result(Outcome.TIMEOUT, reason="wall-time limit of 30 s reached"))
    assert timeout is not None and timeout["name"] == "TimeoutError"
    denied = result(
        Outcome.DENIED,
        reason="denied by profile 'strict': py.syntax",
        policy={"verdict": "deny", "findings": [{"rule_id": "py.syntax"}]},
    )
    _, syntax = split_error(denied)
    assert syntax is not None and syntax["name"] == "SyntaxError"


def test_held_report_drops_only_the_report() -> None:
    held = HeldReport()
    assert held.feed("stdout", "out\n") == "out\n"
    assert held.feed("stderr", "before\nTraceback (most recent call last):\n") == "before\n"
    assert held.feed("stderr", "  File x\nValueError: v\n") == ""
    assert held.rest("Traceback (most recent call last):\n  File x\nValueError: v\n") == ""
    assert held.rest("something else") == held.held


def test_messages_of_a_value_and_a_figure() -> None:
    png = b"\x89PNG\r\n\x1a\nrest"
    from sandcell.spec import Artifact

    r = result(
        Outcome.OK,
        stdout="a\nb\n",
        outputs=(
            DisplayOutput(kind="value", data={"text/plain": "2"}),
            DisplayOutput(
                kind="figure",
                data={"text/plain": "<Figure>"},
                artifacts=(
                    Artifact(path="display/0001.png", sha256="s", size=12, media_type="image/png"),
                ),
            ),
        ),
    )
    out = list(messages(r, execution_count=3, streamed=None, read=lambda sha: png))
    assert [m["type"] for m in out] == [
        "stdout",
        "stdout",
        "result",
        "result",
        "number_of_executions",
        "end_of_execution",
    ]
    assert out[2]["text"] == "2" and out[2]["is_main_result"] is True
    assert out[3]["is_main_result"] is False and out[3]["png"].startswith("iVBOR")


def test_file_operation_replies() -> None:
    ok = result(Outcome.OK, stdout=f"noise\n{MARK}" + '{"entries": []}\n')
    assert reply_of(ok, "/home/user") == {"entries": []}
    for error, status in (
        ("missing", 404),
        ("exists", 409),
        ("notdir", 400),
        ("denied", 403),
        ("toobig", 413),
    ):
        bad = result(Outcome.OK, stdout=f"{MARK}" + json.dumps({"error": error}) + "\n")
        with pytest.raises(E2BError) as info:
            reply_of(bad, "/home/user/x")
        assert info.value.status == status
    with pytest.raises(E2BError) as info:
        reply_of(result(Outcome.DENIED, reason="denied by profile"), "/x")
    assert info.value.status == 403
