"""Native tool calls read into replies, the text form of a tool conversation, scripted turns."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from sandcell.agent.protocol import parse_reply
from sandcell.agent.tools import NO_TOOL_CALL, TOOLS, as_text, read_tool_calls, tools_for
from sandcell.errors import ConfigError, ModelError
from sandcell.models.base import Completion, Message, TokenUsage, ToolCall
from sandcell.models.fake import Scripted, ScriptedModel, call, turns_from_json
from sandcell.policy.profiles import load_profile


def completion(*calls: ToolCall, text: str = "") -> Completion:
    return Completion(text=text, usage=TokenUsage(), model="m", tool_calls=calls)


def test_the_two_tools_have_schemas() -> None:
    run_code, answer = TOOLS
    assert (run_code.name, answer.name) == ("run_code", "answer")
    assert run_code.parameters["required"] == ["code"]
    assert answer.parameters["required"] == ["explanation"]


def test_run_code_is_read_into_a_code_block() -> None:
    c = call("run_code", code="echo hi", language="bash")
    reply = read_tool_calls(completion(c, text="plan"))
    assert reply.code is not None and (reply.code.language, reply.code.code) == (
        "bash",
        "echo hi\n",
    )
    assert (reply.plan, reply.call_id, reply.ignored_calls, reply.problem) == (
        "plan",
        c.id,
        (),
        None,
    )


def test_run_code_takes_every_language_name_and_offers_what_the_profile_runs() -> None:
    for name, lang in (("js", "javascript"), ("TypeScript", "typescript"), ("sh", "bash")):
        reply = read_tool_calls(completion(call("run_code", code="x", language=name)))
        assert reply.code is not None and reply.code.language == lang
    (analysis, _) = tools_for(load_profile("analysis"))
    assert analysis.parameters["properties"]["language"]["enum"] == ["python"]
    assert tools_for(load_profile("strict")) == TOOLS
    assert tools_for(load_profile("unchecked")) == TOOLS
    assert TOOLS[0].parameters["properties"]["language"]["enum"] == [
        "python",
        "bash",
        "javascript",
        "typescript",
    ]


def test_answer_keeps_the_precision_it_was_written_with() -> None:
    args = '{"explanation": "7.20% converted", "figures": [{"name": "r", "value": 0.0720}]}'
    reply = read_tool_calls(completion(ToolCall(id="x", name="answer", arguments=args)))
    assert reply.answer is not None
    (figure,) = reply.answer.figures
    assert figure.shown == "0.0720" and figure.number == Decimal("0.0720")


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("run_code", "{not json", "not valid JSON"),
        ("run_code", '["print(1)"]', "must be an object"),
        ("run_code", '{"code": "  "}', "needs the program"),
        ("run_code", '{"code": "x", "language": "ruby"}', "python, bash, javascript, typescript"),
        ("answer", '{"figures": []}', "non-empty 'explanation'"),
        ("search_web", "{}", "no tool 'search_web'"),
    ],
)
def test_a_broken_call_is_a_problem_told_to_the_model(
    name: str, arguments: str, problem: str
) -> None:
    reply = read_tool_calls(completion(ToolCall(id="c1", name=name, arguments=arguments)))
    assert reply.problem is not None and problem in reply.problem
    assert reply.call_id == "c1"


def test_run_code_wins_over_an_answer_in_the_same_turn() -> None:
    done, run = call("answer", explanation="x"), call("run_code", code="print(1)")
    reply = read_tool_calls(completion(done, run))
    assert reply.code is not None and reply.call_id == run.id
    assert reply.ignored_calls == (done.id,)
    assert reply.note is not None and "answer call was ignored" in reply.note


def test_a_tool_conversation_in_text_form() -> None:
    run = call("run_code", code="print(2)")
    done = call("answer", explanation="two")
    messages = [
        Message(role="user", content="q"),
        Message(role="assistant", content="Plan.", tool_calls=(run,)),
        Message(role="tool", content="It printed 2.", tool_call_id=run.id),
        Message(role="assistant", content="", tool_calls=(done,)),
    ]
    text = as_text(messages)
    assert [m.role for m in text] == ["user", "assistant", "user", "assistant"]
    assert text[1].content == "Plan.\n\n```python\nprint(2)\n```"
    assert parse_reply(text[1].content).code is not None
    assert parse_reply(text[3].content).answer is not None
    assert all(not m.tool_calls and m.tool_call_id is None for m in text)


def test_a_reply_without_blocks_keeps_its_prose() -> None:
    reply = parse_reply("The rate is 6.77%.")
    assert reply.prose == "The rate is 6.77%." and reply.problem is not None
    assert parse_reply("```python\nprint(1)\n```").prose is None
    assert "run_code" in NO_TOOL_CALL


def test_script_files_hold_text_and_tool_calls() -> None:
    turns = turns_from_json(
        ["plain", {"text": "t", "tool_calls": [{"name": "run_code", "arguments": {"code": "1"}}]}],
        where="f.json",
    )
    assert turns[0] == "plain"
    second = turns[1]
    assert isinstance(second, Scripted) and second.text == "t"
    assert json.loads(second.tool_calls[0].arguments) == {"code": "1"}
    assert ScriptedModel(turns).tool_calling == "native"
    assert ScriptedModel(["a"]).tool_calling == "text"


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        (3, "neither a string nor an object"),
        ({"txt": "x"}, "unknown keys"),
        ({"tool_calls": [{"arguments": {}}]}, "without a 'name'"),
        ({"tool_calls": [{"name": "run_code", "arguments": "print(1)"}]}, "not an object"),
    ],
)
def test_script_file_errors_name_the_reply(item: object, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"f.json: reply 2 .*{problem}"):
        turns_from_json(["ok", item], where="f.json")


def test_a_script_out_of_turns_is_a_model_error_and_skip_moves_on() -> None:
    model = ScriptedModel(["one", "two"])
    model.skip(1)
    assert model.complete([Message(role="user", content="q")], max_tokens=5).text == "two"
    with pytest.raises(ModelError, match="2 turns and was asked for turn 3"):
        model.complete([Message(role="user", content="q")], max_tokens=5)


def test_the_prompt_and_the_fallback_speak_of_node_only_where_the_profile_runs_it() -> None:
    from sandcell.agent.feedback import fallback
    from sandcell.agent.prompt import system_prompt

    for name, node in (("analysis", False), ("strict", True), ("unchecked", True)):
        p = load_profile(name)
        for protocol in ("text", "native"):
            text = system_prompt(p, limits=p.limits.defaults, exports=[], protocol=protocol)
            assert ("Node.js 22" in text) is node, (name, protocol)
            assert ("javascript" in text) is node, (name, protocol)
        assert ("```typescript" in system_prompt(p, limits=p.limits.defaults, exports=[])) is node
    assert "not javascript" in fallback(3, language="javascript", python_allowed=True)
    assert "Python" not in fallback(3, language="javascript", python_allowed=False)
