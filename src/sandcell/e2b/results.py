"""A cell's result as the code interpreter's stream: the NDJSON messages ``run_code`` reads.

Pure but for reading image artifacts from the store: the cell's streams (unless they were sent
live), its rich outputs as results in the order the cell showed them (the last expression's
value or table is the main result; what ``display()`` showed is not; a figure is a PNG and an
SVG, and its chart's data, validated on the way out of the sandbox, is the result's
``chart``), its error (a raised exception with name, value and traceback; a policy denial,
a needed approval or a limit as an error saying why), and the execution count.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

from sandcell.display.chart import CHART_TYPE
from sandcell.spec import DisplayOutput, Outcome, RunResult

__all__ = ["HeldReport", "error_message", "messages", "ndjson", "split_error", "stream_message"]

_TRACEBACK = "Traceback (most recent call last):\n"
_LIMIT_NAMES = {
    Outcome.TIMEOUT: "TimeoutError",
    Outcome.MEMORY_LIMIT: "MemoryError",
    Outcome.OUTPUT_LIMIT: "OutputLimitExceeded",
    Outcome.KILLED: "Killed",
    Outcome.DENIED: "PolicyDenied",
    Outcome.AWAITING_APPROVAL: "ApprovalRequired",
}


def ndjson(message: dict[str, Any]) -> bytes:
    # One object per line and never a blank line: the SDK parses every line it reads.
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def stream_message(stream: str, text: str) -> dict[str, Any]:
    return {"type": stream, "text": text, "timestamp": _now()}


def error_message(name: str, value: str, traceback: str = "") -> dict[str, Any]:
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def split_error(result: RunResult) -> tuple[str, dict[str, Any] | None]:
    """The cell's stderr without its exception report, and the error message (None: none)."""
    stderr = result.stderr
    if result.outcome is Outcome.OK:
        return stderr, None
    if result.outcome is not Outcome.ERROR or not result.reason.startswith("the cell raised "):
        name = _LIMIT_NAMES.get(result.outcome, "SandboxError")
        if result.outcome is Outcome.DENIED and _only_syntax(result):
            # The gate refuses code that does not parse before it runs: to the client, the
            # SyntaxError the interpreter would have raised.
            name = "SyntaxError"
        if result.outcome is Outcome.ERROR:
            name = "SystemExit" if "exit with status" in result.reason else "SandboxError"
        return stderr, error_message(name, result.reason)
    name = result.reason.removeprefix("the cell raised ").strip()
    start = stderr.rfind(_TRACEBACK)
    if start < 0:
        # A syntax error is reported without a traceback: from its location to its name.
        lines = stderr.splitlines(keepends=True)
        last = max(
            (i for i, ln in enumerate(lines) if ln.startswith((f"{name}:", name))), default=-1
        )
        first = max(
            (i for i, ln in enumerate(lines[: last + 1]) if ln.startswith('  File "')),
            default=last,
        )
        start = sum(len(ln) for ln in lines[: max(first, 0)])
    report = stderr[start:]
    tail = report.rstrip("\n").rsplit("\n", 1)[-1]
    value = tail.removeprefix(f"{name}:").strip() if tail.startswith(name) else tail
    return stderr[:start], error_message(name, value, report)


def _only_syntax(result: RunResult) -> bool:
    findings = (result.policy or {}).get("findings")
    if not isinstance(findings, list | tuple) or not findings:
        return False
    return all(isinstance(f, dict) and f.get("rule_id") == "py.syntax" for f in findings)


def _traceback_at(text: str) -> int:
    return text.find(_TRACEBACK)


class HeldReport:
    """Live stderr minus the cell's exception report, which the client gets as the error, not
    as output: stderr from a report's first line on (``report_at``: where one starts in a
    chunk, -1 for none; a Python traceback's by default) is held until the cell ends."""

    def __init__(self, report_at: Callable[[str], int] = _traceback_at) -> None:
        self.held = ""
        self._report_at = report_at

    def feed(self, stream: str, text: str) -> str:
        """What of ``text`` to send now."""
        if stream != "stderr":
            return text
        if self.held:
            self.held += text
            return ""
        at = self._report_at(text)
        if at < 0:
            return text
        self.held = text[at:]
        return text[:at]

    def rest(self, report: str) -> str:
        """What was held and is not the report (a traceback the cell printed itself)."""
        if report and self.held.endswith(report):
            return self.held[: -len(report)]
        return self.held


def _result(output: DisplayOutput, read: Callable[[str], bytes]) -> dict[str, Any]:
    data = output.data
    main = output.kind != "figure" and not output.displayed
    out: dict[str, Any] = {"type": "result", "is_main_result": main}
    if "text/plain" in data:
        out["text"] = data["text/plain"]
    if "text/html" in data:
        out["html"] = data["text/html"]
    if "application/json" in data:
        parsed = json.loads(data["application/json"])
        out["data" if output.kind == "table" and isinstance(parsed, dict) else "json"] = parsed
    if CHART_TYPE in data:
        out["chart"] = json.loads(data[CHART_TYPE])
    for artifact in output.artifacts:
        blob = read(artifact.sha256)
        if artifact.media_type == "image/png":
            out["png"] = base64.b64encode(blob).decode()
        elif artifact.media_type == "image/svg+xml":
            out["svg"] = blob.decode("utf-8", errors="replace")
    if output.kind == "figure" and "text" not in out:
        out["text"] = "<Figure>"
    return out


def _lines(stream: str, text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines(keepends=True):
        yield stream_message(stream, line)


def messages(
    result: RunResult,
    *,
    execution_count: int,
    streamed: HeldReport | None,
    read: Callable[[str], bytes],
    split: Callable[[RunResult], tuple[str, dict[str, Any] | None]] | None = None,
) -> Iterator[dict[str, Any]]:
    """The messages after a cell ended (``streamed``: its output was already sent live, but
    for what this holds back; ``split``: the cell's language's :func:`split_error`)."""
    stderr, error = (split or split_error)(result)
    if streamed is None:
        yield from _lines("stdout", result.stdout)
        yield from _lines("stderr", stderr)
    else:
        report = str(error.get("traceback", "")) if error is not None else ""
        yield from _lines("stderr", streamed.rest(report))
    for output in result.outputs:
        yield _result(output, read)
    if error is not None:
        yield error
    yield {"type": "number_of_executions", "execution_count": execution_count}
    yield {"type": "end_of_execution"}
