"""A JavaScript or TypeScript cell's error as the code interpreter reports one.

The Node kernel (``_kernel.mjs``) ends a failed cell with the error's name in the result's
reason and its report last on stderr: the stack (``TypeError: bad\\n    at <cell 4>:1:7``), a
syntax error's location before it (``<cell 3>:1``, the line, a caret, a blank line), or
``Uncaught 5`` for a thrown value that is no error. The client gets that report as the error
(``name``, ``value``: its message, ``traceback``: the whole report), not as output.
"""

from __future__ import annotations

import re
from typing import Any

from sandcell.e2b.results import error_message, split_error
from sandcell.spec import Outcome, RunResult

__all__ = ["node_report_at", "split_node_error"]

_RAISED = "the cell raised "
_REPORT = re.compile(
    r"^(?:<cell \d+>:\d+$|Uncaught |[A-Za-z_$][\w$]*(?:: [^\n]*)?\n    at )", re.MULTILINE
)
_LOCATION = re.compile(r"^<cell \d+>:\d+$")


def node_report_at(text: str) -> int:
    """Where an error report starts in a chunk of live stderr (-1: none). Output of the cell's
    own that looks like one is held too, and sent when the cell ends without that error."""
    found = _REPORT.search(text)
    return found.start() if found is not None else -1


def split_node_error(result: RunResult) -> tuple[str, dict[str, Any] | None]:
    """The cell's stderr without its error report, and the error message (None: none)."""
    if result.outcome is not Outcome.ERROR or not result.reason.startswith(_RAISED):
        return split_error(result)
    name = result.reason.removeprefix(_RAISED).strip()
    stderr = result.stderr
    lines = stderr.splitlines(keepends=True)
    heads = [
        i
        for i, line in enumerate(lines)
        if line.startswith((f"{name}:", "Uncaught ")) or line.rstrip("\n") == name
    ]
    if not heads:
        return stderr, error_message(name, "", "")
    head = heads[-1]
    first = head
    # A syntax error's location, its line and caret come before its name.
    for i in range(head - 1, max(head - 5, -1), -1):
        if _LOCATION.match(lines[i].rstrip("\n")):
            first = i
            break
    start = sum(len(line) for line in lines[:first])
    title = lines[head].rstrip("\n")
    value = (
        title.removeprefix("Uncaught ")
        if title.startswith("Uncaught ")
        else title.removeprefix(name).removeprefix(":").strip()
    )
    return stderr[:start], error_message(name, value, stderr[start:])
