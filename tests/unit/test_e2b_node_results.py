"""A JavaScript or TypeScript cell's error as the E2B interpreter reports it (pure)."""

from __future__ import annotations

import pytest
from tests.unit.test_e2b_wire import result

from sandcell.e2b.node_results import node_report_at, split_node_error
from sandcell.e2b.results import HeldReport
from sandcell.spec import Outcome


@pytest.mark.parametrize(
    ("name", "stderr", "kept", "value", "traceback"),
    [
        (
            "TypeError",
            "warned\nTypeError: bad thing\n    at <cell 4>:1:7\n",
            "warned\n",
            "bad thing",
            "TypeError: bad thing\n    at <cell 4>:1:7\n",
        ),
        (
            "SyntaxError",
            "<cell 3>:1\nlet q = ;\n^\n\nSyntaxError: Expression expected\n",
            "",
            "Expression expected",
            "<cell 3>:1\nlet q = ;\n^\n\nSyntaxError: Expression expected\n",
        ),
        ("number", "Uncaught 5\n", "", "5", "Uncaught 5\n"),
    ],
)
def test_the_report_is_the_error_and_the_rest_output(
    name: str, stderr: str, kept: str, value: str, traceback: str
) -> None:
    rest, error = split_node_error(
        result(Outcome.ERROR, reason=f"the cell raised {name}", stderr=stderr)
    )
    assert rest == kept
    assert error == {"type": "error", "name": name, "value": value, "traceback": traceback}


def test_limits_are_reported_as_python_cells_are() -> None:
    rest, error = split_node_error(
        result(Outcome.TIMEOUT, reason="wall-time limit of 3 s reached", stderr="Interrupted\n")
    )
    assert rest == "Interrupted\n"
    assert error is not None and error["name"] == "TimeoutError"


def test_live_stderr_holds_the_report_back() -> None:
    held = HeldReport(node_report_at)
    assert held.feed("stderr", "first\n") == "first\n"
    assert held.feed("stderr", "late\nRangeError: too far\n    at <cell 1>:2:3\n") == "late\n"
    assert held.feed("stdout", "out\n") == "out\n"
    assert held.rest("RangeError: too far\n    at <cell 1>:2:3\n") == ""
