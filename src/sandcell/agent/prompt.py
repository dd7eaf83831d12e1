"""What the model is told before its first reply: the sandbox's rules and the task with its inputs.

The model sees the question, the inputs' names and sizes, and a small sample of each text input
(its first lines, at most ``sample_bytes``), with known secrets and token patterns redacted. It
never sees more of the data: the data is read by the code, in the sandbox.

Under a profile that reaches outside, the rules say so: the hosts of its network allowlist (the
program reaches them through the run's proxy), and its governed tools as a small typed Python
API (:mod:`sandcell.agent.tool_api`) with the instruction to call them from the program and
print only what the question needs.

Security limitation: the sample does leave the host, to whoever serves the model. Pass
``sample_bytes=0`` to send names and sizes only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from sandcell.agent.protocol import ANSWER_TAG
from sandcell.agent.tool_api import ToolOperation, render_api
from sandcell.policy._profile_sections import RUNTIME_IMPORTS
from sandcell.policy.profiles import Profile
from sandcell.runtimes.offer import offer
from sandcell.spec import NODE_LANGUAGES, InputFile, Limits, MiB
from sandcell.validation import Redactor

__all__ = [
    "DEFAULT_SAMPLE_BYTES",
    "Protocol",
    "describe_inputs",
    "system_prompt",
    "task_message",
]

Protocol = Literal["native", "text"]
"""How the model replies: by calling the run_code and answer tools, or with fenced blocks."""

DEFAULT_SAMPLE_BYTES = 1024
"""Per input: the first lines of a text file, up to this many bytes."""
_SAMPLE_LINES = 6
NODE_LINE = (
    "JavaScript and TypeScript run on Node.js 22 (TypeScript's types are stripped, not checked) "
    "with Node's built-in modules and the packages lodash, date-fns, zod, papaparse, csv-parse "
    "and yaml; they cannot start processes"
)
"""Said of the Node languages where the profile runs them: what their programs have."""
_DIR_ENTRIES = 20
_PROBE_BYTES = 8192


def system_prompt(
    profile: Profile,
    *,
    limits: Limits,
    exports: Sequence[str],
    protocol: Protocol = "text",
    operations: Sequence[ToolOperation] = (),
) -> str:
    """The rules of the sandbox and of the reply protocol, for the system message.

    ``operations``: the profile's governed tools as the gateway lists them
    (:func:`sandcell.agent.tool_api.list_operations`), shown as a typed API.
    """
    # What the profile's runtime really has, with versions: the model imports what exists.
    runtime = offer(profile.runtime.runtime)
    allowlist = profile.import_allowlist()
    if allowlist is not None and RUNTIME_IMPORTS in allowlist:
        allowlist = (allowlist - {RUNTIME_IMPORTS}) | runtime.offered
    network = profile.allows_network()
    packages = ", ".join(f"{name} {version}" for name, version in runtime.distributions)
    runtime_line = (
        f"The runtime ({runtime.runtime}) has these packages: {packages}."
        if packages
        else f"The runtime ({runtime.runtime}) has the standard library only."
    )
    imports = (
        "any module installed in the runtime"
        if allowlist is None
        else "the Python standard library"
        + (
            f" and {', '.join(sorted(allowlist - {'sandcell_tools'}))}"
            if allowlist - {"sandcell_tools"}
            else ""
        )
        + "; nothing else is installed"
        + ("" if network else " and nothing can be installed")
    )
    languages = ", ".join(profile.runtime.languages)
    others = [lang for lang in profile.runtime.languages if lang != "python"]
    or_others = f", or {' or '.join(others)}" if others else ""
    if NODE_LANGUAGES & set(profile.runtime.languages):
        languages += f". {NODE_LINE}"
    export_line = (
        f"Files you are asked for leave the sandbox only if their path matches one of: "
        f"{', '.join(exports)} (create the directories first, e.g. os.makedirs('out', "
        "exist_ok=True)); nothing else is kept."
        if exports
        else "No files leave the sandbox: report results by printing them."
    )
    example = json.dumps(
        {
            "explanation": "One or two plain sentences answering the question with the computed "
            "figures.",
            "figures": [{"name": "what it is", "value": 0.0725, "unit": "", "run": 1}],
        }
    )
    rules = (
        "Every number in the explanation and in the figures must appear in the printed output "
        "of a successful run, at least as precisely as you state it (round only when stating). "
        '"run" is the number of the run whose output shows the figure. If the data cannot '
        "answer the question, say so in the explanation, without numbers."
    )
    fences = f" (or {' or '.join(f'```{lang}' for lang in others)})" if others else ""
    if protocol == "native":
        replies = f"""\
Work with the two tools, one call at a time:
1. run_code runs a program (python{or_others}) and returns its output. Print every \
figure you will report, with a label, at full precision.
2. Once the output you have seen answers the question, call answer with the explanation and the \
figures, for example: {example}
Rules for the answer: {rules}"""
    else:
        replies = f"""\
Reply with exactly one fenced block each time, and nothing but a short plan around it:
1. A program to run, in a ```python block{fences}. Print every figure you \
will report, with a label, at full precision.
2. Once the output you have seen answers the question, the final answer as JSON in an \
```{ANSWER_TAG} block:
```{ANSWER_TAG}
{example}
```
Rules for the answer: {rules}"""
    return f"""\
You answer questions by writing short programs, running them in a sandbox, reading their real \
output and explaining it. Never guess or estimate a number: compute it and print it.

The sandbox:
- {_outside_line(profile)} Every program runs in a fresh sandbox: variables and files do not \
carry over from one run to the next, so each program must be complete.
- The working directory is /sandbox (writable, {limits.workspace_bytes // MiB} MiB). Input files \
are read-only under /inputs/NAME and also linked into the working directory as NAME.
- {export_line}
- Languages: {languages}. Python may import {imports}. {runtime_line}
- Each run is limited to {limits.wall_time_s:g} s wall time and \
{limits.memory_bytes // MiB} MiB of memory; output beyond {limits.stdout_bytes} bytes ends it.
- A policy checks the code before it runs. Code that starts processes, loads native code, \
deserialises pickles, {"" if network else "reaches for the network "}or reads outside the \
working directory and /inputs is refused or held for a person's approval: write plain \
computations.
{_tools_section(operations, bash=profile.allows_language("bash"))}
{replies}"""


def _outside_line(profile: Profile) -> str:
    """What the program can reach beyond the sandbox: nothing, or the allowlist's hosts."""
    if not profile.allows_network():
        return "No network and no secrets."
    hosts = ", ".join(rule.show() for rule in profile.network.allowlist.rules)
    return (
        f"No secrets. Network only through the run's proxy, and only to these hosts (host:ports): "
        f"{hosts}. The proxy variables (http_proxy, https_proxy) are set, so urllib, requests, "
        "httpx, pip and curl use the proxy without anything in the code; another host is "
        "refused with an HTTP error that names it, and a direct socket reaches nothing. Every "
        "connection is recorded."
    )


def _tools_section(operations: Sequence[ToolOperation], *, bash: bool) -> str:
    """The governed tools as a typed API, or nothing when the profile has none."""
    if not operations:
        return ""
    shell = (
        ' From bash: python3 -m sandcell_tools call NAME --json \'{"arg": "value"}\'.'
        if bash
        else ""
    )
    return f"""
Governed tools. The host calls these for the program, with credentials the sandbox never \
sees, after checking each call against the profile (allowed operations, argument schema, rate \
and size limits, a person's approval where marked). Call them from Python:
    import sandcell_tools
    result = sandcell_tools.call("TOOL.OPERATION", name=value, ...)
The stubs below are not defined in the sandbox: each shows one operation as the typed function \
it behaves like, and its last line the call to write. Pass keyword arguments only, and leave \
out optional ones you do not need.{shell}
```python
{render_api(operations)}
```
Call tools from the program and filter, join and aggregate their results there: print only the \
few lines the question needs. Only what the program prints comes back to you; a raw result \
printed whole wastes the conversation. A refused call raises sandcell_tools.ToolError with the \
reason; sandcell_tools.list() gives every operation's JSON Schema. Every call is recorded.
"""


def task_message(
    question: str,
    inputs: Sequence[InputFile],
    *,
    sample_bytes: int = DEFAULT_SAMPLE_BYTES,
    known_secrets: Sequence[str] = (),
    schema: Mapping[str, object] | None = None,
    invariants: Sequence[str] = (),
) -> str:
    """The first user message: the question, the inputs, and the declared result if any."""
    parts = [f"Question: {question.strip()}"]
    if inputs:
        parts.append(
            "Inputs:\n" + describe_inputs(inputs, sample_bytes=sample_bytes, secrets=known_secrets)
        )
    else:
        parts.append("There are no input files.")
    if schema is not None or invariants:
        lines = [
            "Every program must print its result as one JSON object on the last line of stdout."
        ]
        if schema is not None:
            lines.append(f"It must meet this JSON Schema: {json.dumps(schema)}")
        for inv in invariants:
            lines.append(f"It must satisfy: {inv}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def describe_inputs(
    inputs: Sequence[InputFile], *, sample_bytes: int, secrets: Sequence[str] = ()
) -> str:
    """Names, sizes and a small, redacted sample of each input, one entry each."""
    redactor = Redactor(secrets)
    return "\n".join(_describe(i, sample_bytes, redactor) for i in inputs)


def _describe(item: InputFile, sample_bytes: int, redactor: Redactor) -> str:
    path = item.host_path
    where = f"/inputs/{item.name} (also ./{item.name})"
    if path.is_dir():
        entries = sorted(p for p in path.rglob("*") if p.is_file())
        shown = [
            f"    {p.relative_to(path)} ({_size(p.stat().st_size)})" for p in entries[:_DIR_ENTRIES]
        ]
        more = len(entries) - len(shown)
        tail = [f"    ... and {more} more files"] if more > 0 else []
        return "\n".join([f"- directory {where}, {len(entries)} files:", *shown, *tail])
    size = path.stat().st_size
    head = f"- file {where}, {_size(size)}"
    sample = _sample(path, sample_bytes)
    if sample is None:
        return f"{head}, binary"
    if not sample:
        return head
    text, _ = redactor.scan_text(sample)
    return f"{head}; its first lines:\n```\n{text}\n```"


def _sample(path: Path, sample_bytes: int) -> str | None:
    """The first lines of a text file within ``sample_bytes``; None for a binary file."""
    with path.open("rb") as f:
        probe = f.read(_PROBE_BYTES)
    if b"\x00" in probe:
        return None
    if sample_bytes <= 0:
        return ""
    chunk = probe[:sample_bytes]
    lines = chunk.split(b"\n")
    if len(probe) > len(chunk):
        # Only whole lines: a cut line would show the model a value that is not in the data.
        lines = lines[:-1]
    lines = lines[:_SAMPLE_LINES]
    try:
        return b"\n".join(lines).decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        return None


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < MiB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MiB:.1f} MiB"
