"""What the model is told after each reply: the run's output, or why its reply did not work.

Output is cut to a few kilobytes (head and tail) before it goes back to the model; the full
output stays in the run record. What the model reads was already redacted by the executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandcell.spec import Language, RunResult

__all__ = [
    "answer_rejected",
    "before_any_run",
    "fallback",
    "held_for_approval",
    "language_refused",
    "language_refused_in_workdir",
    "not_run",
    "observation",
    "prose_rejected",
    "run_failed",
    "unusable_reply",
]

_STDOUT_CHARS = 4000
_STDERR_CHARS = 2000
_OUTPUT_CHARS = 1000


def _cut(text: str, limit: int, *, tail_only: bool = False) -> str:
    if len(text) <= limit:
        return text
    if tail_only:
        return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _block(text: str) -> str:
    return "```\n" + text.rstrip("\n") + "\n```"


def _how_to_answer(native: bool) -> str:
    return "call the answer tool" if native else "reply with the ```answer block"


def observation(
    index: int, result: RunResult, *, note: str | None = None, native: bool = False
) -> str:
    """A successful run: what it printed, displayed and exported."""
    parts = [f"Run {index} (run id {result.run_id}) finished ok."]
    if note:
        parts.append(f"Note: {note}.")
    parts.append(
        "stdout:\n" + _block(_cut(result.stdout, _STDOUT_CHARS))
        if result.stdout
        else "It printed nothing."
    )
    if result.stderr.strip():
        parts.append("stderr:\n" + _block(_cut(result.stderr, _STDERR_CHARS, tail_only=True)))
    for i, out in enumerate(result.outputs, start=1):
        plain = out.data.get("text/plain")
        if out.kind == "figure":
            parts.append(f"Displayed output {i}: a figure.")
        elif plain:
            parts.append(
                f"Displayed output {i} ({out.kind}):\n" + _block(_cut(plain, _OUTPUT_CHARS))
            )
    if result.artifacts:
        parts.append(
            "Exported: " + ", ".join(f"{a.path} ({a.size} bytes)" for a in result.artifacts)
        )
    for rejected in result.rejected_exports:
        parts.append(f"Not exported: {rejected.path}: {rejected.reason}")
    parts.append(
        f"If this output answers the question, {_how_to_answer(native)}; otherwise send the "
        "next program."
    )
    return "\n\n".join(parts)


def _findings(findings: Sequence[Mapping[str, object]]) -> str:
    return "\n".join(
        f"- {f.get('rule_id')} ({f.get('severity')}) at line {f.get('line')}: {f.get('message')}"
        for f in findings
    )


def run_failed(
    index: int,
    result: RunResult,
    *,
    findings: Sequence[Mapping[str, object]],
    validation_errors: Sequence[str],
    note: str | None = None,
) -> str:
    """A run that did not succeed, with what the model needs to fix it."""
    head = f"Run {index} (run id {result.run_id}) did not succeed: {result.outcome.value}"
    parts: list[str] = []
    match result.outcome.value:
        case "denied":
            parts.append(
                f"{head}. The policy refused the program before it ran:\n{_findings(findings)}\n"
                "Rewrite it without what the findings name; plain computation on the inputs is "
                "allowed."
            )
        case "invalid_output":
            parts.append(
                f"{head}. It ran, but its declared result (the JSON on the last line of stdout) "
                "failed validation:\n" + "\n".join(f"- {e}" for e in validation_errors)
            )
        case "timeout":
            parts.append(
                f"{head}. It was stopped at its time limit ({result.reason}). Make it faster or "
                "do less work in one run."
            )
        case "memory_limit":
            parts.append(f"{head}. It ran out of memory ({result.reason}). Use less memory.")
        case "output_limit":
            parts.append(f"{head}. It printed too much ({result.reason}). Print summaries only.")
        case "infra_error":
            parts.append(
                f"{head}. The sandbox failed before the program ran ({result.reason}); this was "
                "not the program's fault. Send the program again."
            )
        case _:
            parts.append(f"{head} ({result.reason}).")
    if note:
        parts.append(f"Note: {note}.")
    if result.stdout.strip() and result.outcome.value != "denied":
        parts.append("stdout:\n" + _block(_cut(result.stdout, _STDERR_CHARS, tail_only=True)))
    if result.stderr.strip():
        parts.append(
            "stderr (the end):\n" + _block(_cut(result.stderr, _STDERR_CHARS, tail_only=True))
        )
    parts.append("Reply with the whole corrected program.")
    return "\n\n".join(parts)


def held_for_approval(
    index: int, result: RunResult, *, findings: Sequence[Mapping[str, object]]
) -> str:
    """A run the checks held for a person's approval, when no person can approve now."""
    listed = _findings(findings) or f"- {result.reason}"
    return (
        f"Run {index} (run id {result.run_id}) did not run: the checks held it for a person's "
        f"approval, and nobody can approve it now. What needs approval:\n{listed}\n"
        "Most such programs do not need what was flagged: read only the input files (by their "
        "names in the working directory or under /inputs), not the rest of the filesystem, and "
        "import only what the computation needs. Send the whole program again without it; if it "
        "still needs approval, the question stops and waits for a person."
    )


def prose_rejected(untraced: Sequence[str], *, native: bool) -> str:
    """A final answer written as prose whose numbers do not all come from a run."""
    return (
        "Your reply reads as a final answer, but it states numbers that no successful run "
        "printed:\n"
        + "\n".join(f"- {u}" for u in untraced)
        + "\nEither run a program that prints them, or give the final answer with only numbers "
        f"the runs printed: {_how_to_answer(native)}."
    )


def not_run(reason: str) -> str:
    """The result of a tool call the agent did not carry out."""
    return f"Not run: {reason}."


def language_refused(language: Language, allowed: Sequence[str]) -> str:
    return (
        f"That program is {language}, which this profile does not run; it allows: "
        f"{', '.join(allowed)}. Write the program in {allowed[0]}."
    )


def language_refused_in_workdir(language: Language) -> str:
    return (
        f"That program is {language}, which cannot run in this task's working directory (its "
        "changes are recorded around Python and Bash programs only). Write it in Python or Bash."
    )


UNUSABLE = "Your reply could not be used: "


def unusable_reply(problem: str) -> str:
    return f"{UNUSABLE}{problem}."


def before_any_run() -> str:
    return (
        "An answer must rest on the output of a program that ran successfully, and none has yet. "
        "Reply with a program that computes and prints the figures first."
    )


def answer_rejected(untraced: Sequence[str]) -> str:
    return (
        "Your answer states numbers that no successful run printed:\n"
        + "\n".join(f"- {u}" for u in untraced)
        + "\nEither run a program that prints them, or give the answer again with only numbers "
        "the runs printed (at most at the precision they printed)."
    )


def fallback(tries: int, *, language: Language | None, python_allowed: bool) -> str:
    """The last chance after ``tries`` failed replies: a simpler approach."""
    # The simple approach below is Python's (csv, statistics, json): from another language,
    # the model is pointed at Python where the profile runs it.
    switch = (
        f" Write it in Python, not {language}."
        if language not in (None, "python") and python_allowed
        else ""
    )
    return (
        f"That has failed {tries} times in a row. Step back and take the simplest approach that "
        "can work: one short, complete program, using the standard library where possible "
        f"(csv, statistics, json), that prints each figure with a label.{switch}"
    )
