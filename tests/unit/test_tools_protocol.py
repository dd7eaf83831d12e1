"""The gateway's framing and request checks, argument schemas, approval and call counters."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from sandcell.tools.approval import ApprovalDecision, ApprovalRequest, ask
from sandcell.tools.counters import CallCounter
from sandcell.tools.definitions import ToolLimits
from sandcell.tools.protocol import ProtocolError, encode, parse_request, read_frame, write_frame
from sandcell.tools.schema import argument_problem, schema_problem

SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "maximum": 100}},
    "required": ["query"],
    "additionalProperties": False,
}


def test_a_call_request_is_read() -> None:
    request = parse_request(b'{"op":"call","tool":"t.a","args":{"q":1}}')
    assert (request.op, request.tool, request.args) == ("call", "t.a", {"q": 1})
    assert parse_request(b'{"op":"list"}').op == "list"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{", "not UTF-8 JSON"),
        (b"[1]", "JSON object"),
        (b'{"op":"delete"}', "op must be"),
        (b'{"op":"call","tool":"t.a","args":{},"approved":true}', "'approved'"),
        (b'{"op":"call","tool":"t.a","approver":"root"}', "'approver'"),
        (b'{"op":"list","tool":"x"}', "'tool'"),
        (b'{"op":"call","tool":""}', "tool must be"),
        (b'{"op":"call","tool":"t.a","args":[1]}', "args must be"),
        (b"[" * 100000 + b"]" * 100000, "not UTF-8 JSON"),
    ],
)
def test_bad_requests_are_refused(body: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        parse_request(body)


def test_frames_round_trip_and_oversized_or_truncated_ones_are_refused() -> None:
    a, b = socket.socketpair()
    with a, b:
        write_frame(a, encode({"op": "list"}))
        assert read_frame(b, 100) == b'{"op":"list"}'
        a.sendall(struct.pack(">I", 1 << 30))
        with pytest.raises(ProtocolError, match="above the limit"):
            read_frame(b, 1024)
        a.sendall(struct.pack(">I", 10) + b"abc")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ProtocolError, match="closed in the middle"):
            read_frame(b, 1024)


def test_arguments_are_checked_against_the_schema() -> None:
    assert schema_problem(SCHEMA) is None
    assert argument_problem(SCHEMA, {"query": "refund", "limit": 5}) is None
    assert "limit" in (argument_problem(SCHEMA, {"query": "r", "limit": "many"}) or "")
    assert "required" in (argument_problem(SCHEMA, {"limit": 1}) or "")
    assert "extra" in (argument_problem(SCHEMA, {"query": "r", "extra": 1}) or "").lower() or (
        "additional" in (argument_problem(SCHEMA, {"query": "r", "extra": 1}) or "").lower()
    )
    assert schema_problem({"type": 5}) is not None


def test_a_remote_ref_is_never_fetched() -> None:
    schema = {"$ref": "http://127.0.0.1:9/never.json"}
    problem = argument_problem(schema, {"a": 1})
    assert problem is not None
    assert "cannot be checked" in problem


REQ = ApprovalRequest.for_call(profile="p", tool="t.create", args={"a": 1})


def test_approval_without_an_approver_is_refused_clearly() -> None:
    outcome = ask(None, REQ, 1.0)
    assert outcome.decision is None
    assert "nobody can approve" in outcome.reason


def test_approval_outcomes() -> None:
    yes = ask(lambda r: ApprovalDecision(approved=True, approver="ann"), REQ, 5.0)
    assert yes.decision is not None and yes.decision.approved and yes.reason == "ok"
    no = ask(lambda r: ApprovalDecision(approved=False, approver="bob"), REQ, 5.0)
    assert no.decision is not None and not no.decision.approved
    assert "denied by bob" in no.reason
    assert "nobody can approve" in ask(lambda r: None, REQ, 5.0).reason

    def broken(r: ApprovalRequest) -> ApprovalDecision:
        raise RuntimeError("boom")

    failed = ask(broken, REQ, 5.0)
    assert failed.decision is None and "approver failed" in failed.reason


def test_an_approver_that_never_answers_is_cut_off_by_the_deadline() -> None:
    release = threading.Event()

    def slow(r: ApprovalRequest) -> ApprovalDecision:
        release.wait(30)
        return ApprovalDecision(approved=True, approver="late")

    try:
        outcome = ask(slow, REQ, 0.2)
    finally:
        release.set()
    assert outcome.decision is None
    assert "no approval within" in outcome.reason


def test_call_counter_refuses_past_the_rate_and_the_total() -> None:
    now = [1000.0]
    counter = CallCounter(ToolLimits(rate_per_minute=2, max_calls=3), clock=lambda: now[0])
    assert counter.admit() is None
    assert counter.admit() is None
    assert "in a minute" in (counter.admit() or "")
    now[0] += 61
    assert counter.admit() is None
    now[0] += 61
    assert "its 3 calls" in (counter.admit() or "")
    assert time.monotonic() > 0
