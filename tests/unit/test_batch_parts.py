"""The batch pieces without a sandbox: task lines, verdicts, the results file, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandcell.batch import (
    ResultsFile,
    Task,
    judge,
    load_tasks,
    program_for,
    stdin_for,
    stdout_difference,
)
from sandcell.batch._harness import VERDICT_PREFIX
from sandcell.batch.judge import checked_code, new_secret, strip_verdict
from sandcell.cli.batch import results_path_for
from sandcell.errors import ConfigError
from sandcell.policy.profiles import load_profile
from sandcell.spec import Outcome, RunRequest, RunResult, Usage
from sandcell.status import EXIT_BATCH_FAILED, exit_code_for_batch


def _tasks(tmp_path: Path, *lines: object, profile: str = "unchecked") -> list[Task]:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return load_tasks(path, load_profile(profile))


def _result(outcome: Outcome = Outcome.OK, stdout: str = "", stderr: str = "") -> RunResult:
    return RunResult(
        run_id="r",
        outcome=outcome,
        exit_code=0 if outcome is Outcome.OK else 1,
        signal=None,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=1.0, cpu_ms=None, peak_memory_bytes=None),
        artifacts=(),
        rejected_exports=(),
        enforcement=None,
    )


# -- task lines ---------------------------------------------------------------------------------


def test_defaults_and_relative_inputs(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a\n")
    [t] = _tasks(tmp_path, {"id": 3, "code": "print(1)", "inputs": ["data.csv"], "stdin": "x"})
    assert t.id == "3"
    assert t.line == 1
    assert t.request.language == "python"
    assert t.request.stdin == b"x"
    assert t.request.inputs[0].host_path == (tmp_path / "data.csv").resolve()
    assert t.compare == "strip"
    assert t.test is None


def test_limits_are_checked_against_the_profile(tmp_path: Path) -> None:
    [t] = _tasks(tmp_path, {"id": "a", "code": "", "limits": {"memory_bytes": 64 * 2**20}})
    assert t.request.limits is not None
    assert t.request.limits.memory_bytes == 64 * 2**20
    assert isinstance(t.request.limits.memory_bytes, int)
    with pytest.raises(ConfigError, match=r"line 1: field 'limits': limit wall_time_s=.*ceiling"):
        _tasks(
            tmp_path, {"id": "a", "code": "", "limits": {"wall_time_s": 10**6}}, profile="strict"
        )
    with pytest.raises(ConfigError, match="line 1: field 'limits': unknown limit 'walltime'"):
        _tasks(tmp_path, {"id": "a", "code": "", "limits": {"walltime": 1}})


def test_every_bad_line_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _tasks(
            tmp_path,
            {"id": "a", "code": ""},
            {"id": "a", "code": ""},
            {"id": "", "code": ""},
            {"id": "b"},
            {"id": True, "code": ""},
            {"id": "c", "code": "", "compare": "fuzzy"},
            {"id": "d", "code": "", "test": "  "},
        )
    text = str(err.value)
    assert "6 bad line(s)" in text
    for needle in (
        "line 2: field 'id': 'a' is also the id of line 1",
        "line 3: field 'id': must not be empty",
        "line 4: field 'code': Field required",
        "line 5: field 'id'",
        "line 6: field 'compare'",
        "line 7: field 'test': is empty",
    ):
        assert needle in text, (needle, text)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no tasks"):
        _tasks(tmp_path, "")
    with pytest.raises(ConfigError, match="does not exist"):
        load_tasks(tmp_path / "nope.jsonl", load_profile("unchecked"))


def test_the_task_hash_follows_the_content(tmp_path: Path) -> None:
    [a] = _tasks(tmp_path, {"id": "a", "code": "print(1)"})
    [b] = _tasks(tmp_path, {"code": "print(1)", "id": "a"})
    [c] = _tasks(tmp_path, {"id": "a", "code": "print(2)"})
    assert a.sha256 == b.sha256 != c.sha256


# -- verdicts -------------------------------------------------------------------------------------


def _task(**kw: object) -> Task:
    request = RunRequest(code=str(kw.pop("code", "pass")), language=kw.pop("language", "python"))  # type: ignore[arg-type]
    return Task(id="t", line=1, request=request, sha256="0", **kw)  # type: ignore[arg-type]


def test_stdout_compare_modes() -> None:
    assert stdout_difference("42", "42\n", "strip") is None
    assert stdout_difference("a\nb", "\na  \nb\n\n", "strip") is None
    assert stdout_difference("a\nb", "a\nc\n", "strip") == (
        "stdout differs (strip compare) at line 2: expected 'b', got 'c'"
    )
    assert "line 2 missing" in str(stdout_difference("a\nb", "a\n", "strip"))
    assert "unexpected line 2" in str(stdout_difference("a", "a\nb", "strip"))
    assert stdout_difference("42\n", "42\n", "exact") is None
    assert stdout_difference("42", "42\n", "exact") is not None


def test_only_one_verdict_line_with_this_runs_secret_counts() -> None:
    task = _task(code="def f(): return 1", test="assert f() == 1")
    secret = new_secret()
    assert checked_code(task) == "def f(): return 1\n\nassert f() == 1\n"
    program = program_for(task)
    assert secret not in program
    assert stdin_for(task, secret) == secret.encode() + b"\n"
    line = f"\n{VERDICT_PREFIX}{secret} passed\n"
    done = _result(stderr="warning\n" + line)
    assert judge(task, done, secret) == (True, None)
    assert strip_verdict(done.stderr, secret) == "warning\n"
    passed, why = judge(task, _result(), secret)
    assert not passed
    assert "0 verdicts" in str(why)
    # A verdict with another secret (a program that printed one) does not count.
    assert not judge(task, _result(stderr=f"\n{VERDICT_PREFIX}{new_secret()} passed\n"), secret)[0]
    # Neither does a second line with the right secret (one written after the harness's).
    failed = f"\n{VERDICT_PREFIX}{secret} failed: the test raised AssertionError\n"
    assert not judge(task, _result(stderr=failed + line), secret)[0]
    assert judge(task, _result(stderr=failed), secret) == (False, "the test raised AssertionError")
    assert judge(task, _result(Outcome.ERROR, stderr=line), secret) == (False, None)


def test_a_bash_task_cannot_have_a_test(tmp_path: Path) -> None:
    line = {"id": "b", "language": "bash", "code": "f() { echo 1; }", "test": "[ $(f) = 1 ]"}
    with pytest.raises(ConfigError, match="line 1: field 'test': a bash task cannot have a test"):
        _tasks(tmp_path, line)


def test_task_languages_by_any_name_and_the_profiles_say(tmp_path: Path) -> None:
    js, ts = _tasks(
        tmp_path,
        {"id": "j", "language": "js", "code": "console.log(1)", "expected_stdout": "1"},
        {"id": "t", "language": "TypeScript", "code": "const n: number = 1"},
    )
    assert (js.request.language, ts.request.language) == ("javascript", "typescript")
    with pytest.raises(ConfigError, match="line 1: field 'language': unknown language 'ruby'"):
        _tasks(tmp_path, {"id": "r", "language": "ruby", "code": "puts 1"})
    with pytest.raises(ConfigError, match="profile 'analysis' does not allow javascript programs"):
        _tasks(tmp_path, {"id": "j", "language": "js", "code": "1"}, profile="analysis")
    test = {"id": "j", "language": "js", "code": "1", "test": "assert True"}
    with pytest.raises(ConfigError, match="a javascript task cannot have a test"):
        _tasks(tmp_path, test)


def test_no_expectation_means_ok_passes() -> None:
    assert judge(_task(), _result(), new_secret()) == (True, None)
    assert judge(_task(), _result(Outcome.TIMEOUT), new_secret()) == (False, None)


# -- results file ---------------------------------------------------------------------------------


def test_results_file_resume_and_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with ResultsFile(path) as r:
        assert r.recorded == {}
        r.append({"id": "a", "passed": True})
        r.append({"id": "b", "passed": False})
    path.write_bytes(path.read_bytes() + b'{"id": "c", "pa')
    with ResultsFile(path) as r:
        assert set(r.recorded) == {"a", "b"}
        assert r.truncated_line == 3
        r.append({"id": "c", "passed": True})
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == ["a", "b", "c"]
    with ResultsFile(path, restart=True) as r:
        assert r.recorded == {}
    assert path.read_bytes() == b""


def test_results_file_refuses_damage_and_a_second_writer(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a"}\n[1]\n')
    with pytest.raises(ConfigError, match="line 2 has no task id"):
        ResultsFile(path)
    path.write_text('{"id": "a"}\n')
    with (
        ResultsFile(path),
        pytest.raises(ConfigError, match="being written by another sandcell batch"),
    ):
        ResultsFile(path)


# -- the rest ------------------------------------------------------------------------------------


def test_results_path_and_exit_codes() -> None:
    assert results_path_for(Path("/x/tasks.jsonl")) == Path("/x/tasks.results.jsonl")
    assert results_path_for(Path("t.txt")) == Path("t.txt.results.jsonl")
    assert exit_code_for_batch(all_passed=True, interrupted_by=None) == 0
    assert exit_code_for_batch(all_passed=False, interrupted_by=None) == EXIT_BATCH_FAILED == 1
    assert exit_code_for_batch(all_passed=True, interrupted_by=15) == 143


def test_resume_reruns_infra_errors_and_keeps_the_latest_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    lines = [
        {"id": "a", "outcome": "infra_error", "passed": False},
        {"id": "b", "outcome": "infra_error", "passed": False},
        {"id": "b", "outcome": "ok", "passed": True},
        {"id": "c", "outcome": "error", "passed": False},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with ResultsFile(path) as results:
        assert set(results.recorded) == {"b", "c"}
        assert results.recorded["b"].passed and results.recorded["b"].outcome == "ok"
