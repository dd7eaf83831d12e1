"""A smolagents Python executor backed by a sandcell session (``pip install
'sandcell[smolagents]'``): a ``CodeAgent`` runs its code in a sandbox instead of smolagents'
in-process interpreter.

>>> executor = SandcellPythonExecutor(Executor(), profile="analysis")   # doctest: +SKIP
>>> with CodeAgent(tools=[], model=model, executor=executor) as agent:  # doctest: +SKIP
...     agent.run("What is the 20th Fibonacci number?")

One session holds every step of an agent, so variables and imports persist between steps as in
smolagents' own interpreter; each step is a cell, checked against the profile and recorded. How
it meets smolagents' executor interface:

* ``send_tools``: the tools' source (smolagents' ``get_tools_definition_code``, less its
  preamble of base-module imports) runs in the session, so the tools run inside the sandbox
  too (a tool that needs the network or the host's files cannot work there; give the agent
  its data as the session's ``inputs``). A tool's requirements must already be importable in
  the sandbox's runtime: nothing is installed.
* ``final_answer``: wrapped in the session so that calling it writes its value as one JSON line
  after a per-executor marker on stdout and ends the cell with ``SystemExit(0)``; the executor
  takes the value from that line and leaves the line out of the logs. The value crosses as
  JSON: tuples come back as lists, numpy scalars and arrays as numbers and lists, anything else
  JSON cannot hold as its ``str``.
* ``send_variables``: each variable as JSON (a tuple arrives as a list); a value JSON cannot
  hold is refused with a ConfigError (smolagents' own serializer's sandbox half imports and
  introspects more than sandcell's profiles allow without approval).
* an error, a timeout, a memory limit or a cell the profile refuses raises smolagents'
  ``AgentError`` with the outcome, the reason and the end of stderr, which the agent shows the
  model as its observation. A session that ended (killed at its memory limit, idle, out of
  lifetime) is not reopened behind the agent's back: the step fails saying so.
"""

from __future__ import annotations

import json
import keyword
import secrets
import textwrap
from collections.abc import Sequence
from typing import Any

from smolagents.local_python_executor import (  # type: ignore[import-untyped]
    BASE_BUILTIN_MODULES,
    CodeOutput,
    PythonExecutor,
)
from smolagents.monitoring import AgentLogger, LogLevel  # type: ignore[import-untyped]
from smolagents.tools import Tool, get_tools_definition_code  # type: ignore[import-untyped]
from smolagents.utils import AgentError  # type: ignore[import-untyped]

from sandcell.adapters.common import STDERR_CHARS, Runner, SessionLike, describe
from sandcell.errors import ConfigError
from sandcell.sessions.session import SessionEnded
from sandcell.spec import InputFile, Limits, Outcome, RunResult

__all__ = ["SandcellPythonExecutor"]

_FINAL_ANSWER_WRAPPER = """
def _sandcell_final_answer(_tool):
    def _plain(value):
        # numpy scalars and arrays without importing numpy; anything else as its text.
        for name in ("item", "tolist"):
            method = getattr(value, name, None)
            if callable(method):
                return method()
        return str(value)

    def final_answer(*args, **kwargs):
        import json
        import sys

        payload = json.dumps(_tool(*args, **kwargs), default=_plain)
        sys.stdout.write("\\n" + {marker!r} + payload + "\\n")
        sys.stdout.flush()
        raise SystemExit(0)

    return final_answer


final_answer = _sandcell_final_answer(final_answer)
del _sandcell_final_answer
"""


class SandcellPythonExecutor(PythonExecutor):  # type: ignore[misc]
    """smolagents' ``PythonExecutor`` on a sandcell session of ``runner`` (an Executor or a
    Client) under ``profile``, with the session's ``limits`` (None: the profile's defaults),
    its ``inputs`` (files, read-only at ``/inputs/NAME``) and ``timeout_s`` per step (None:
    the session's wall time).

    The session opens on first use and ends with :meth:`cleanup` (which ``CodeAgent`` calls
    when used as a context manager) or :meth:`close`.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        profile: str | None = None,
        limits: Limits | None = None,
        inputs: Sequence[InputFile] = (),
        timeout_s: float | None = None,
        logger: AgentLogger | None = None,
    ) -> None:
        self.runner = runner
        self.profile = profile
        self.limits = limits
        self.inputs = tuple(inputs)
        self.timeout_s = timeout_s
        self.logger = logger or AgentLogger(level=LogLevel.INFO)
        # Not a secret from the agent's code (which may call final_answer anyway): it keeps a
        # program's own output from being taken for an answer by accident.
        self._marker = f"\x1esandcell-final-answer-{secrets.token_hex(8)}:"
        self._session: SessionLike | None = None

    @property
    def session(self) -> SessionLike:
        """The live session, opened on first use."""
        if self._session is None:
            self._session = self.runner.session(
                profile=self.profile, limits=self.limits, inputs=self.inputs
            )
        return self._session

    # -- smolagents' interface -----------------------------------------------------------------

    def send_tools(self, tools: dict[str, Tool]) -> None:
        needed = sorted(
            {
                package
                for tool in tools.values()
                for package in tool.to_dict()["requirements"]
                if package != "smolagents"
            }
        )
        if needed:
            self._check_importable(needed)
        code = get_tools_definition_code(tools)
        # smolagents starts the tools' code by importing its base modules for them, `stat`
        # among them, which sandcell's profiles do not allow: the cell would wait for an
        # approval a session cannot get. Tools import what they use (smolagents' own rule for
        # tools shared across processes), so the agent loses nothing without that preamble.
        preamble = "\n".join(f"import {module}" for module in BASE_BUILTIN_MODULES)
        code = code.removeprefix(preamble)
        if "final_answer" in tools:
            code += _FINAL_ANSWER_WRAPPER.format(marker=self._marker)
        self._setup(code, "define the agent's tools")

    def send_variables(self, variables: dict[str, Any]) -> None:
        if not variables:
            return
        # Under a name no variable takes, so a variable called `json` does not break the rest.
        lines = ["import json as _sandcell_json"]
        for name, value in variables.items():
            if not name.isidentifier() or keyword.iskeyword(name):
                raise ConfigError(f"variable name {name!r} is not a Python identifier; rename it")
            try:
                text = json.dumps(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"variable {name!r} ({type(value).__name__}) cannot cross into the sandbox "
                    "as JSON; pass plain data (str, numbers, lists, dicts), or a file as one of "
                    "the session's inputs"
                ) from None
            lines.append(f"{name} = _sandcell_json.loads({text!r})")
        lines.append("del _sandcell_json")
        self._setup("\n".join(lines) + "\n", "set the agent's variables")

    def __call__(self, code_action: str) -> CodeOutput:
        try:
            result = self.session.run(code_action, timeout_s=self.timeout_s)
        except SessionEnded as exc:
            raise AgentError(
                "The sandbox session has ended, so this step did not run and the variables "
                f"of earlier steps are gone: {exc}",
                self.logger,
            ) from None
        before, marker, after = result.stdout.partition(self._marker)
        if marker:
            logs = before.removesuffix("\n")
            line = after.split("\n", 1)[0]
            return CodeOutput(output=json.loads(line), logs=logs, is_final_answer=True)
        if result.outcome is not Outcome.OK or result.exit_code not in (0, None):
            raise AgentError(_failure(result), self.logger)
        return CodeOutput(output=_value(result), logs=result.stdout, is_final_answer=False)

    # -- lifetime --------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """End the session (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    close = cleanup

    def __enter__(self) -> SandcellPythonExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- helpers ---------------------------------------------------------------------------------

    def _setup(self, code: str, what: str) -> None:
        result = self.session.run(code, timeout_s=self.timeout_s)
        if result.outcome is not Outcome.OK:
            raise ConfigError(
                f"could not {what} in the sandcell session (profile {self.profile or 'default'}):"
                f"\n{describe(result)}\nuse a profile that allows this code, or fewer tools"
            )

    def _check_importable(self, modules: list[str]) -> None:
        probe = textwrap.dedent(
            f"""
            import importlib.util
            print(",".join(m for m in {modules!r} if importlib.util.find_spec(m) is None))
            """
        )
        result = self.session.run(probe, timeout_s=self.timeout_s)
        if result.outcome is not Outcome.OK:
            raise ConfigError(
                f"could not check the agent's tools' requirements ({', '.join(modules)}) in the "
                f"sandcell session:\n{describe(result)}"
            )
        missing = result.stdout.strip()
        if missing:
            raise ConfigError(
                f"the agent's tools need {missing}, which the sandbox's runtime does not have; "
                "sandcell installs nothing at run time: add it to the runtime (see `sandcell "
                "packages`), or leave out the tools that need it"
            )


def _value(result: RunResult) -> Any:
    """The step's last expression's value, as text (as smolagents' remote executors give it)."""
    for output in reversed(result.outputs):
        if output.kind == "value" and "text/plain" in output.data:
            return output.data["text/plain"]
    return None


def _failure(result: RunResult) -> str:
    stderr = result.stderr
    if len(stderr) > STDERR_CHARS:
        stderr = stderr[-STDERR_CHARS:]
    lines = [result.stdout.rstrip(), f"Code execution failed: {result.outcome.value}"]
    if result.reason:
        lines.append(result.reason)
    if stderr:
        lines.append(stderr.rstrip())
    return "\n".join(line for line in lines if line)
