"""The reply protocol: code blocks, the final answer block, and replies that break it."""

from __future__ import annotations

from decimal import Decimal

from sandcell.agent.protocol import parse_reply


def test_a_python_block_is_the_code_and_the_text_around_it_the_plan() -> None:
    reply = parse_reply("I will count the rows.\n\n```python\nprint(len([1, 2]))\n```\n")
    assert reply.problem is None
    assert reply.code is not None
    assert reply.code.language == "python"
    assert reply.code.code == "print(len([1, 2]))\n"
    assert reply.plan == "I will count the rows."


def test_bash_and_aliases_are_recognised() -> None:
    for tag, lang in (("bash", "bash"), ("sh", "bash"), ("py", "python"), ("Python3", "python")):
        reply = parse_reply(f"```{tag}\necho hi\n```")
        assert reply.code is not None and reply.code.language == lang


def test_javascript_and_typescript_blocks_are_code() -> None:
    for tag, lang in (
        ("js", "javascript"),
        ("javascript", "javascript"),
        ("ts", "typescript"),
        ("TypeScript", "typescript"),
    ):
        reply = parse_reply(f"Plan.\n```{tag}\nconsole.log(1)\n```")
        assert reply.problem is None and reply.code is not None
        assert (reply.code.language, reply.code.code) == (lang, "console.log(1)\n")


def test_only_the_first_code_block_runs_and_the_model_is_told() -> None:
    reply = parse_reply("```python\nprint(1)\n```\nand\n```python\nprint(2)\n```")
    assert reply.code is not None and reply.code.code == "print(1)\n"
    assert reply.note is not None and "only the first of your 2 code blocks ran" in reply.note


def test_an_answer_next_to_code_is_ignored_until_the_output_is_seen() -> None:
    reply = parse_reply('```python\nprint(1)\n```\n```answer\n{"explanation": "1"}\n```')
    assert reply.code is not None and reply.answer is None
    assert reply.note is not None and "answer block was ignored" in reply.note


def test_the_answer_block_keeps_the_shown_precision_of_numbers() -> None:
    reply = parse_reply(
        "Done.\n```answer\n"
        '{"explanation": "The rate was 7.20%.", "figures": ['
        '{"name": "rate", "value": 7.20, "unit": "%", "run": 2},'
        '{"name": "best day", "value": "2026-11-05", "run": "abc123def"}]}\n```'
    )
    assert reply.problem is None and reply.answer is not None
    rate, day = reply.answer.figures
    assert rate.shown == "7.20" and rate.number == Decimal("7.20") and rate.unit == "%"
    assert rate.run == "2"
    assert day.number is None and day.shown == "2026-11-05" and day.run == "abc123def"


def test_tilde_fences_and_longer_fences_work() -> None:
    reply = parse_reply("~~~~python\nx = '```'\nprint(x)\n~~~~")
    assert reply.code is not None and "print(x)" in reply.code.code


def test_replies_that_break_the_protocol_say_how_to_fix_them() -> None:
    cases = {
        "just prose, no block": "no code block and no answer block",
        "```\nprint(1)\n```": "neither code nor an answer",
        "```answer\nnot json\n```": "not valid JSON",
        '```answer\n["a"]\n```': "must be a JSON object",
        '```answer\n{"figures": []}\n```': "non-empty 'explanation'",
        '```answer\n{"explanation": "x", "figures": {}}\n```': "'figures' must be a list",
        '```answer\n{"explanation": "x", "figures": [{"name": "a"}]}\n```': "needs a 'value'",
        '```answer\n{"explanation": "x", "figures": [{"value": 1}]}\n```': "needs a 'name'",
        '```answer\n{"explanation": "x", "figures": [{"name": "a", "value": true}]}\n```': (
            "needs a 'value'"
        ),
    }
    for text, expected in cases.items():
        reply = parse_reply(text)
        assert reply.code is None and reply.answer is None, text
        assert reply.problem is not None and expected in reply.problem, (text, reply.problem)
