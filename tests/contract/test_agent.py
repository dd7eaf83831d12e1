"""The agent loop through the real executor and sandbox, with scripted models.

Every test runs real programs in real sandboxes under a profile with its checks on (strict,
analysis or supervised); only the model is fake.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sandcell import Executor, Limits
from sandcell.agent import Agent, Answer, Budget, Event, as_tool
from sandcell.errors import ModelError, ModelRateLimited
from sandcell.models.base import Message
from sandcell.models.fake import FunctionModel, ScriptedModel, Turn

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
