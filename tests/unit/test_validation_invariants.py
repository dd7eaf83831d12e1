"""Invariants: Python callables, and the textual language and its whitelist."""

from __future__ import annotations

import pytest

from sandcell.errors import ConfigError
from sandcell.validation import check_invariants, parse_invariant
from sandcell.validation.invariants import MAX_BUILT_LENGTH, MAX_INT_BITS, MAX_STEPS

RESULT = {
    "rate": 42.5,
    "count": 3,
    "rows": [{"n": 1, "name": "a"}, {"n": 2, "name": "b"}, {"n": 3, "name": "c"}],
    "tags": ["x", "y"],
    "pairs": [[1, 2], [3, 4]],
    "flag": True,
    "missing_value": None,
}


# --------------------------------------------------------------------------------------------
# Python callables


def test_callable_true_and_false() -> None:
    def positive(value: object) -> bool:
        return isinstance(value, dict) and value["rate"] > 0

    assert check_invariants(RESULT, [positive]) == ()
    assert check_invariants({"rate": -1}, [positive]) == ("invariant #1 (positive) does not hold",)


def test_callable_that_raises_is_a_failure_with_the_exception_text() -> None:
    def missing_key(value: object) -> bool:
        return isinstance(value, dict) and value["nope"] > 1

    failures = check_invariants(RESULT, [lambda v: True, missing_key])
    assert failures == ("invariant #2 (missing_key) raised KeyError: 'nope'",)


def test_only_true_is_true() -> None:
    failures = check_invariants(RESULT, [lambda v: 1, lambda v: "yes"])
    assert failures == (
        "invariant #1 (<lambda>) gave 1 (int), not True or False",
        "invariant #2 (<lambda>) gave 'yes' (str), not True or False",
    )


# --------------------------------------------------------------------------------------------
# The textual language: what holds


@pytest.mark.parametrize(
    "source",
    [
        '0 <= result["rate"] <= 100',
        'result["count"] == len(result["rows"])',
        'all(r["n"] > 0 for r in result["rows"])',
        'any(r["name"] == "b" for r in result["rows"])',
        'sum(r["n"] for r in result["rows"]) == 6',
        '[r["n"] * 2 for r in result["rows"] if r["n"] > 1] == [4, 6]',
        'all(a < b for a, b in result["pairs"])',
        'all(x != y for x in result["tags"] for y in result["rows"])',
        'result["tags"][-1] == "y" and result["tags"][:1] == ["x"]',
        'result["rows"][0]["name"] in ("a", "z")',
        '"rate" in result and "other" not in result',
        'result["missing_value"] is None and result["flag"] is True',
        'not result["flag"] == False',
        'max(result["tags"]) == "y" and min(1, 2, 3) == 1 and abs(-2) == 2',
        'isinstance(result["rate"], (int, float)) and isinstance(result["tags"], list)',
        'isinstance(result["count"], int) and not isinstance(result["flag"], int)',
        'result["count"] / 2 == 1.5 and result["count"] // 2 == 1 and result["count"] % 2 == 1',
        'result["tags"][0] + "!" == "x!" and -result["count"] == -3',
    ],
)
def test_textual_invariants_that_hold(source: str) -> None:
    assert check_invariants(RESULT, [source]) == ()


def test_textual_invariant_that_does_not_hold() -> None:
    assert check_invariants({"rate": 120}, ['0 <= result["rate"] <= 100']) == (
        """invariant '0 <= result["rate"] <= 100' does not hold""",
    )


def test_errors_while_evaluating_are_failures() -> None:
    failures = check_invariants(
        RESULT,
        [
            'result["absent"] > 0',
            'result["tags"][5] == "x"',
            'result["count"] / 0 == 1',
            'result["tags"] < 3',
            'len(result["rows"])',
        ],
    )
    assert failures == (
        """invariant 'result["absent"] > 0' could not be evaluated: key 'absent' is missing""",
        """invariant 'result["tags"][5] == "x"' could not be evaluated: index 5 is out of """
        "range (length 2)",
        """invariant 'result["count"] / 0 == 1' raised ZeroDivisionError: division by zero""",
        """invariant 'result["tags"] < 3' raised TypeError: '<' not supported between """
        "instances of 'list' and 'int'",
        """invariant 'len(result["rows"])' gave 3 (int), not True or False""",
    )


def test_repetition_of_strings_and_lists_is_refused() -> None:
    # "x" * 10**9 would take the host's memory: * and % are for numbers only.
    failures = check_invariants({"n": 10**9}, ['len("x" * result["n"]) > 0'])
    assert failures == (
        """invariant 'len("x" * result["n"]) > 0' could not be evaluated: '*' needs two """
        "numbers, got str and int",
    )
    assert check_invariants({"s": "%s"}, ['result["s"] % 1 == "1"']) != ()


def test_step_budget_stops_runaway_invariants() -> None:
    value = list(range(5000))
    source = "all(a == a for a in result for b in result)"
    failures = check_invariants(value, [source])
    assert failures == (
        f"invariant {source!r} could not be evaluated: it took more than {MAX_STEPS} "
        "evaluation steps",
    )


def test_parse_at_request_time() -> None:
    invariant = parse_invariant('result["rate"] > 0')
    assert invariant.source == 'result["rate"] > 0'
    assert invariant({"rate": 1}) is True
    assert check_invariants({"rate": 0}, [invariant]) == (
        """invariant 'result["rate"] > 0' does not hold""",
    )


# --------------------------------------------------------------------------------------------
# The textual language: what is refused, at parse time, naming the construct


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("result.__class__", r"attribute access \('\.__class__'\)"),
        ("result.__class__.__bases__[0].__subclasses__()", "'.__subclasses__"),
        ('result["rows"].copy()', r"calling a method \('\.copy\(\.\.\.\)'\)"),
        ('result["a"].real > 0', r"attribute access \('\.real'\)"),
        ('__import__("os")', "a call to '__import__'"),
        ('open("/etc/passwd")', "a call to 'open'"),
        ('getattr(result, "x")', "a call to 'getattr'"),
        ('eval("1")', "a call to 'eval'"),
        ("type(result)", "a call to 'type'"),
        ("lambda: 1", "lambda is not allowed"),
        ("(lambda: result)()", "lambda is not allowed"),
        ('result["rows"][0]()', "the call"),
        ("os", "the name 'os'"),
        ("__builtins__", "the name '__builtins__'"),
        ("len", "'len' used as a value"),
        ("2 ** 100000000", "the operator '\\*\\*'"),
        ("1 << 100000", "the operator '<<'"),
        ("~result", "the operator '~'"),
        ('f"{result}"', "f-string"),
        ("{1: 2}", "dict literal"),
        ("{1, 2}", "set literal"),
        ("{k: 1 for k in result}", "dict comprehension"),
        ("1 if result else 2", "conditional expression"),
        ("result[result['k']]", "subscript with a computed key"),
        ("[*result]", r"star expression \(\*x\)"),
        ("len(*result)", "keyword or star arguments"),
        ("max(result, key=len)", "keyword or star arguments"),
        ("isinstance(result, object)", "isinstance\\(\\) with 'object'"),
        ("isinstance(result, type(result))", "isinstance\\(\\) with 'type\\(result\\)'"),
        ("[result for result in result]", "the loop variable name 'result'"),
        ("[1 for len in result]", "the loop variable name 'len'"),
        ("[1 for x.y in result]", "the loop target"),
        ('result["x"] is 3', "'is' with anything but None, True or False"),
        ("b'x' == result", "a constant of type bytes"),
        ("result ==", "not a valid expression"),
        ("x = 1", "not a valid expression"),
    ],
)
def test_refused_constructs(source: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_invariant(source)
    # The same error from check_invariants: a textual invariant is parsed before any runs.
    with pytest.raises(ConfigError, match=named):
        check_invariants(RESULT, [source])


def test_error_message_lists_what_is_allowed() -> None:
    with pytest.raises(ConfigError) as info:
        parse_invariant('__import__("os").system("id")')
    message = str(info.value)
    assert message.startswith("""invariant '__import__("os").system("id")': """)
    assert "allowed calls: abs, all, any, isinstance, len, max, min, sum" in message


def test_overlong_and_overdeep_invariants_are_refused() -> None:
    with pytest.raises(ConfigError, match="characters long"):
        parse_invariant("1 == 1 and " * 1000 + "True")
    with pytest.raises(ConfigError):
        parse_invariant("-" * 4000 + "1 == 1")


def test_building_large_values_uses_up_the_step_budget() -> None:
    value = {"s": "x" * 1_000_000, "xs": list(range(100_000))}
    source = 'len([result["s"] + result["s"] for x in result["xs"]]) > 0'
    failures = check_invariants(value, [source])
    assert len(failures) == 1
    assert "evaluation steps" in failures[0]


def test_sum_starts_from_a_number() -> None:
    assert check_invariants({"xs": [[1], [2]]}, ['sum(result["xs"], []) == [1, 2]']) == (
        """invariant 'sum(result["xs"], []) == [1, 2]' could not be evaluated: sum() starts """
        "from a number only",
    )
    assert check_invariants({"xs": [1, 2]}, ['sum(result["xs"], 10) == 13']) == ()


# --------------------------------------------------------------------------------------------
# Attacks on the host's time and memory: every value the language builds is bounded


def _chain(start: str, step: str, depth: int) -> str:
    """``all(True for v0 in [START] for v1 in [STEP(v0)] ...)``: each clause builds on the last,
    the only way the language has to feed a value back into itself."""
    clauses = [f"for v0 in [{start}]"]
    clauses += [f"for v{i} in [{step.format(f'v{i - 1}')}]" for i in range(1, depth + 1)]
    return f"all(True {' '.join(clauses)})"


def test_repeated_squaring_stops_at_the_integer_size_bound() -> None:
    # 19 squarings of 3 took 5.6 s and each further one tripled that: 3 ** (2 ** 19).
    source = _chain('result["n"]', "{0} * {0}", 40)
    failures = check_invariants({"n": 3}, [source])
    assert len(failures) == 1
    assert f"over {MAX_INT_BITS} bits" in failures[0]


def test_repeated_addition_of_a_large_integer_stops_at_the_bound() -> None:
    source = _chain('result["n"]', "{0} + {0}", 40)
    failures = check_invariants({"n": 2 ** (MAX_INT_BITS - 20)}, [source])
    assert len(failures) == 1
    assert f"over {MAX_INT_BITS} bits" in failures[0]


def test_repeated_doubling_of_strings_and_lists_stops_before_it_is_built() -> None:
    for start in ('result["s"]', 'result["xs"]'):
        source = _chain(start, "{0} + {0}", 60)
        failures = check_invariants({"s": "ab", "xs": [1, 2]}, [source])
        assert len(failures) == 1, start
        assert f"over {MAX_BUILT_LENGTH}" in failures[0], failures[0]


def test_scans_of_large_lists_are_charged_by_their_length() -> None:
    # One step per "in" would let 100,000 x 100,000 comparisons through the budget.
    value = {"xs": list(range(100_000))}
    for source in (
        'all(x in result["xs"] for x in result["xs"])',
        'all(max(result["xs"]) >= x for x in result["xs"])',
        'all(result["xs"][:] == result["xs"] for x in result["xs"])',
    ):
        failures = check_invariants(value, [source])
        assert len(failures) == 1, source
        assert "evaluation steps" in failures[0], failures[0]


def test_an_invariant_has_a_cpu_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # Steps bound the count of operations; the CPU budget bounds what any uncharged operation
    # costs. Make the clock run out at once to see the budget enforced.
    import sandcell.validation._invariant_lang as lang

    monkeypatch.setattr(lang, "MAX_CPU_SECONDS", 0.0)
    value = {"xs": list(range(50_000))}
    failures = check_invariants(value, ['all(x >= 0 for x in result["xs"])'])
    assert len(failures) == 1
    assert "s of CPU time" in failures[0]
