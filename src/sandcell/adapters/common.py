"""What every adapter shares: the runner it wraps, the one tool it offers, the text it returns.

A runner is anything with the executor's ``run`` and ``session`` API:
:class:`sandcell.Executor` in this process or :class:`sandcell.client.Client` against the
service. The tool's answer is text for a model: the outcome first, then what the program printed
(bounded, the end kept, where errors are), the last expression's value, the files it exported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sandcell.sessions.session import SessionEnd
from sandcell.spec import InputFile, Limits, Outcome, RunRequest, RunResult

ToolLanguage = Literal["python", "bash", "javascript", "typescript"]
"""The languages the tool offers (the profile decides which of them run)."""

TOOL_NAME = "run_code"
TOOL_DESCRIPTION = (
    "Run a short Python, bash, JavaScript or TypeScript program in a fresh, isolated sandbox "
    "(no network, a private working directory, hard time and memory limits) and return what "
    "happened: the outcome, stdout, the end of stderr, the last expression's value and any "
    "exported files. Print what you need to see; nothing is kept between calls."
)
CODE_DESCRIPTION = "the program's full source text"
LANGUAGE_DESCRIPTION = (
    "the program's language: python (default), bash, or javascript or typescript (Node.js 22)"
)

STDOUT_CHARS = 4000
STDERR_CHARS = 2000


class SessionLike(Protocol):
    """A live session: :class:`sandcell.sessions.Session` or
    :class:`sandcell.client.RemoteSession`."""

    def run(
        self, code: str, *, timeout_s: float | None = None, exports: Sequence[str] = ()
    ) -> RunResult: ...

    def close(self, *, exports: Sequence[str] = ()) -> SessionEnd: ...


class Runner(Protocol):
    """What an adapter wraps: :class:`sandcell.Executor` or :class:`sandcell.client.Client`."""

    def run(self, request: RunRequest, *, profile: str | None = None) -> RunResult: ...

    def session(
        self,
        *,
        profile: str | None = None,
        limits: Limits | None = None,
        inputs: Sequence[InputFile] = (),
    ) -> SessionLike: ...


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    # The end is kept: a traceback's last lines say what went wrong.
    return f"[... {len(text) - limit} earlier characters not shown]\n{text[-limit:]}"


def describe(result: RunResult) -> str:
    """The result as compact text for a model: outcome and reason, stdout, the end of stderr,
    the last value, artifacts and refused exports. Sections with nothing in them are left out."""
    head = f"outcome: {result.outcome.value}"
    if result.exit_code is not None and result.outcome is not Outcome.OK:
        head += f" (exit status {result.exit_code})"
    lines = [head]
    if result.reason and result.outcome is not Outcome.OK:
        lines.append(f"reason: {result.reason}")
    if result.stdout:
        cut = " (cut at the output limit)" if result.stdout_truncated else ""
        lines.append(f"stdout{cut}:\n{_tail(result.stdout, STDOUT_CHARS).rstrip()}")
    if result.stderr:
        lines.append(f"stderr:\n{_tail(result.stderr, STDERR_CHARS).rstrip()}")
    for output in result.outputs:
        text = output.data.get("text/plain")
        if output.kind == "value" and text is not None:
            lines.append(f"value: {_tail(text, STDERR_CHARS)}")
        elif output.kind == "figure":
            lines.append(f"figure: {', '.join(a.path for a in output.artifacts) or 'shown'}")
    if result.artifacts:
        lines.append("artifacts:")
        lines += [
            f"- {a.path} ({a.size} bytes, {a.media_type}, sha256 {a.sha256[:16]})"
            for a in result.artifacts
        ]
    if result.rejected_exports:
        lines.append("exports refused:")
        lines += [f"- {r.path}: {r.reason}" for r in result.rejected_exports]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class CodeTool:
    """The one tool every adapter offers, framework-free: run ``code`` in ``language`` on the
    runner under ``profile``, each call in a fresh sandbox, and describe the result.

    ``exports`` are the globs of files each run exports (their names and hashes are in the
    text; the bytes are in the runner's artifact store); ``limits`` the runs' limits (None: the
    profile's defaults). A request the profile refuses outright (a limit above its ceiling)
    raises ConfigError; a denied or failing program is a result, described like any other.
    ``display`` returns a Python program's last expression's value (and its figures), as a
    notebook does.
    """

    runner: Runner
    profile: str | None = None
    limits: Limits | None = None
    exports: tuple[str, ...] = ()
    display: bool = False

    def result(self, code: str, language: ToolLanguage = "python") -> RunResult:
        """The run's result; an unknown language is a ConfigError (from RunRequest)."""
        request = RunRequest(
            code=code,
            language=language,
            limits=self.limits,
            exports=self.exports,
            display=self.display and language == "python",
        )
        return self.runner.run(request, profile=self.profile)

    def __call__(self, code: str, language: ToolLanguage = "python") -> str:
        return describe(self.result(code, language))

    async def acall(self, code: str, language: ToolLanguage = "python") -> str:
        # Both runners supervise a run on a worker thread for asyncio; so does this.
        return await asyncio.to_thread(self, code, language)
