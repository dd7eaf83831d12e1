"""The code-execution agent: plan → generate code → check → run → observe → validate → explain.

:class:`Agent` asks a model for a program, runs it through the :class:`~sandcell.executor.Executor`
(so the policy checks it, the sandbox runs it, its declared result is validated and every run is
recorded), shows the model what came out, and repeats until the model gives a final answer whose
every number traces back to a run's output (:mod:`sandcell.agent.trace`). The model replies by
native tool calls (``run_code``, ``answer``: :mod:`sandcell.agent.tools`) where the model and its
server support them, else in the plain-text protocol (:mod:`sandcell.agent.protocol`); a server
that rejects tools mid-way switches the question to plain text. A final answer written as prose
after a successful run is accepted when its numbers trace (:mod:`sandcell.agent._answers`).

Code mode: under a profile with governed tools, the system prompt shows them as a typed Python
API (:mod:`sandcell.agent.tool_api`, listed once from the host's gateway when the question is
asked), so the model's programs call the tools and reduce their results in the sandbox, and only
what a program prints reaches the model.

Recovery is bounded. A failure (a refused or crashed run, a timeout, an invalid result, an
answer with untraceable numbers, a reply that breaks the protocol) goes back to the model as
feedback, up to ``max_retries`` times in a row; then one fallback turn asks for the simplest
approach (Python instead of bash, the standard library); then the agent stops with a stop reason.
Budgets (steps, tokens, sandbox time) stop it at any point.

Supervisor mode: a run the profile holds for approval goes to the ``approve`` callback. Without
one, nobody can approve now: the model is told what needed approval and asked to do without it
(a retry; the held request is withdrawn), and only when its next program is held too (or the
profile approves every run by hand, or no retry is left) does the agent stop with
``awaiting_approval``. It then keeps the conversation with the approval
(:mod:`sandcell.agent.paused`); after ``sandcell approve ID``, which runs the held program,
:meth:`Agent.resume` goes on from that run's result. A person's denial stops the agent
(``approval_denied``): the model does not get to look for a way around a person's no.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sandcell.agent import feedback
from sandcell.agent._answers import Accepted, Refused, check_answer, check_prose
from sandcell.agent._observe import (
    approval_of,
    attempt_of,
    evidence_texts,
    exported,
)
from sandcell.agent._resume import decided
from sandcell.agent._task import Task, task_to_state
from sandcell.agent.budget import Budget, Spending
from sandcell.agent.paused import PAUSED_FILENAME, PausedStore
from sandcell.agent.prompt import DEFAULT_SAMPLE_BYTES, system_prompt, task_message
from sandcell.agent.protocol import CodeBlock, Reply, parse_reply
from sandcell.agent.tool_api import list_operations
from sandcell.agent.tools import NO_TOOL_CALL, as_text, read_tool_calls, tools_for
from sandcell.agent.transcript import Answer, Attempt, Event, EventKind, Figure, StopReason
from sandcell.errors import ConfigError, ModelError, ModelRateLimited
from sandcell.models.base import (
    Completion,
    Message,
    Model,
    ToolModel,
    ToolsUnsupported,
    tool_calling_of,
)
from sandcell.policy.profiles import Profile, load_profile
from sandcell.spec import (
    NODE_LANGUAGES,
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
_FailureKind = str  # "run", "denied", "held", "untraceable", "format"
_Failure = tuple[_FailureKind, str]


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
        model_settings: Mapping[str, object] | None = None,
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
        self._budget_given = budget is not None
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
        self.model_settings = dict(model_settings or {"name": model.name})
        """How the model was configured, without secrets; kept with a paused conversation."""

    # -- the loop ---------------------------------------------------------------------------

    def ask(
        self,
        question: str,
        inputs: Sequence[str | Path | InputFile] = (),
        exports: Sequence[str] = (),
        *,
        schema: Mapping[str, object] | None = None,
        invariants: Sequence[str] = (),
        workdir: str | Path | None = None,
    ) -> Answer:
        """Answer ``question`` from ``inputs`` (host paths, read-only in the sandbox).

        With ``workdir`` (a repository), every run works in a fresh writable copy of it and
        records what it changed (:mod:`sandcell.changes`): the answer's artifacts carry the
        change set of the last successful run (``changes.patch``), ready for ``sandcell changes
        apply``; the directory itself is never written.

        ``exports`` are globs of files the runs may hand back (charts, tables); ``schema`` and
        ``invariants`` declare a result every run must print as its last JSON line. Raises
        ConfigError only for a request the profile cannot accept at all (too many inputs, an
        export it forbids, a governed tool whose credential is not set on the host); everything
        else ends in an :class:`Answer` with a stop reason.
        """
        if not question.strip():
            raise ConfigError("the question is empty; ask something")
        prof = self.profile
        files = tuple(i if isinstance(i, InputFile) else input_from_path(i) for i in inputs)
        self._admissible(prof, files, exports)
        task = Task(
            question=question,
            profile=prof,
            inputs=files,
            exports=tuple(exports),
            limits=self.limits or prof.limits.defaults,
            schema=schema,
            invariants=tuple(invariants),
            spend=Spending(self.budget),
            messages=[],
            protocol="text" if tool_calling_of(self.model) == "text" else "native",
            # Listed once, on the host: an MCP server's schemas come from the server itself.
            operations=list_operations(prof),
            workdir=None if workdir is None else Path(workdir).resolve(),
        )
        task.messages += [
            Message(role="system", content=self._system_prompt(task)),
            Message(
                role="user",
                content=task_message(
                    question,
                    files,
                    sample_bytes=self.sample_bytes,
                    known_secrets=self.executor.known_secrets,
                    schema=schema,
                    invariants=invariants,
                )
                + _workdir_note(task.workdir),
            ),
        ]
        return self._loop(task)

    def resume(self, approval_id: str, *, budget: Budget | None = None) -> Answer:
        """Go on with a question that stopped with ``awaiting_approval`` once it is decided.

        The held program was run by ``sandcell approve ID`` (:meth:`Executor.run_approved`):
        its recorded result goes to the model as if the run had just happened. A denied
        approval ends in ``approval_denied``. The stored budget applies, with what was spent of
        it; ``budget`` (or one given to this agent) replaces it. Raises ResumeError (a
        ConfigError) for an unknown id, an approval still pending, or a conversation already
        resumed.
        """
        given = budget or (self.budget if self._budget_given else None)
        done = decided(self.executor, approval_id, profile=self.profile, budget=given)
        task, ticket = done.task, done.ticket
        held = task.attempts.pop()
        verdict = "denied" if done.result is None else "approved and ran"
        message = f"resuming: approval {ticket.id} was {verdict}, by {done.decision}"
        self._emit(task, "approval", held.step, message, held.index)
        if done.result is None:
            why = f"denied by {done.decision}"
            task.attempts.append(replace(held, outcome="denied", reason=why))
            return self._stop(
                task, "approval_denied", f"attempt {held.index} was {why}", approval_id=ticket.id
            )
        block = CodeBlock(language=held.language, code=held.code)
        outcome = self._observe(
            task, held.step, held.index, block, done.result, note=None, cut=False
        )
        if isinstance(outcome, Answer):
            return outcome
        if outcome is not None:
            stopped = self._failed(task, held.step, *outcome)
            if stopped is not None:
                return stopped
        return self._loop(task)

    def _loop(self, task: Task) -> Answer:
        while True:
            stop = task.spend.before_step()
            if stop is not None:
                return self._stop(task, stop, task.spend.describe(stop))
            step = task.spend.steps + 1
            self._emit(task, "planning", step, f"asking {self.model.name}")
            try:
                reply = self._read(task, self._complete(task, step))
            except ModelError as exc:
                return self._stop(task, "model_error", f"the model failed: {exc}")
            if reply.plan:
                self._emit(task, "plan", step, "plan: " + reply.plan.splitlines()[0][:200])
            done: Answer | Accepted | Refused | _Failure | None
            if reply.code is not None:
                done = self._run(task, step, reply.code, reply.note)
            elif reply.answer is not None:
                done = check_answer(task, reply.answer)
            elif reply.prose is not None and task.evidence:
                done = check_prose(task, reply.prose, problem=reply.problem or NO_TOOL_CALL)
            else:
                done = "format", feedback.unusable_reply(reply.problem or "")
            if isinstance(done, Accepted):
                return self._answered(task, done)
            if isinstance(done, Answer):
                return done
            if done is None:
                continue
            if isinstance(done, Refused):
                if done.kind == "untraceable":
                    self._emit(task, "rejected", step, "answer rejected: untraceable numbers")
                done = done.kind, done.message
            stopped = self._failed(task, step, *done)
            if stopped is not None:
                return stopped

    # -- talking to the model ---------------------------------------------------------------

    def _complete(self, task: Task, step: int) -> Completion:
        """One model turn, retrying a retryable provider error a bounded number of times."""
        for retry in range(self.model_retries + 1):
            try:
                completion = self._request(task, step)
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
            return completion
        raise AssertionError("unreachable: the last retry either returns or raises")

    def _request(self, task: Task, step: int) -> Completion:
        max_tokens = task.spend.reply_tokens()
        if task.protocol == "native":
            try:
                return cast(ToolModel, self.model).complete(
                    task.messages,
                    max_tokens=max_tokens,
                    temperature=self.temperature,
                    tools=tools_for(task.profile),
                )
            except ToolsUnsupported as exc:
                # The server has no tool calling: the same turn again, in plain text.
                task.protocol = "text"
                task.messages = [
                    Message(role="system", content=self._system_prompt(task)),
                    *as_text(task.messages[1:]),
                ]
                self._emit(task, "retrying", step, f"no tool calling ({exc}); using plain text")
        return self.model.complete(
            task.messages, max_tokens=max_tokens, temperature=self.temperature
        )

    def _read(self, task: Task, completion: Completion) -> Reply:
        """Keep the model's turn in the conversation and read it into a reply."""
        calls = completion.tool_calls
        task.messages.append(Message(role="assistant", content=completion.text, tool_calls=calls))
        if not calls:
            reply = parse_reply(completion.text)
            if task.protocol == "native" and reply.code is None and reply.answer is None:
                reply = replace(reply, problem=NO_TOOL_CALL)
            return reply
        reply = read_tool_calls(completion)
        for call_id in reply.ignored_calls:
            content = feedback.not_run("one tool call at a time; only the first one counts")
            task.messages.append(Message(role="tool", content=content, tool_call_id=call_id))
        task.pending_call = reply.call_id
        return reply

    def _system_prompt(self, task: Task) -> str:
        return system_prompt(
            task.profile,
            limits=task.limits,
            exports=task.exports,
            protocol=task.protocol,
            operations=task.operations,
        )

    # -- running a program ------------------------------------------------------------------

    def _run(
        self, task: Task, step: int, block: CodeBlock, note: str | None
    ) -> Answer | _Failure | None:
        """Run one program: None on success, a failure (kind, feedback), or the final stop."""
        index = len(task.attempts) + 1
        prof, limits = task.profile, task.limits
        refused = None
        if not prof.allows_language(block.language):
            message = feedback.language_refused(block.language, prof.runtime.languages)
            refused = f"profile {prof.name!r} does not run {block.language}"
        elif task.workdir is not None and block.language in NODE_LANGUAGES:
            # A working directory's changes are recorded by a Python frame Node cannot run in
            # (sandcell.changes.run): said to the model, as a language the profile refuses.
            message = feedback.language_refused_in_workdir(block.language)
            refused = f"a {block.language} program cannot run in a working directory"
        if refused is not None:
            task.attempts.append(
                Attempt(
                    index=index,
                    step=step,
                    language=block.language,
                    code=block.code,
                    run_id=None,
                    outcome="denied",
                    reason=refused,
                    feedback=message,
                )
            )
            return "denied", message
        wall = task.spend.run_wall_s(limits.wall_time_s)
        if wall is None:
            return self._stop(
                task, "budget_sandbox_time", task.spend.describe("budget_sandbox_time")
            )
        try:
            request = RunRequest(
                code=block.code,
                language=block.language,
                inputs=task.inputs,
                exports=task.exports,
                limits=limits.with_(wall_time_s=wall),
                display=block.language == "python" and task.workdir is None,
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

        if task.workdir is not None:
            from sandcell.changes.run import run_in_workdir

            result = run_in_workdir(
                self.executor,
                request,
                task.workdir,
                profile=prof,
                schema=task.schema,
                invariants=task.invariants,
                approve=approve,
            )
        else:
            result = self.executor.run(
                request,
                profile=prof,
                schema=task.schema,
                invariants=task.invariants,
                approve=approve,
            )
        cut = wall < limits.wall_time_s
        return self._observe(task, step, index, block, result, note=note, cut=cut)

    def _observe(
        self,
        task: Task,
        step: int,
        index: int,
        block: CodeBlock,
        result: RunResult,
        *,
        note: str | None,
        cut: bool,
    ) -> Answer | _Failure | None:
        """What a run's result means for the question; ``cut``: its wall limit was the budget's."""
        task.spend.add_run(result.usage.wall_ms)
        attempt = attempt_of(index, step, block, result)
        approval_id = attempt.approval_id
        message = f"attempt {index}: {result.outcome.value} (run {result.run_id})"
        self._emit(task, "ran", step, message, index)
        if result.outcome is Outcome.AWAITING_APPROVAL:
            return self._held(task, step, attempt, result)
        task.held = False
        if result.outcome is Outcome.OK:
            task.attempts.append(attempt)
            task.evidence[result.run_id] = evidence_texts(result)
            task.failures = 0
            native = task.protocol == "native"
            task.tell(feedback.observation(index, result, note=note, native=native))
            return None
        approval = approval_of(result)
        if result.outcome is Outcome.DENIED and "denied_by" in approval:
            task.attempts.append(attempt)
            return self._stop(
                task,
                "approval_denied",
                f"attempt {index} was denied by {approval.get('denied_by')}",
                approval_id=approval_id,
            )
        if result.outcome is Outcome.TIMEOUT and cut:
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
        task.attempts.append(replace(attempt, feedback=message))
        return ("denied" if result.outcome is Outcome.DENIED else "run"), message

    def _held(
        self, task: Task, step: int, attempt: Attempt, result: RunResult
    ) -> Answer | _Failure:
        """A run held for approval with nobody to approve it: revise once, else stop and wait."""
        index, approval_id = attempt.index, attempt.approval_id
        if approval_id is not None and self._can_revise(task):
            message = feedback.held_for_approval(index, result, findings=attempt.findings)
            task.attempts.append(replace(attempt, feedback=message))
            task.held = True
            self._withdraw(task, step, approval_id)
            self._emit(
                task, "approval", step, f"attempt {index} needs approval and nobody can approve "
                "now: asking the model to do without what was flagged", index
            )  # fmt: skip
            return "held", message
        task.attempts.append(attempt)
        self._emit(
            task, "approval", step, f"attempt {index} waits for approval {approval_id}", index
        )
        return self._stop(
            task,
            "awaiting_approval",
            f"attempt {index} needs a person's approval: sandcell approve {approval_id}, then "
            f"sandcell ask --resume {approval_id}",
            approval_id=approval_id,
        )

    def _can_revise(self, task: Task) -> bool:
        """Whether the model may try again without what needed approval."""
        if task.profile.approval == "always" or task.held:
            return False  # every run needs a person, or the model already tried without it
        if task.spend.before_step() is not None:
            return False
        if task.spend.run_wall_s(task.limits.wall_time_s) is None:
            return False
        return task.failures < self.max_retries or (self.fallback and not task.fallback_used)

    def _withdraw(self, task: Task, step: int, approval_id: str) -> None:
        # The held request is withdrawn so that nobody approves a run whose result nothing will
        # read; it stays in the store and the record as denied by the agent.
        try:
            self.executor.deny_approval(
                approval_id,
                by=f"agent:{self.model.name}",
                reason="withdrawn: nobody could approve it while the agent ran; the model was "
                "asked to do without what needed approval",
            )
        except ConfigError as exc:  # decided meanwhile by someone else
            self._emit(task, "approval", step, f"could not withdraw {approval_id}: {exc}")

    # -- ending -----------------------------------------------------------------------------

    def _failed(self, task: Task, step: int, kind: _FailureKind, message: str) -> Answer | None:
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
                task.tell(f"{message}\n\n{hint}")
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
        why = _why(kind)
        if kind == "format" and message.startswith(feedback.UNUSABLE):
            # The kind alone does not tell the person watching what the model got wrong.
            problem = message.removeprefix(feedback.UNUSABLE).splitlines()[0].rstrip(".")
            why += f": {problem[:200]}"
        self._emit(task, "retrying", step, f"retrying because {why}")
        task.tell(message)
        return None

    def _answered(self, task: Task, accepted: Accepted) -> Answer:
        how = " (a prose answer, its numbers traced to the runs)" if accepted.prose else ""
        return self._stop(
            task,
            "answered",
            f"answered after {_count(len(task.attempts), 'attempt')}{how}",
            explanation=accepted.explanation,
            figures=accepted.figures,
        )

    def _stop(
        self,
        task: Task,
        reason: StopReason,
        message: str,
        *,
        explanation: str | None = None,
        figures: tuple[Figure, ...] = (),
        approval_id: str | None = None,
    ) -> Answer:
        self._emit(task, "stopped", task.spend.steps, f"stopped: {reason} ({message})")
        if reason == "awaiting_approval" and approval_id is not None:
            path = self.executor.approvals.path.parent / PAUSED_FILENAME
            with PausedStore(path) as store:
                store.save(approval_id, task_to_state(task, model_settings=self.model_settings))
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

    def _emit(
        self, task: Task, kind: EventKind, step: int, message: str, attempt: int | None = None
    ) -> None:
        event = Event(kind=kind, step=step, message=message, attempt=attempt)
        task.events.append(event)
        if self.on_event is not None:
            self.on_event(event)


def _workdir_note(workdir: Path | None) -> str:
    if workdir is None:
        return ""
    return (
        f"\n\nThe working directory of every run is a fresh, writable copy of the repository "
        f"{workdir.name!r} (.git included). Change its files in place and run its tests in the "
        "same program; the tests' exit status is the run's. Nothing carries over between runs: "
        "each run starts again from the original repository. The changes your last successful "
        "run made are the proposed patch, which a person reviews and applies; in your answer, "
        "say what you changed and what the tests printed."
    )


def _why(kind: _FailureKind) -> str:
    return {
        "run": "the run failed",
        "denied": "the policy refused the code",
        "held": "the run needs approval and nobody can approve it now",
        "untraceable": "the answer had numbers no run printed",
        "format": "the reply could not be used",
    }.get(kind, kind)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
