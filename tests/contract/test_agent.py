"""The agent loop through the real executor and sandbox, with scripted models.

Every test runs real programs in real sandboxes under a profile with its checks on (strict,
analysis or supervised); only the model is fake.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tests.contract.test_model_adapters import ProviderServer, Received, Reply

from sandcell import Executor, Limits, RunRequest
from sandcell.agent import Agent, Answer, Budget, Event, as_tool
from sandcell.agent.paused import ResumeError
from sandcell.agent.tools import tools_for
from sandcell.errors import ConfigError, ModelError, ModelRateLimited
from sandcell.models.anthropic_messages import AnthropicMessagesModel
from sandcell.models.base import Message
from sandcell.models.fake import FunctionModel, Scripted, ScriptedModel, Turn, call
from sandcell.models.openai_chat import OpenAIChatModel
from sandcell.policy.profiles import load_profile

SALES = Path(__file__).resolve().parents[2] / "examples" / "sales.csv"

# The week's overall conversion rate: 94 paid conversions of 1388 leads.
RATE_CODE = """\
import csv
rows = list(csv.DictReader(open("sales.csv")))
leads = sum(int(r["leads"]) for r in rows)
paid = sum(int(r["paid_conversions"]) for r in rows)
print("leads:", leads)
print("paid:", paid)
print("rate %:", paid / leads * 100)
"""
RATE_ANSWER = (
    '```answer\n{"explanation": "Of 1,388 leads, 94 converted: 6.77%.", '
    '"figures": [{"name": "conversion rate", "value": 6.77, "unit": "%", "run": "%RUN%"}]}\n```'
)


def code(text: str, language: str = "python") -> str:
    return f"Plan: compute it.\n\n```{language}\n{text}```\n"


def answer(run: int) -> str:
    return RATE_ANSWER.replace("%RUN%", str(run))


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executor]:
    if os.geteuid() != 0:
        pytest.skip("the agent's contract tests use the in-process executor, which runs as root")
    with Executor(home=tmp_path_factory.mktemp("agent-home"), profile="strict") as ex:
        yield ex


def ask(
    executor: Executor,
    turns: Sequence[Turn],
    *,
    question: str = "What is the conversion rate in sales.csv?",
    **options: object,
) -> tuple[Answer, ScriptedModel]:
    model = ScriptedModel(turns)
    agent = Agent(executor, model, **options)  # type: ignore[arg-type]
    return agent.ask(question, inputs=[SALES]), model


def last_user(messages: Sequence[Message]) -> str:
    return messages[-1].content


def test_correct_first_try(executor: Executor) -> None:
    events: list[Event] = []
    result, model = ask(executor, [code(RATE_CODE), answer(1)], on_event=events.append)
    assert result.stop_reason == "answered", result.message
    assert result.explanation is not None and "6.77%" in result.explanation
    (figure,) = result.figures
    assert figure.value == 6.77 and figure.shown == "6.77" and figure.unit == "%"
    (attempt,) = result.attempts
    assert attempt.ok and attempt.code == RATE_CODE and "rate %: 6.77" in attempt.stdout
    assert figure.run_id == attempt.run_id
    # The model saw the sandbox rules, the input and its sample, then the real output.
    first = model.calls[0]
    assert "No network" in first[0].content and "/inputs/NAME" in first[0].content
    assert "/inputs/sales.csv" in first[1].content and "2026-11-02,search" in first[1].content
    assert "rate %: 6.77" in last_user(model.calls[1])
    kinds = [e.kind for e in events]
    assert kinds[:4] == ["planning", "plan", "running", "ran"] and kinds[-1] == "stopped"
    assert result.steps == 2 and result.tokens.total > 0 and result.sandbox_s > 0


def test_run_ids_in_the_answer_resolve_in_the_audit_log(executor: Executor) -> None:
    result, _ = ask(executor, [code("print(1 / 0)\n"), code(RATE_CODE), answer(2)])
    assert result.answered
    assert len(result.run_ids) == 2
    for run_id in result.run_ids:
        entry = executor.audit.get(run_id)
        assert entry is not None, run_id
    assert result.figures[0].run_id == result.run_ids[1]


def test_a_crash_is_fixed_on_retry(executor: Executor) -> None:
    result, model = ask(executor, [code("print(1 / 0)\n"), code(RATE_CODE), answer(2)])
    assert result.stop_reason == "answered"
    crash, fixed = result.attempts
    assert crash.outcome == "error" and fixed.ok
    feedback = last_user(model.calls[1])
    assert "ZeroDivisionError" in feedback and crash.run_id is not None and crash.run_id in feedback
    assert crash.feedback == feedback
    assert any(e.kind == "retrying" for e in result.events)


def test_the_retry_event_says_what_was_wrong_with_the_reply(executor: Executor) -> None:
    bad = Scripted(tool_calls=(call("answer", text="The rate is 6.77%."),))
    result, _ = ask(executor, [code(RATE_CODE), bad, answer(1)])
    assert result.stop_reason == "answered"
    (retry,) = [e.message for e in result.events if e.kind == "retrying"]
    assert retry.startswith("retrying because the reply could not be used: "), retry
    assert "'explanation'" in retry


def test_a_policy_denial_is_worked_around(executor: Executor) -> None:
    native = "import ctypes\nprint(ctypes.sizeof(ctypes.c_int))\n"
    result, model = ask(executor, [code(native), code(RATE_CODE), answer(2)])
    assert result.stop_reason == "answered"
    denied = result.attempts[0]
    assert denied.outcome == "denied" and denied.run_id is not None
    assert any(f["rule_id"] == "py.native" for f in denied.findings)
    assert "py.native" in last_user(model.calls[1])
    assert "refused the program before it ran" in last_user(model.calls[1])


def test_a_timeout_goes_back_to_the_model(executor: Executor) -> None:
    result, model = ask(
        executor,
        [code("while True:\n    pass\n"), code(RATE_CODE), answer(2)],
        limits=Limits(wall_time_s=1.0),
    )
    assert result.stop_reason == "answered"
    assert result.attempts[0].outcome == "timeout"
    assert "time limit" in last_user(model.calls[1])


def test_an_invalid_result_goes_back_to_the_model(executor: Executor) -> None:
    bad = 'import json\nprint(json.dumps({"rate": 677}))\n'
    good = RATE_CODE + 'import json\nprint(json.dumps({"rate": round(paid / leads * 100, 2)}))\n'
    model = ScriptedModel([code(bad), code(good), answer(2)])
    result = Agent(executor, model).ask(
        "What is the conversion rate in percent?",
        inputs=[SALES],
        invariants=['0 <= result["rate"] <= 100'],
    )
    assert result.stop_reason == "answered", result.message
    first = result.attempts[0]
    assert first.outcome == "invalid_output" and first.validation_errors
    assert "failed validation" in last_user(model.calls[1])
    assert "0 <= result" in model.calls[0][1].content  # the model was told the invariant


def test_retries_are_bounded_then_a_fallback_then_a_stop(executor: Executor) -> None:
    model = FunctionModel(lambda _m: code("raise SystemExit(3)\n"))
    result = Agent(executor, model, max_retries=1).ask("Rate?", inputs=[SALES])
    assert result.stop_reason == "retries_exhausted"
    assert not result.answered and result.explanation is None
    # 2 tries (1 retry), then the fallback turn, then the stop: every attempt's run is kept.
    assert [a.outcome for a in result.attempts] == ["error", "error", "error"]
    assert all(executor.audit.get(rid) is not None for rid in result.run_ids)
    assert "simplest approach" in model.calls[2][-1].content
    assert [e.kind for e in result.events].count("fallback") == 1


def test_bash_the_profile_does_not_run_falls_back_to_python(executor: Executor) -> None:
    result, model = ask(
        executor,
        [code("wc -l sales.csv\n", "bash"), code(RATE_CODE), answer(2)],
        profile="analysis",
    )
    assert result.stop_reason == "answered"
    refused = result.attempts[0]
    assert refused.outcome == "denied" and refused.run_id is None
    assert "does not run" in last_user(model.calls[1])


def test_approval_required_then_approved(executor: Executor) -> None:
    seen = []

    def approve(ticket: object) -> bool:
        seen.append(ticket)
        return True

    result, _ = ask(executor, [code(RATE_CODE), answer(1)], profile="supervised", approve=approve)
    assert result.stop_reason == "answered", result.message
    assert len(seen) == 1
    entry = executor.audit.get(result.run_ids[0])
    assert entry is not None
    assert result.attempts[0].approval_id is not None


def test_approval_required_then_denied(executor: Executor) -> None:
    result, model = ask(executor, [code(RATE_CODE)], profile="supervised", approve=lambda _t: False)
    assert result.stop_reason == "approval_denied"
    assert result.attempts[0].outcome == "denied"
    assert result.approval_id is not None
    assert len(model.calls) == 1  # the model gets no chance to look for a way around a person


def test_without_a_callback_the_agent_stops_awaiting_approval(executor: Executor) -> None:
    result, _ = ask(executor, [code(RATE_CODE)], profile="supervised")
    assert result.stop_reason == "awaiting_approval"
    assert result.approval_id is not None
    assert f"sandcell approve {result.approval_id}" in result.message
    assert executor.approvals.get(result.approval_id).status == "pending"


def test_an_answer_with_a_number_no_run_produced_is_caught(executor: Executor) -> None:
    made_up = RATE_ANSWER.replace("6.77%", "7.5%").replace("%RUN%", "1")
    result, model = ask(executor, [code(RATE_CODE), made_up, answer(1)])
    assert result.stop_reason == "answered"
    rejection = last_user(model.calls[2])
    assert "'7.5%' in the explanation" in rejection
    assert any(e.kind == "rejected" for e in result.events)


def test_an_answer_that_stays_untraceable_stops(executor: Executor) -> None:
    made_up = RATE_ANSWER.replace("6.77", "7.50").replace("%RUN%", "1")
    result, _ = ask(
        executor,
        [code(RATE_CODE), made_up, made_up],
        max_retries=1,
        fallback=False,
    )
    assert result.stop_reason == "untraceable_answer"
    assert result.explanation is None and result.figures == ()


def test_an_answer_before_any_run_is_refused(executor: Executor) -> None:
    result, model = ask(executor, [answer(1), code(RATE_CODE), answer(1)])
    assert result.stop_reason == "answered"
    assert "none has yet" in last_user(model.calls[1])


def test_the_step_budget_stops(executor: Executor) -> None:
    model = FunctionModel(lambda _m: code("print(1 / 0)\n"))
    result = Agent(executor, model, max_retries=10, budget=Budget(max_steps=2)).ask(
        "Rate?", inputs=[SALES]
    )
    assert result.stop_reason == "budget_steps"
    assert result.steps == 2 and len(result.attempts) == 2


def test_the_token_budget_stops(executor: Executor) -> None:
    result, _ = ask(executor, [code("print(1 / 0)\n")], budget=Budget(max_tokens=300))
    assert result.stop_reason == "budget_tokens"
    assert result.tokens.total >= 300 and result.steps == 1


def test_the_sandbox_time_budget_stops_and_bounds_the_run(executor: Executor) -> None:
    slow = "import time\ntime.sleep(30)\n"
    result, _ = ask(executor, [code(slow)], budget=Budget(max_sandbox_s=1.0))
    assert result.stop_reason == "budget_sandbox_time"
    (attempt,) = result.attempts
    assert attempt.outcome == "timeout"  # cut to the budget, not the profile's 30 s


def test_a_model_error_stops_with_its_reason(executor: Executor) -> None:
    def fail(_m: Sequence[Message]) -> str:
        raise ModelError("the provider refused the key (401)", status=401)

    result = Agent(executor, FunctionModel(fail)).ask("Rate?", inputs=[SALES])
    assert result.stop_reason == "model_error"
    assert "401" in result.message and result.attempts == ()


def test_a_rate_limit_is_waited_out(executor: Executor) -> None:
    calls = {"n": 0}
    turns = [code(RATE_CODE), answer(1)]

    def flaky(_m: Sequence[Message]) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ModelRateLimited("slow down", retry_after_s=0.01)
        return turns[min(calls["n"] - 2, 1)]

    result = Agent(executor, FunctionModel(flaky)).ask("Rate?", inputs=[SALES])
    assert result.stop_reason == "answered"
    assert any("again in" in e.message for e in result.events)


def test_as_tool_gives_other_frameworks_a_plain_function(executor: Executor) -> None:
    tool = as_tool(executor, ScriptedModel([code(RATE_CODE), answer(1)]))
    assert tool.__name__ == "sandcell_ask" and tool.__doc__
    params = tool.parameters  # type: ignore[attr-defined]
    assert params["required"] == ["question"] and "inputs" in params["properties"]
    out = tool("What is the conversion rate?", [str(SALES)])
    assert out["answered"] is True and out["stop_reason"] == "answered"
    assert out["figures"][0]["value"] == 6.77  # type: ignore[index]


# --- Held for approval with nobody to approve ------------------------------------------------

# Importing subprocess is a py.process warning: under strict it waits for a person.
HELD_CODE = "import subprocess\n" + RATE_CODE


def test_a_held_run_goes_back_to_the_model_when_nobody_can_approve(executor: Executor) -> None:
    result, model = ask(executor, [code(HELD_CODE), code(RATE_CODE), answer(2)])
    assert result.stop_reason == "answered", result.message
    held, ran = result.attempts
    assert held.outcome == "awaiting_approval" and ran.ok
    told = last_user(model.calls[1])
    assert "nobody can approve it now" in told and "py.process" in told
    assert held.feedback == told
    # The held request was withdrawn: nobody is left to approve a run whose result nothing reads.
    assert held.approval_id is not None
    ticket = executor.approvals.get(held.approval_id)
    assert ticket.status == "denied" and str(ticket.decided_by).startswith("agent:")
    assert any("retrying because the run needs approval" in e.message for e in result.events)


def test_a_second_held_run_stops_awaiting_approval(executor: Executor) -> None:
    result, model = ask(executor, [code(HELD_CODE), code(HELD_CODE)])
    assert result.stop_reason == "awaiting_approval"
    first, second = result.attempts
    assert result.approval_id == second.approval_id != first.approval_id
    assert executor.approvals.get(str(first.approval_id)).status == "denied"
    assert executor.approvals.get(str(result.approval_id)).status == "pending"
    assert f"sandcell ask --resume {result.approval_id}" in result.message
    assert len(model.calls) == 2


def test_a_profile_that_approves_every_run_stops_at_once(executor: Executor) -> None:
    # Rewriting cannot avoid a person there: the model is not asked again.
    result, model = ask(executor, [code(RATE_CODE), answer(1)], profile="supervised")
    assert result.stop_reason == "awaiting_approval" and len(model.calls) == 1


def test_a_held_run_without_a_retry_left_stops_awaiting_approval(executor: Executor) -> None:
    result, model = ask(executor, [code(HELD_CODE)], max_retries=0, fallback=False)
    assert result.stop_reason == "awaiting_approval" and len(model.calls) == 1
    assert executor.approvals.get(str(result.approval_id)).status == "pending"


# --- Resuming after a person decided ---------------------------------------------------------


def _waiting(executor: Executor, **options: object) -> Answer:
    result, _ = ask(executor, [code(RATE_CODE)], profile="supervised", **options)
    assert result.stop_reason == "awaiting_approval" and result.approval_id
    return result


def test_resume_after_approve_goes_on_from_the_approved_run(executor: Executor) -> None:
    waiting = _waiting(executor, budget=Budget(max_steps=4))
    approval_id = str(waiting.approval_id)
    with pytest.raises(ResumeError, match="still pending"):
        Agent(executor, ScriptedModel([])).resume(approval_id)
    approved = executor.run_approved(approval_id)  # what `sandcell approve ID` does
    assert approved.ok
    model = ScriptedModel([answer(1)])
    result = Agent(executor, model).resume(approval_id)
    assert result.stop_reason == "answered", result.message
    (attempt,) = result.attempts
    assert attempt.ok and attempt.run_id == approved.run_id
    assert result.figures[0].run_id == approved.run_id
    # The model saw the whole conversation, then the approved run's real output.
    (conversation,) = model.calls
    assert conversation[1].content.startswith("Question: What is the conversion rate")
    assert conversation[-1].role == "user" and "rate %: 6.77" in conversation[-1].content
    assert approved.run_id in conversation[-1].content
    # What was spent before the stop carries over, and so does the stored budget.
    assert result.steps == 2 and result.tokens.total > waiting.tokens.total
    assert result.profile == "supervised"
    assert [e.kind for e in result.events][: len(waiting.events)] == [
        e.kind for e in waiting.events
    ]
    with pytest.raises(ResumeError, match="already resumed"):
        Agent(executor, ScriptedModel([answer(1)])).resume(approval_id)


def test_resume_keeps_the_stored_budget(executor: Executor) -> None:
    waiting = _waiting(executor, budget=Budget(max_steps=1))
    executor.run_approved(str(waiting.approval_id))
    result = Agent(executor, ScriptedModel([answer(1)])).resume(str(waiting.approval_id))
    assert result.stop_reason == "budget_steps" and result.steps == 1


def test_resume_after_deny_stops_approval_denied(executor: Executor) -> None:
    waiting = _waiting(executor)
    executor.deny_approval(str(waiting.approval_id), reason="not today", by="alice")
    model = ScriptedModel([answer(1)])
    result = Agent(executor, model).resume(str(waiting.approval_id))
    assert result.stop_reason == "approval_denied"
    assert "alice: not today" in result.message
    assert result.attempts[0].outcome == "denied" and model.calls == []


def test_resume_of_what_cannot_be_resumed_says_why(executor: Executor) -> None:
    agent = Agent(executor, ScriptedModel([]))
    with pytest.raises(ConfigError, match="no approval"):
        agent.resume("feedfacecafe")
    # A run held outside the agent has an approval but no conversation.
    held = executor.run(RunRequest(code="import subprocess\n"))
    approval = held.policy["approval"]["id"]  # type: ignore[index]
    with pytest.raises(ResumeError, match="no conversation waits"):
        agent.resume(str(approval))


def test_a_native_conversation_resumes_into_the_pending_tool_call(executor: Executor) -> None:
    run = call("run_code", code=RATE_CODE)
    model = ScriptedModel([Scripted(tool_calls=(run,))])
    waiting = Agent(executor, model, profile="supervised").ask("Rate?", inputs=[SALES])
    assert waiting.stop_reason == "awaiting_approval"
    executor.run_approved(str(waiting.approval_id))
    done = call("answer", explanation="6.77% of the 1,388 leads converted.")
    resumed = ScriptedModel([Scripted(tool_calls=(done,))])
    result = Agent(executor, resumed).resume(str(waiting.approval_id))
    assert result.stop_reason == "answered", result.message
    last = resumed.calls[0][-1]
    assert last.role == "tool" and last.tool_call_id == run.id and "6.77" in last.content
    assert resumed.tools[0] == tools_for(load_profile("supervised"))


# --- Prose answers ----------------------------------------------------------------------------


def test_a_prose_answer_whose_numbers_trace_is_accepted(executor: Executor) -> None:
    prose = "Of 1,388 leads, 94 paid: the conversion rate is 6.77%."
    result, model = ask(executor, [code(RATE_CODE), prose])
    assert result.stop_reason == "answered", result.message
    assert result.explanation == prose and result.figures == ()
    assert "prose" in result.message and len(model.calls) == 2


def test_a_prose_answer_with_an_untraced_number_is_sent_back(executor: Executor) -> None:
    wrong = "The conversion rate is 7.5% of 1,388 leads."
    result, model = ask(executor, [code(RATE_CODE), wrong, answer(1)])
    assert result.stop_reason == "answered"
    told = last_user(model.calls[2])
    assert "'7.5%'" in told and "reads as a final answer" in told
    assert "1,388" not in told.split("printed:")[1].split("Either")[0]


def test_prose_that_plans_more_work_is_not_an_answer(executor: Executor) -> None:
    plan = "The file has 1388 leads; let me compute the rate per day next."
    result, model = ask(executor, [code(RATE_CODE), plan, answer(1)])
    assert result.stop_reason == "answered"
    assert "no code block and no answer block" in last_user(model.calls[2])


def test_prose_before_any_run_is_not_an_answer(executor: Executor) -> None:
    result, model = ask(executor, ["The rate is about 7%.", code(RATE_CODE), answer(1)])
    assert result.stop_reason == "answered"
    assert "no code block and no answer block" in last_user(model.calls[1])


# --- Model failures ---------------------------------------------------------------------------


def test_a_scripted_model_out_of_replies_is_a_model_error_stop(executor: Executor) -> None:
    result, _ = ask(executor, [code("print(1 / 0)\n")])
    assert result.stop_reason == "model_error"
    assert "has 1 turns" in result.message and "add turns" in result.message
    assert [a.outcome for a in result.attempts] == ["error"]


# --- Native tool calling ----------------------------------------------------------------------


def test_native_tool_calls_with_a_fake_model(executor: Executor) -> None:
    run = call("run_code", code=RATE_CODE, language="python")
    done = call(
        "answer",
        explanation="Of 1,388 leads, 94 converted: 6.77%.",
        figures=[{"name": "conversion rate", "value": 6.77, "unit": "%", "run": 1}],
    )
    model = ScriptedModel(
        [Scripted(text="Counting.", tool_calls=(run,)), Scripted(tool_calls=(done,))]
    )
    result = Agent(executor, model).ask("What is the conversion rate?", inputs=[SALES])
    assert result.stop_reason == "answered", result.message
    assert result.figures[0].value == 6.77 and result.figures[0].run_id == result.run_ids[0]
    assert model.tools == [tools_for(executor.profile)] * 2
    system, _, turn, observed = model.calls[1]
    assert "run_code runs a program" in system.content and "```answer" not in system.content
    assert turn.tool_calls == (run,) and turn.content == "Counting."
    assert observed.role == "tool" and observed.tool_call_id == run.id
    assert "rate %: 6.77" in observed.content and "call the answer tool" in observed.content


def test_every_tool_call_of_a_turn_is_answered(executor: Executor) -> None:
    first, second = call("run_code", code=RATE_CODE), call("run_code", code="print(2)")
    done = call("answer", explanation="6.77% converted.")
    model = ScriptedModel([Scripted(tool_calls=(first, second)), Scripted(tool_calls=(done,))])
    result = Agent(executor, model).ask("Rate?", inputs=[SALES])
    assert result.stop_reason == "answered" and len(result.attempts) == 1
    answered = {m.tool_call_id: m.content for m in model.calls[1] if m.role == "tool"}
    assert set(answered) == {first.id, second.id}
    assert answered[second.id].startswith("Not run")
    assert "only the first of your 2 run_code calls ran" in answered[first.id]


def test_a_bad_tool_call_goes_back_as_its_result(executor: Executor) -> None:
    bad = call("run_code", language="cobol", code="DISPLAY 1")
    model = ScriptedModel(
        [Scripted(tool_calls=(bad,)), code(RATE_CODE), answer(1)], tool_calling="native"
    )
    result = Agent(executor, model).ask("Rate?", inputs=[SALES])
    assert result.stop_reason == "answered"
    told = model.calls[1][-1]
    assert told.role == "tool" and told.tool_call_id == bad.id and "cobol" in told.content


# --- The agent over the providers' wire formats -----------------------------------------------


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    srv = ProviderServer()
    yield srv
    srv.close()


def _chat(message: dict[str, object]) -> Reply:
    return Reply(
        body={
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    )


def _openai_calls(name: str, arguments: dict[str, object]) -> Reply:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return _chat(
        {
            "content": None,
            "tool_calls": [{"id": f"c{name}", "type": "function", "function": function}],
        }
    )


ANSWER_ARGS: dict[str, object] = {
    "explanation": "Of 1,388 leads, 94 converted: 6.77%.",
    "figures": [{"name": "conversion rate", "value": 6.77, "unit": "%", "run": 1}],
}


def test_the_agent_over_openai_tool_calling(executor: Executor, provider: ProviderServer) -> None:
    replies = iter(
        [_openai_calls("run_code", {"code": RATE_CODE}), _openai_calls("answer", ANSWER_ARGS)]
    )
    provider.reply = lambda _r: next(replies)
    with OpenAIChatModel("m", api_key="k", base_url=provider.url) as model:
        result = Agent(executor, model).ask("What is the conversion rate?", inputs=[SALES])
    assert result.stop_reason == "answered", result.message
    assert result.figures[0].value == 6.77
    first, second = (r.body for r in provider.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["run_code", "answer"]  # type: ignore[index, union-attr]
    tool_result = second["messages"][-1]  # type: ignore[index]
    assert tool_result["role"] == "tool" and tool_result["tool_call_id"] == "crun_code"
    assert "rate %: 6.77" in tool_result["content"]


def test_the_agent_falls_back_to_text_when_the_server_rejects_tools(
    executor: Executor, provider: ProviderServer
) -> None:
    texts = iter([code(RATE_CODE), answer(1)])

    def reply(r: Received) -> Reply:
        if "tools" in r.body:
            return Reply(status=400, body={"error": {"message": "tools is not supported"}})
        return _chat({"content": next(texts)})

    provider.reply = reply
    events: list[Event] = []
    with OpenAIChatModel("m", api_key="k", base_url=provider.url) as model:
        result = Agent(executor, model, on_event=events.append).ask("Rate?", inputs=[SALES])
        assert model.tool_calling == "text"
    assert result.stop_reason == "answered", result.message
    bodies = [r.body for r in provider.requests]
    assert ["tools" in b for b in bodies] == [True, False, False]
    system = bodies[1]["messages"][0]["content"]  # type: ignore[index]
    assert "```answer" in system and "run_code runs a program" not in system
    assert any("no tool calling" in e.message for e in events)


def test_the_agent_over_anthropic_tool_use(executor: Executor, provider: ProviderServer) -> None:
    def message(name: str, arguments: dict[str, object]) -> Reply:
        return Reply(
            body={
                "id": "msg",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": [
                    {"type": "tool_use", "id": f"t{name}", "name": name, "input": arguments}
                ],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }
        )

    replies = iter([message("run_code", {"code": RATE_CODE}), message("answer", ANSWER_ARGS)])
    provider.reply = lambda _r: next(replies)
    with AnthropicMessagesModel("claude-test", api_key="k", base_url=provider.url) as model:
        result = Agent(executor, model).ask("What is the conversion rate?", inputs=[SALES])
    assert result.stop_reason == "answered", result.message
    second = provider.requests[1].body
    last = second["messages"][-1]  # type: ignore[index]
    assert last["role"] == "user"
    (block,) = last["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "trun_code"
    assert "rate %: 6.77" in block["content"]
