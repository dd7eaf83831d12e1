"""Validation of a run's declared result, and :func:`validate_output` over a whole run.

Invariants, the leak scan and terminal safety have their own files
(``test_validation_invariants.py``, ``test_validation_redact.py``,
``test_validation_terminal.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandcell import validation
from sandcell.errors import ConfigError
from sandcell.validation import (
    check_schema,
    extract_result,
    load_schema,
    scan_artifact,
    validate_output,
    validate_result,
)
from sandcell.validation.result import MAX_ERRORS, json_path

RATES = {
    "type": "object",
    "required": ["rows"],
    "properties": {
        "rows": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["rate"],
                "properties": {"rate": {"type": "number", "minimum": 0, "maximum": 100}},
            },
        }
    },
}


def _github_token() -> str:
    # Built from parts so that no secret-shaped literal is in the repository.
    return "ghp" + "_" + "A1b2C3d4E5f6" * 3


def test_all_names_the_public_api() -> None:
    for name in validation.__all__:
        assert getattr(validation, name) is not None
    defined_here = {
        name
        for name in dir(validation)
        if not name.startswith("_")
        and getattr(getattr(validation, name), "__module__", "").startswith("sandcell.validation")
    }
    assert defined_here <= set(validation.__all__)


# --------------------------------------------------------------------------------------------
# extract_result


def test_result_is_the_last_json_line_of_stdout() -> None:
    stdout = 'loading data\n{"progress": 1}\n{"rate": 42}\ndone\n'
    assert extract_result(stdout, None) == ({"rate": 42}, None)


def test_result_can_be_an_array_line() -> None:
    assert extract_result("x\n[1, 2]\n", None) == ([1, 2], None)


def test_result_is_the_whole_stdout_when_it_is_pretty_printed() -> None:
    stdout = json.dumps({"rows": [{"rate": 1}]}, indent=2)
    assert extract_result(stdout, None) == ({"rows": [{"rate": 1}]}, None)


def test_a_bare_number_on_stdout_is_a_result() -> None:
    assert extract_result("42\n", None) == (42, None)


def test_result_file_wins_over_stdout() -> None:
    value, error = extract_result('{"from": "stdout"}\n', b'{"from": "file"}')
    assert (value, error) == ({"from": "file"}, None)


def test_result_file_with_a_byte_order_mark_is_read() -> None:
    assert extract_result("", b'\xef\xbb\xbf{"a": 1}') == ({"a": 1}, None)


def test_no_json_on_stdout_is_explained() -> None:
    value, error = extract_result("the answer is 42, probably\n", None)
    assert value is None
    assert error is not None
    assert "no line of stdout is a JSON object or array" in error
    assert "json.dumps" in error


def test_empty_stdout_is_explained() -> None:
    value, error = extract_result("  \n", None)
    assert value is None
    assert error is not None
    assert "stdout is empty" in error


def test_invalid_result_file_is_explained() -> None:
    value, error = extract_result('{"ok": 1}', b'{"rate": ')
    assert value is None
    assert error is not None
    assert error.startswith("the result file is not valid JSON")
    assert "line 1 column" in error


def test_result_file_that_is_not_utf8_is_explained() -> None:
    _, error = extract_result("", b'{"a": "\xff"}')
    assert error is not None
    assert "not UTF-8" in error


def test_nan_is_not_json() -> None:
    # NaN compares false with everything: it would pass "minimum": 0 unnoticed.
    assert extract_result("", b'{"rate": NaN}')[0] is None
    value, error = extract_result('{"rate": NaN}\n', None)
    assert value is None
    assert error is not None


def test_deeply_nested_result_is_an_error_not_a_crash() -> None:
    value, error = extract_result("", b"[" * 100_000 + b"]" * 100_000)
    assert value is None
    assert error is not None


# --------------------------------------------------------------------------------------------
# JSON Schema


def test_schema_pass() -> None:
    value = {"rows": [{"rate": 0}, {"rate": 99.5}]}
    report = validate_result(value, schema=RATES)
    assert report.ok
    assert report.value == value
    assert report.errors == ()


def test_schema_failure_names_the_path() -> None:
    value = {"rows": [{"rate": 1}, {"rate": 2}, {"rate": 3}, {"rate": -5}]}
    report = validate_result(value, schema=RATES)
    assert not report.ok
    assert report.value is None
    assert report.errors == ("$.rows[3].rate: -5 is less than the minimum of 0",)


def test_schema_failures_at_the_root_and_missing_keys() -> None:
    assert validate_result([], schema=RATES).errors == ("$: [] is not of type 'object'",)
    assert validate_result({}, schema=RATES).errors == ("$: 'rows' is a required property",)


def test_odd_keys_are_quoted_in_paths() -> None:
    assert json_path(["a b", 0, "ok_1", "é"]) == '$["a b"][0].ok_1["\\u00e9"]'


def test_at_most_max_errors_are_reported() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    report = validate_result(["x"] * 100, schema=schema)
    assert len(report.errors) == MAX_ERRORS
    assert report.errors[0] == "$[0]: 'x' is not of type 'integer'"
    assert "more errors not shown" in report.errors[-1]


def test_huge_values_are_shortened_in_messages() -> None:
    report = validate_result("x" * 10_000, schema={"type": "integer"})
    assert len(report.errors[0]) < 400


def test_formats_are_checked() -> None:
    schema = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}}
    assert validate_result({"day": "2024-02-29"}, schema=schema).ok
    report = validate_result({"day": "yesterday"}, schema=schema)
    assert report.errors == ("$.day: 'yesterday' is not a 'date'",)


def test_declared_draft_is_honoured() -> None:
    # In draft 7, "items" as an array is a tuple schema; in 2020-12 it would be invalid.
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    check_schema(schema)
    assert not validate_result([1], schema=schema).ok


def test_invalid_schema_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"invalid JSON Schema at \$\.type: 'nope' is not valid"):
        check_schema({"type": "nope"})
    with pytest.raises(ConfigError, match="invalid JSON Schema"):
        validate_result(1, schema={"minimum": "zero"})


def test_unknown_dialect_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown \$schema"):
        check_schema({"$schema": "https://example.com/my-dialect"})


def test_remote_refs_are_never_fetched() -> None:
    schema = {"$ref": "https://example.com/schema.json"}
    with pytest.raises(ConfigError, match="cannot be resolved; schemas must be self-contained"):
        validate_result({}, schema=schema)


def test_local_refs_work() -> None:
    schema = {"$defs": {"pct": {"minimum": 0, "maximum": 100}}, "$ref": "#/$defs/pct"}
    assert validate_result(50, schema=schema).ok
    assert validate_result(150, schema=schema).errors == (
        "$: 150 is greater than the maximum of 100",
    )


def test_load_schema(tmp_path: Path) -> None:
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(RATES), encoding="utf-8")
    assert load_schema(path) == RATES


def test_load_schema_errors_name_the_file(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"schema file '.*bad\.json' is not valid JSON"):
        load_schema(bad_json)
    bad_schema = tmp_path / "wrong.json"
    bad_schema.write_text('{"type": 3}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"schema file '.*wrong\.json': invalid JSON Schema"):
        load_schema(bad_schema)
    not_object = tmp_path / "list.json"
    not_object.write_text("[]", encoding="utf-8")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        load_schema(not_object)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_schema(tmp_path / "missing.json")


# --------------------------------------------------------------------------------------------
# pydantic models


def test_model_pass_hands_on_the_instance() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Rate(pydantic.BaseModel):
        name: str
        rate: float = pydantic.Field(ge=0, le=100)

    report = validate_result({"name": "a", "rate": 12}, model=Rate)
    assert report.ok
    assert isinstance(report.value, Rate)
    assert report.value.rate == 12.0


def test_model_failure_names_the_path() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Row(pydantic.BaseModel):
        rate: float = pydantic.Field(ge=0)

    class Table(pydantic.BaseModel):
        rows: list[Row]

    report = validate_result({"rows": [{"rate": 1}, {"rate": -5}, {}]}, model=Table)
    assert not report.ok
    assert report.value is None
    assert report.errors == (
        "$.rows[1].rate: Input should be greater than or equal to 0",
        "$.rows[2].rate: Field required",
    )


# --------------------------------------------------------------------------------------------
# validate_output


def test_valid_output() -> None:
    report = validate_output(
        stdout='working\n{"rows": [{"rate": 50}]}\n',
        stderr="",
        result_file=None,
        schema=RATES,
        invariants=['len(result["rows"]) == 1'],
    )
    assert report.valid
    assert report.errors == ()
    assert report.value == {"rows": [{"rate": 50}]}


def test_invalid_output_hands_nothing_on() -> None:
    report = validate_output(
        stdout='{"rows": [{"rate": 500}]}\n', stderr="", result_file=None, schema=RATES
    )
    assert not report.valid
    assert report.value is None
    assert report.errors == ("$.rows[0].rate: 500 is greater than the maximum of 100",)


def test_failed_invariant_makes_output_invalid() -> None:
    report = validate_output(
        stdout='{"rows": [{"rate": 5}], "count": 2}\n',
        stderr="",
        schema=RATES,
        invariants=['result["count"] == len(result["rows"])'],
    )
    assert not report.valid
    assert report.value is None
    assert report.errors == (
        """invariant 'result["count"] == len(result["rows"])' does not hold""",
    )


def test_missing_result_when_one_is_declared() -> None:
    report = validate_output(stdout="no json here\n", stderr="", schema=RATES)
    assert not report.valid
    assert len(report.errors) == 1
    assert report.errors[0].startswith("no result")


def test_nothing_declared_is_valid() -> None:
    report = validate_output(stdout="hello\n", stderr="")
    assert report.valid
    assert report.value is None
    report = validate_output(stdout='{"a": 1}\n', stderr="")
    assert report.valid
    assert report.value == {"a": 1}


def test_output_is_redacted_but_not_neutralised() -> None:
    token = _github_token()
    report = validate_output(stdout=f"\x1b[31mred\x1b[0m {token}\n", stderr=f"err {token}")
    assert report.stdout == "\x1b[31mred\x1b[0m [REDACTED:github_token]\n"
    assert report.stderr == "err [REDACTED:github_token]"
    assert [(leak.stream, leak.kind) for leak in report.leaks] == [
        ("stdout", "github_token"),
        ("stderr", "github_token"),
    ]


def test_the_result_is_redacted_before_it_is_handed_on() -> None:
    token = _github_token()
    report = validate_output(
        stdout=json.dumps({"rows": [{"rate": 1}], "note": token}) + "\n",
        stderr="",
        schema=RATES,
    )
    assert report.valid
    assert report.value == {"rows": [{"rate": 1}], "note": "[REDACTED:github_token]"}
    assert token not in report.stdout
    # Reported once, from stdout: the same secret in the parsed result is not a second leak.
    assert [leak.stream for leak in report.leaks] == ["stdout"]


def test_a_secret_hidden_by_a_json_escape_is_still_redacted() -> None:
    token = _github_token()
    escaped = "\\u00" + format(ord(token[0]), "x") + token[1:]
    report = validate_output(stdout='{"note": "' + escaped + '"}\n', stderr="", invariants=[])
    assert report.value == {"note": "[REDACTED:github_token]"}
    assert [leak.stream for leak in report.leaks] == ["result"]


def test_leaks_in_the_result_file_are_reported() -> None:
    secret = "correct-horse-battery-staple"
    report = validate_output(
        stdout="",
        stderr="",
        result_file=json.dumps({"db": secret}).encode(),
        known_secrets=[secret],
    )
    assert report.valid
    assert report.value == {"db": "[REDACTED:known_secret]"}
    assert [(leak.stream, leak.kind) for leak in report.leaks] == [("result", "known_secret")]


def test_invariants_see_the_json_form_of_a_model() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Share(pydantic.BaseModel):
        rate: float

    report = validate_output(
        stdout='{"rate": "12.5"}\n',
        stderr="",
        model=Share,
        invariants=["0 <= result['rate'] <= 100", lambda v: isinstance(v, dict)],
    )
    assert report.valid, report.errors
    assert isinstance(report.value, Share)
    assert report.value.rate == 12.5


def test_scan_artifact_reports_without_changing_anything() -> None:
    token = _github_token()
    data = b"\x89PNG\r\n\x1a\n\x00\xff" + token.encode() + b"\x00"
    leaks = scan_artifact(data, path="out/plot.png")
    assert [(leak.stream, leak.kind, leak.start) for leak in leaks] == [
        ("out/plot.png", "github_token", 10)
    ]
    assert data[leaks[0].start : leaks[0].end] == token.encode()


def test_a_model_validator_that_crashes_is_an_error_line() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Fragile(pydantic.BaseModel):
        n: int

        @pydantic.field_validator("n")
        @classmethod
        def explode(cls, value: int) -> int:
            raise LookupError("boom")

    report = validate_result({"n": 1}, model=Fragile)
    assert report.errors == ("$: the model Fragile raised LookupError: boom",)
