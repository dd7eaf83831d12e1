"""The one-line summary ``sandcell run`` prints of what a run did outside its sandbox
(sandcell.cli.outside_lines); the rows of ``audit show`` are tested through the CLI."""

from __future__ import annotations

from sandcell.cli.outside_lines import connection_rows, outside_summary, tool_call_rows


def _connection(allowed: bool) -> dict[str, object]:
    return {"seq": 1, "method": "CONNECT", "host": "h", "port": 443, "allowed": allowed}


def test_nothing_outside_is_no_line() -> None:
    assert outside_summary(None, None) is None
    assert outside_summary({"connections": []}, {"calls": []}) is None
    # Listing the tools is not a call of one.
    assert outside_summary(None, {"calls": [{"operation": "list", "decision": "allowed"}]}) is None
    assert connection_rows(None) == [] and tool_call_rows(None) == []


def test_counts_by_outcome() -> None:
    network = {"connections": [_connection(True), _connection(False), _connection(False)]}
    tools = {
        "calls": [
            {"operation": "call", "decision": "allowed"},
            {"operation": "call", "decision": "denied"},
            {"operation": "call", "decision": "allowed"},
        ]
    }
    assert (
        outside_summary(network, tools)
        == "3 connections (2 refused); 3 tool calls (2 allowed, 1 denied)"
    )
    assert outside_summary({"connections": [_connection(True)]}, None) == "1 connection (0 refused)"


def test_malformed_sections_are_shown_not_raised() -> None:
    # A record is data from a file: odd shapes render as what they are.
    assert connection_rows({"connections": "nope"})[0].startswith("connections (profile ?): 0")
    rows = tool_call_rows({"calls": [{"duration_s": "x", "operation": None, "seq": None}, 7]})
    assert len(rows) == 2 and "? s" in rows[1] and "None None" in rows[1]
    (_, row) = connection_rows({"connections": [{"method": None, "seq": None}]})
    assert row.startswith("  None None    ?:? refused")


def test_refused_attempts_past_the_cap_are_counted_and_said() -> None:
    network = {
        "profile": "p",
        "connections": [_connection(True), _connection(False)],
        "refused_dropped": 40,
    }
    assert outside_summary(network, None) == "42 connections (41 refused, 40 not listed)"
    rows = connection_rows(network)
    assert rows[0].startswith("connections (profile p): 42 attempts, 41 refused")
    assert rows[-1] == (
        "  ... and 40 more refused attempts past the cap on refused records, not listed"
    )
    # A record written before allowed attempts were always kept says `unrecorded`.
    old = connection_rows({"connections": [], "unrecorded": 1})
    assert old[-1].endswith("1 more refused attempt past the cap on refused records, not listed")
