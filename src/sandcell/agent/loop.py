"""The code-execution agent: plan → generate code → check → run → observe → validate → explain.

:class:`Agent` asks a model for a program, runs it through the :class:`~sandcell.executor.Executor`
(so the policy checks it, the sandbox runs it, its declared result is validated and every run is
recorded), shows the model what came out, and repeats until the model gives a final answer whose
every number traces back to a run's output (:mod:`sandcell.agent.trace`).

Recovery is bounded. A failure (a refused or crashed run, a timeout, an invalid result, an
answer with untraceable numbers, a reply that breaks the protocol) goes back to the model as
feedback, up to ``max_retries`` times in a row; then one fallback turn asks for the simplest
approach (Python instead of bash, the standard library); then the agent stops with a stop reason.
Budgets (steps, tokens, sandbox time) stop it at any point.

Supervisor mode: a run the profile holds for approval goes to the ``approve`` callback; without
one the agent stops with ``awaiting_approval`` and the approval id. A person's denial stops the
agent (``approval_denied``): the model does not get to look for a way around a person's no.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.agent import feedback
from sandcell.agent._observe import approval_of, attempt_of, evidence_texts, exported
from sandcell.agent.budget import Budget, Spending
from sandcell.agent.prompt import DEFAULT_SAMPLE_BYTES, system_prompt, task_message
from sandcell.agent.protocol import CodeBlock, FinalAnswer, parse_reply
from sandcell.agent.trace import Evidence, trace_answer
from sandcell.agent.transcript import Answer, Attempt, Event, EventKind, Figure, StopReason
from sandcell.errors import ConfigError, ModelError, ModelRateLimited
from sandcell.models.base import Message, Model
from sandcell.policy.profiles import Profile, load_profile
from sandcell.spec import (
    InputFile,
    Limits,
    Outcome,
    RunRequest,
    RunResult,
    input_from_path,
)

if TYPE_CHECKING:
    from sandcell.executor import ApprovalCallback, Executor
    from sandcell.policy.approvals import Ticket

__all__ = ["Agent", "EventCallback"]

EventCallback = Callable[[Event], None]
_FailureKind = str  # "run", "denied", "untraceable", "format"


@dataclass(slots=True)
class _Task:
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
    attempts: list[Attempt] = field(default_factory=list)
    results: dict[str, RunResult] = field(default_factory=dict)
    """Successful runs by run id: the evidence an answer is traced to."""
    events: list[Event] = field(default_factory=list)
    failures: int = 0
    """Failed replies in a row."""
    fallback_used: bool = False
    last_failure: _FailureKind = "run"


class Agent:
    """Answers questions by running code; see the module docstring for the loop.

    >>> agent = Agent(executor, model, profile="analysis")          # doctest: +SKIP
    >>> answer = agent.ask("Mean conversion rate?", inputs=["sales.csv"])  # doctest: +SKIP
    >>> answer.stop_reason, answer.explanation                     # doctest: +SKIP
    """

    def __init__(
        self,
        executor: Executor,
        model: Model,
        *,
        profile: Profile | str | None = None,
        budget: Budget | None = None,
        max_retries: int = 3,
        fallback: bool = True,
        limits: Limits | None = None,
        approve: ApprovalCallback | None = None,
        on_event: EventCallback | None = None,
        sample_bytes: int = DEFAULT_SAMPLE_BYTES,
        model_retries: int = 2,
        max_model_wait_s: float = 30.0,
        temperature: float | None = None,
    ) -> None:
        if max_retries < 0 or model_retries < 0:
            raise ConfigError("max_retries and model_retries must be 0 or more")
        self.executor = executor
        self.model = model
        self.profile = (
            executor.profile
            if profile is None
            else profile
            if isinstance(profile, Profile)
            else load_profile(profile)
        )
        self.budget = budget or Budget()
        self.max_retries = max_retries
        self.fallback = fallback
        self.limits = limits
        """Limits of each run; None takes the profile's defaults."""
        self.approve = approve
        self.on_event = on_event
        self.sample_bytes = sample_bytes
        self.model_retries = model_retries
        self.max_model_wait_s = max_model_wait_s
        self.temperature = temperature

    # -- the loop ---------------------------------------------------------------------------

    def ask(
        self,
        question: str,
        inputs: Sequence[str | Path | InputFile] = (),
        exports: Sequence[str] = (),
        *,
        schema: Mapping[str, object] | None = None,
        invariants: Sequence[str] = (),
    ) -> Answer:
        """Answer ``question`` from ``inputs`` (host paths, read-only in the sandbox).

        ``exports`` are globs of files the runs may hand back (charts, tables); ``schema`` and
        ``invariants`` declare a result every run must print as its last JSON line. Raises
        ConfigError only for a request the profile cannot accept at all (too many inputs, an
        export it forbids); everything else ends in an :class:`Answer` with a stop reason.
        """
        if not question.strip():
            raise ConfigError("the question is empty; ask something")
        prof = self.profile
        files = tuple(i if isinstance(i, InputFile) else input_from_path(i) for i in inputs)
        self._admissible(prof, files, exports)
        limits = self.limits or prof.limits.defaults
        task = _Task(
            question=question,
            profile=prof,
            inputs=files,
            exports=tuple(exports),
            limits=limits,
            schema=schema,
            invariants=tuple(invariants),
            spend=Spending(self.budget),
            messages=[
                Message(
                    role="system",
                    content=system_prompt(prof, limits=limits, exports=exports),
                ),
                Message(
                    role="user",
                    content=task_message(
                        question,
                        files,
                        sample_bytes=self.sample_bytes,
                        known_secrets=self.executor.known_secrets,
                        schema=schema,
                        invariants=invariants,
                    ),
                ),
            ],
        )
        while True:
            stop = task.spend.before_step()
            if stop is not None:
                return self._stop(task, stop, task.spend.describe(stop))
            step = task.spend.steps + 1
            self._emit(task, "planning", step, f"asking {self.model.name}")
            try:
                text = self._complete(task, step)
            except ModelError as exc:
                return self._stop(task, "model_error", f"the model failed: {exc}")
            reply = parse_reply(text)
            if reply.plan:
                self._emit(task, "plan", step, "plan: " + reply.plan.splitlines()[0][:200])
            if reply.code is not None:
                outcome = self._run(task, step, reply.code, reply.note)
                if isinstance(outcome, Answer):
                    return outcome
                if outcome is None:
                    continue
                kind, message = outcome
            elif reply.answer is not None:
                done = self._check_answer(task, step, reply.answer)
                if isinstance(done, Answer):
                    return done
                kind, message = done
            else:
                kind, message = "format", feedback.unusable_reply(reply.problem or "")
            stopped = self._failed(task, step, kind, message)
            if stopped is not None:
                return stopped

    # -- steps ------------------------------------------------------------------------------

    def _complete(self, task: _Task, step: int) -> str:
        """One model turn, retrying a retryable provider error a bounded number of times."""
        for retry in range(self.model_retries + 1):
            try:
                completion = self.model.complete(
                    task.messages,
                    max_tokens=task.spend.reply_tokens(),
                    temperature=self.temperature,
                )
            except ModelError as exc:
                if not exc.retryable or retry == self.model_retries:
                    raise
                hint = exc.retry_after_s if isinstance(exc, ModelRateLimited) else None
                delay = min(hint if hint is not None else 2.0**retry, self.max_model_wait_s)
                self._emit(
                    task, "retrying", step, f"model unavailable ({exc}); again in {delay:.1f} s"
                )
                time.sleep(delay)
                continue
            task.spend.add_turn(completion.usage)
            task.messages.append(Message(role="assistant", content=completion.text))
            return completion.text
        raise AssertionError("unreachable: the last retry either returns or raises")

    def _run(
        self,
        task: _Task,
        step: int,
        block: CodeBlock,
        note: str | None,
    ) -> Answer | tuple[_FailureKind, str] | None:
        """Run one program: None on success, a failure (kind, feedback), or the final stop."""
        index = len(task.attempts) + 1
        prof, limits = task.profile, task.limits
        if not prof.allows_language(block.language):
            message = feedback.language_refused(block.language, prof.runtime.languages)
            task.attempts.append(
                Attempt(
                    index=index,
                    step=step,
                    language=block.language,
                    code=block.code,
                    run_id=None,
                    outcome="denied",
                    reason=f"profile {prof.name!r} does not run {block.language}",
                    feedback=message,
                )
            )
            return "denied", message
        wall = task.spend.run_wall_s(limits.wall_time_s)
        if wall is None:
            return self._stop(
                task, "budget_sandbox_time", task.spend.describe("budget_sandbox_time")
            )
        cut_by_budget = wall < limits.wall_time_s
        try:
            request = RunRequest(
                code=block.code,
                language=block.language,
                inputs=task.inputs,
                exports=task.exports,
                limits=limits.with_(wall_time_s=wall),
                display=block.language == "python",
            )
        except ConfigError as exc:
            return "format", feedback.unusable_reply(str(exc))
        self._emit(task, "running", step, f"running attempt {index} ({block.language})", index)
        approve = self.approve
        if approve is not None:
            decide = approve

            def approve(ticket: Ticket) -> bool:
                # The agent pauses here until the person (or the caller's policy) decides.
                self._emit(task, "approval", step, f"attempt {index} waits for approval", index)
                return decide(ticket)

        result = self.executor.run(
            request,
            profile=prof,
            schema=task.schema,
            invariants=task.invariants,
            approve=approve,
        )
        task.spend.add_run(result.usage.wall_ms)
        attempt = attempt_of(index, step, block, result)
        approval = approval_of(result)
        approval_id = attempt.approval_id
        self._emit(
            task,
            "ran",
            step,
            f"attempt {index}: {result.outcome.value} (run {result.run_id})",
            index,
        )
        if result.outcome is Outcome.OK:
            task.attempts.append(attempt)
            task.results[result.run_id] = result
            task.failures = 0
            task.messages.append(
                Message(role="user", content=feedback.observation(index, result, note=note))
            )
            return None
        if result.outcome is Outcome.AWAITING_APPROVAL:
            task.attempts.append(attempt)
            self._emit(
                task, "approval", step, f"attempt {index} waits for approval {approval_id}", index
            )
            return self._stop(
                task,
                "awaiting_approval",
                f"attempt {index} needs a person's approval: sandcell approve {approval_id}",
                approval_id=approval_id,
            )
        if result.outcome is Outcome.DENIED and "denied_by" in approval:
            task.attempts.append(attempt)
            return self._stop(
                task,
                "approval_denied",
                f"attempt {index} was denied by {approval.get('denied_by')}",
                approval_id=approval_id,
            )
        if result.outcome is Outcome.TIMEOUT and cut_by_budget:
            task.attempts.append(attempt)
            return self._stop(
                task, "budget_sandbox_time", task.spend.describe("budget_sandbox_time")
            )
        message = feedback.run_failed(
            index,
            result,
            findings=attempt.findings,
            validation_errors=attempt.validation_errors,
            note=note,
        )
        task.attempts.append(_with_feedback(attempt, message))
        kind = "denied" if result.outcome is Outcome.DENIED else "run"
        return kind, message

    def _check_answer(
        self, task: _Task, step: int, answer: FinalAnswer
    ) -> Answer | tuple[_FailureKind, str]:
        """Validate the final answer: it must rest on runs, and every number trace to one."""
        if not task.results:
            return "format", feedback.before_any_run()
        evidence = Evidence(
            {rid: evidence_texts(r) for rid, r in task.results.items()},
            context="\n".join([task.question, *(i.name for i in task.inputs)]),
        )
        report = trace_answer(answer, evidence, resolve_run=lambda ref: self._resolve(task, ref))
        if not report.ok:
            self._emit(
                task,
                "rejected",
                step,
                f"answer rejected: {len(report.untraced)} untraceable numbers",
            )
            return "untraceable", feedback.answer_rejected(report.untraced)
        figures = tuple(
            Figure(
                name=f.name,
                value=float(f.number) if f.number is not None else f.shown,
                shown=f.shown,
                unit=f.unit,
                run_id=run_id,
            )
            for f, run_id in zip(answer.figures, report.figure_runs, strict=True)
        )
        return self._stop(
            task,
            "answered",
            f"answered after {_count(len(task.attempts), 'attempt')}",
            explanation=answer.explanation,
            figures=figures,
        )

    def _failed(self, task: _Task, step: int, kind: _FailureKind, message: str) -> Answer | None:
        """Count a failed reply: feed it back, fall back once, or stop."""
        task.failures += 1
        task.last_failure = kind
        if task.failures > self.max_retries:
            if self.fallback and not task.fallback_used:
                task.fallback_used = True
                # One more try after the fallback prompt, then a stop.
                task.failures = self.max_retries
                last = task.attempts[-1].language if task.attempts else None
                hint = feedback.fallback(
                    self.max_retries + 1,
                    language=last,
                    python_allowed=task.profile.allows_language("python"),
                )
                self._emit(task, "fallback", step, "falling back to a simpler approach")
                task.messages.append(Message(role="user", content=f"{message}\n\n{hint}"))
                return None
            reason: StopReason = {
                "denied": "denied",
                "untraceable": "untraceable_answer",
            }.get(kind, "retries_exhausted")  # type: ignore[assignment]
            lines = [line.strip("- ") for line in message.splitlines() if line.strip()][:2]
            why = "; ".join(lines)
            why = why if len(why) <= 300 else why[:297] + "..."
            return self._stop(
                task, reason, f"gave up after {task.failures} failed replies in a row: {why}"
            )
        self._emit(task, "retrying", step, f"retrying because {_why(kind)}")
        task.messages.append(Message(role="user", content=message))
        return None

    # -- helpers ----------------------------------------------------------------------------

    def _admissible(
        self, prof: Profile, files: Sequence[InputFile], exports: Sequence[str]
    ) -> None:
        # The caller's part of every request, refused once before the model is asked anything.
        if not prof.allows_inputs(len(files)):
            raise ConfigError(
                f"profile {prof.name!r} allows at most {prof.filesystem.max_inputs} inputs, "
                f"the question has {len(files)}"
            )
        for glob in exports:
            if not prof.allows_export(glob):
                raise ConfigError(
                    f"profile {prof.name!r} does not allow exporting {glob!r} (it allows: "
                    f"{', '.join(prof.filesystem.export_globs) or 'nothing'}); export less, or "
                    "use a profile that allows it"
                )

    def _resolve(self, task: _Task, ref: str) -> str | None:
        """A figure's run reference (attempt number, run id or a prefix of one) to a run id."""
        ref = ref.strip().lstrip("#")
        if ref.isdigit():
            n = int(ref)
            if 1 <= n <= len(task.attempts):
                rid = task.attempts[n - 1].run_id
                return rid if rid in task.results else None
            return None
        matches = [rid for rid in task.results if len(ref) >= 6 and rid.startswith(ref)]
        return matches[0] if len(matches) == 1 else None

    def _emit(
        self, task: _Task, kind: EventKind, step: int, message: str, attempt: int | None = None
    ) -> None:
        event = Event(kind=kind, step=step, message=message, attempt=attempt)
        task.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def _stop(
        self,
        task: _Task,
        reason: StopReason,
        message: str,
        *,
        explanation: str | None = None,
        figures: tuple[Figure, ...] = (),
        approval_id: str | None = None,
    ) -> Answer:
        self._emit(task, "stopped", task.spend.steps, f"stopped: {reason} ({message})")
        return Answer(
            question=task.question,
            stop_reason=reason,
            message=message,
            explanation=explanation,
            figures=figures,
            attempts=tuple(task.attempts),
            events=tuple(task.events),
            artifacts=exported(task.attempts),
            model=self.model.name,
            profile=task.profile.name,
            steps=task.spend.steps,
            tokens=task.spend.tokens,
            sandbox_s=task.spend.sandbox_s,
            approval_id=approval_id,
        )


def _with_feedback(attempt: Attempt, message: str) -> Attempt:
    return replace(attempt, feedback=message)


def _why(kind: _FailureKind) -> str:
    return {
        "run": "the run failed",
        "denied": "the policy refused the code",
        "untraceable": "the answer had numbers no run printed",
        "format": "the reply could not be used",
    }.get(kind, kind)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
