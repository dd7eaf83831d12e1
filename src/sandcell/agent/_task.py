"""The running state of one question, and its JSON form for a conversation that waits.

:class:`Task` is what the loop works on: the request's parts, the conversation, the attempts and
the evidence their runs produced, the spending, and where the retry counter stands.
:func:`task_to_state` and :func:`task_from_state` turn it into JSON and back, so a question held
for a person's approval can be picked up in another process (:mod:`sandcell.agent.paused`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from sandcell.agent.budget import Budget, Spending
from sandcell.agent.paused import ResumeError
from sandcell.agent.prompt import Protocol
from sandcell.agent.tool_api import ToolOperation
from sandcell.agent.transcript import Attempt, Event, EventKind, answer_attempt_dict
from sandcell.models.base import Message, Role, TokenUsage, ToolCall
from sandcell.policy.profiles import Profile, load_profile
from sandcell.spec import Artifact, InputFile, Language, Limits

__all__ = ["Task", "task_from_state", "task_to_state"]

_STATE_VERSION = 1


@dataclass(slots=True)
class Task:
    """The running state of one question."""

    question: str
    profile: Profile
    inputs: tuple[InputFile, ...]
    exports: tuple[str, ...]
    limits: Limits
    """Limits of each run (the wall time is cut to what is left of the sandbox budget)."""
    schema: Mapping[str, object] | None
    invariants: tuple[str, ...]
    spend: Spending
    messages: list[Message]
    protocol: Protocol = "text"
    """How the model replies: native tool calls, or fenced blocks."""
    attempts: list[Attempt] = field(default_factory=list)
    evidence: dict[str, list[str]] = field(default_factory=dict)
    """What each successful run printed, displayed or declared, by run id: an answer's numbers
    are traced to these texts."""
    events: list[Event] = field(default_factory=list)
    failures: int = 0
    """Failed replies in a row."""
    fallback_used: bool = False
    last_failure: str = "run"
    held: bool = False
    """The last program was held for approval and the model was asked to do without it."""
    pending_call: str | None = None
    """The tool call the next message to the model answers (native tool calling)."""
    operations: tuple[ToolOperation, ...] = ()
    """The profile's governed tools as listed when the question was asked: the system prompt
    is written again from them when the conversation switches to plain text."""
    workdir: Path | None = None
    """A repository every run gets a writable copy of (``ask --workdir-from``); each run's
    change set is recorded with it (:mod:`sandcell.changes`)."""

    def tell(self, text: str) -> None:
        """Say ``text`` to the model: the result of its pending tool call, or a user message."""
        if self.pending_call is not None:
            self.messages.append(Message(role="tool", content=text, tool_call_id=self.pending_call))
            self.pending_call = None
        else:
            self.messages.append(Message(role="user", content=text))


def task_to_state(task: Task, *, model_settings: Mapping[str, object]) -> dict[str, object]:
    """The JSON form of ``task`` (with the model's key-free settings)."""
    return {
        "version": _STATE_VERSION,
        "question": task.question,
        "profile": task.profile.to_record(),
        "inputs": [{"host_path": str(i.host_path), "name": i.name} for i in task.inputs],
        "exports": list(task.exports),
        "limits": asdict(task.limits),
        "schema": dict(task.schema) if task.schema is not None else None,
        "invariants": list(task.invariants),
        "budget": asdict(task.spend.budget),
        "spent": {
            "steps": task.spend.steps,
            "input_tokens": task.spend.tokens.input_tokens,
            "output_tokens": task.spend.tokens.output_tokens,
            "sandbox_s": task.spend.sandbox_s,
        },
        "messages": [_message_dict(m) for m in task.messages],
        "protocol": task.protocol,
        "attempts": [answer_attempt_dict(a) for a in task.attempts],
        "evidence": task.evidence,
        "events": [
            {"kind": e.kind, "step": e.step, "message": e.message, "attempt": e.attempt}
            for e in task.events
        ],
        "failures": task.failures,
        "fallback_used": task.fallback_used,
        "last_failure": task.last_failure,
        "held": task.held,
        "pending_call": task.pending_call,
        "operations": [op.to_dict() for op in task.operations],
        "model_settings": dict(model_settings),
    }


def task_from_state(state: Mapping[str, Any], *, profile: Profile, budget: Budget | None) -> Task:
    """The task ``state`` describes; ``budget`` replaces the stored one when given.

    ``profile`` is the caller's: used when it is the stored profile (same hash), else the stored
    one is loaded again and must be unchanged. Raises ResumeError for a state it cannot read.
    """
    try:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r}")
        spent = state["spent"]
        spend = Spending(budget or Budget(**state["budget"]))
        spend.steps = int(spent["steps"])
        spend.tokens = TokenUsage(
            input_tokens=int(spent["input_tokens"]), output_tokens=int(spent["output_tokens"])
        )
        spend.sandbox_s = float(spent["sandbox_s"])
        return Task(
            question=str(state["question"]),
            profile=_profile(state["profile"], profile),
            inputs=tuple(
                InputFile(host_path=Path(i["host_path"]), name=str(i["name"]))
                for i in state["inputs"]
            ),
            exports=tuple(str(e) for e in state["exports"]),
            limits=Limits(**state["limits"]),
            schema=state["schema"],
            invariants=tuple(str(i) for i in state["invariants"]),
            spend=spend,
            messages=[_message(m) for m in state["messages"]],
            protocol="native" if state["protocol"] == "native" else "text",
            attempts=[_attempt(a) for a in state["attempts"]],
            evidence={str(k): [str(t) for t in v] for k, v in state["evidence"].items()},
            events=[
                Event(
                    kind=cast(EventKind, e["kind"]),
                    step=int(e["step"]),
                    message=str(e["message"]),
                    attempt=e["attempt"],
                )
                for e in state["events"]
            ],
            failures=int(state["failures"]),
            fallback_used=bool(state["fallback_used"]),
            last_failure=str(state["last_failure"]),
            held=bool(state["held"]),
            pending_call=state["pending_call"],
            # Absent in a conversation stored before tools were listed: none were shown.
            operations=tuple(ToolOperation.from_dict(op) for op in state.get("operations", ())),
        )
    except ResumeError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResumeError(f"the stored conversation cannot be read ({exc!r})") from exc


def _profile(record: Mapping[str, Any], mine: Profile) -> Profile:
    sha = record.get("sha256")
    if mine.sha256 == sha:
        return mine
    source = str(record.get("source") or "")
    name = str(record.get("name"))
    # A built-in is loaded by name; a user profile from the file it was loaded from.
    loaded = load_profile(name if source.startswith("builtin:") or not source else source)
    if loaded.sha256 != sha:
        raise ResumeError(
            f"profile {name!r} changed since the question was asked; the conversation cannot "
            "go on under different rules: ask the question again"
        )
    return loaded


def _message_dict(m: Message) -> dict[str, object]:
    return {
        "role": m.role,
        "content": m.content,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
        ],
        "tool_call_id": m.tool_call_id,
    }


def _message(d: Mapping[str, Any]) -> Message:
    role = d["role"]
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"message role {role!r}")
    return Message(
        role=cast(Role, role),
        content=str(d["content"]),
        tool_calls=tuple(
            ToolCall(id=str(c["id"]), name=str(c["name"]), arguments=str(c["arguments"]))
            for c in d.get("tool_calls", [])
        ),
        tool_call_id=d.get("tool_call_id"),
    )


def _attempt(d: Mapping[str, Any]) -> Attempt:
    names = {f.name for f in fields(Attempt)}
    values = {k: v for k, v in d.items() if k in names}
    values["language"] = cast(Language, values["language"])
    values["findings"] = tuple(dict(f) for f in values.get("findings", ()))
    values["validation_errors"] = tuple(values.get("validation_errors", ()))
    values["artifacts"] = _artifacts(values.get("artifacts", ()))
    return Attempt(**values)


def _artifacts(items: Sequence[Mapping[str, Any]]) -> tuple[Artifact, ...]:
    return tuple(
        Artifact(
            path=str(a["path"]),
            sha256=str(a["sha256"]),
            size=int(a["size"]),
            media_type=str(a["media_type"]),
        )
        for a in items
    )
