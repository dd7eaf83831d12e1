"""The policy layer through the executor: real sandboxed runs for every decision path.

Each test runs programs through :class:`sandcell.Executor` with a fresh data directory, under a
built-in or a user profile: allowed, denied, held for approval and then approved or denied,
validated (schema, invariants, pydantic model, result file) and redacted. Refusals of the request
itself (limits above a ceiling, exports or languages the profile forbids) raise ConfigError before
anything is recorded. After every test the audit log's hash chain must still verify.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from sandcell import ConfigError, Executor, Limits, RunRequest
from sandcell.policy.approvals import ApprovalError, Ticket
from sandcell.spec import Outcome, RunResult, input_from_path

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="real sandboxed runs through the in-process executor need root"
)

SUBPROCESS_ID = (
    'import subprocess; print(subprocess.run(["id", "-u"], capture_output=True, text=True).stdout)'
)
# A GitHub-token-shaped string built from parts, so that no token appears in this file.
TOKEN_CODE = 'print("gh" + "p_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7j")'
RATE_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"rate": {"type": "number", "maximum": 100}},
    "required": ["rate"],
}
USER_PROFILE = """description = "a test profile"
approval = "on_findings"
[runtime]
languages = ["python"]
"""


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[Executor]:
    """A strict executor with its own data directory; its audit log must verify afterwards."""
    # known_secrets=(): the host's secret-looking variables must not change what is redacted.
    with Executor(home=tmp_path / "home", profile="strict", known_secrets=()) as executor:
        yield executor
        report = executor.audit.verify()
        assert report.ok, report.problems


def _record(ex: Executor, result: RunResult) -> dict[str, object]:
    entry = ex.audit.get(result.run_id)
    assert entry is not None, f"run {result.run_id} was not recorded"
    record = entry.record
    assert isinstance(record, dict)
    return record


def _rule_ids(policy: object) -> set[str]:
    assert isinstance(policy, dict)
    findings = policy["findings"]
    assert isinstance(findings, list)
    return {str(f["rule_id"]) for f in findings}


def _approval_id(result: RunResult) -> str:
    assert result.outcome is Outcome.AWAITING_APPROVAL, result.reason
    assert result.policy is not None
    approval = result.policy["approval"]
    assert isinstance(approval, dict)
    assert approval["status"] == "pending"
    return str(approval["id"])


def _not_run(result: RunResult) -> None:
    """The result of a request that never reached a sandbox."""
    assert result.usage.wall_ms == 0
    assert result.enforcement is None
    assert result.exit_code is None
    assert result.stdout == result.stderr == ""


# --- allow and deny ---------------------------------------------------------------------------


def test_allow_runs_and_records_the_profile(ex: Executor) -> None:
    result = ex.run(RunRequest(code="print(6*7)"))
    assert result.outcome is Outcome.OK, result.reason
    assert result.stdout == "42\n"
    policy = result.policy
    assert policy is not None
    profile = policy["profile"]
    assert isinstance(profile, dict)
    assert profile["name"] == "strict"
    assert profile["source"] == "builtin:strict"
    assert profile["sha256"] == ex.profile.sha256
    assert len(str(profile["sha256"])) == 64
    assert policy["verdict"] == "allow"
    assert policy["findings"] == []
    assert result.enforcement is not None
    record = _record(ex, result)
    assert record["outcome"] == "ok"
    assert record["policy"] == policy


def test_deny_runs_nothing_and_is_recorded(ex: Executor) -> None:
    result = ex.run(RunRequest(code="import ctypes\nprint('ran')"))
    assert result.outcome is Outcome.DENIED
    _not_run(result)
    assert "py.native" in result.reason
    assert result.policy is not None
    assert result.policy["verdict"] == "deny"
    assert "py.native" in _rule_ids(result.policy)
    record = _record(ex, result)
    assert record["outcome"] == "denied"
    assert record["enforcement"] is None
    assert "py.native" in _rule_ids(record["policy"])
    # Nothing waits for a person: a deny finding is final.
    assert ex.approvals.list(None) == []


# --- approval ---------------------------------------------------------------------------------


def test_approval_then_approve_runs_the_stored_request(ex: Executor) -> None:
    waiting = ex.run(RunRequest(code=SUBPROCESS_ID))
    approval_id = _approval_id(waiting)
    _not_run(waiting)
    assert {"py.process", "py.import"} <= _rule_ids(waiting.policy)
    assert approval_id in waiting.reason
    assert _record(ex, waiting)["outcome"] == "awaiting_approval"
    ticket = ex.approvals.get(approval_id)
    assert ticket.status == "pending"
    assert ticket.request.code == SUBPROCESS_ID

    result = ex.run_approved(approval_id, by="tester", reason="ok")
    assert result.outcome is Outcome.OK, result.reason
    assert result.stdout.strip() == "1000"  # the sandbox's unprivileged uid
    assert result.policy is not None
    approval = result.policy["approval"]
    assert isinstance(approval, dict)
    assert approval["approval_id"] == approval_id
    assert approval["approved_by"] == "tester"
    assert approval["decision_reason"] == "ok"
    assert _record(ex, result)["policy"] == result.policy

    ticket = ex.approvals.get(approval_id)
    assert ticket.status == "ran"
    assert ticket.run_id == result.run_id
    # One approval, one run.
    with pytest.raises(ApprovalError, match="ran"):
        ex.run_approved(approval_id, by="tester")
    with pytest.raises(ConfigError):
        ex.run_approved(approval_id, by="tester")


def test_an_approved_run_that_cannot_start_waits_again(ex: Executor, tmp_path: Path) -> None:
    # The input is gone by the time a person approves: nothing can run, and the ticket must not
    # be left approved forever (only a pending ticket can be approved).
    data = tmp_path / "data.csv"
    data.write_text("a\n1\n")
    waiting = ex.run(RunRequest(code=SUBPROCESS_ID, inputs=(input_from_path(data),)))
    approval_id = _approval_id(waiting)
    data.unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        ex.run_approved(approval_id, by="tester", reason="ok")
    ticket = ex.approvals.get(approval_id)
    assert ticket.status == "pending"
    assert ticket.decided_by is None

    data.write_text("a\n1\n")
    result = ex.run_approved(approval_id, by="tester", reason="ok")
    assert result.outcome is Outcome.OK, result.reason
    assert result.stdout.strip() == "1000"
    assert ex.approvals.get(approval_id).status == "ran"


def test_approval_then_deny_is_recorded_and_final(ex: Executor) -> None:
    approval_id = _approval_id(ex.run(RunRequest(code=SUBPROCESS_ID)))
    before = ex.audit.count()
    result = ex.deny_approval(approval_id, reason="no", by="tester")
    assert result.outcome is Outcome.DENIED
    _not_run(result)
    assert "no" in result.reason
    assert result.policy is not None
    approval = result.policy["approval"]
    assert isinstance(approval, dict)
    assert approval["denied_by"] == "tester"
    assert approval["decision_reason"] == "no"
    assert ex.audit.count() == before + 1
    record = _record(ex, result)
    assert record["outcome"] == "denied"
    assert record["code"] == SUBPROCESS_ID

    ticket = ex.approvals.get(approval_id)
    assert ticket.status == "denied"
    assert ticket.decision_reason == "no"
    with pytest.raises(ApprovalError, match="denied"):
        ex.run_approved(approval_id, by="tester")
    assert ex.audit.count() == before + 1


def test_approve_callback_decides_at_once(ex: Executor) -> None:
    seen: list[Ticket] = []

    def yes(ticket: Ticket) -> bool:
        seen.append(ticket)
        return True

    result = ex.run(RunRequest(code=SUBPROCESS_ID), approve=yes)
    assert result.outcome is Outcome.OK, result.reason
    assert result.stdout.strip() == "1000"
    assert len(seen) == 1
    assert seen[0].status == "pending"
    assert seen[0].request.code == SUBPROCESS_ID
    ran = ex.approvals.get(seen[0].id)
    assert ran.status == "ran"
    assert ran.run_id == result.run_id
    assert ran.decided_by is not None
    assert "callback" in ran.decided_by

    refused = ex.run(RunRequest(code=SUBPROCESS_ID), approve=lambda t: False)
    assert refused.outcome is Outcome.DENIED
    _not_run(refused)
    assert _record(ex, refused)["outcome"] == "denied"
    assert [t.status for t in ex.approvals.list(None)].count("denied") == 1
    assert ex.approvals.list("pending") == []


def test_supervised_holds_every_run(ex: Executor) -> None:
    result = ex.run(RunRequest(code="print(1)"), profile="supervised")
    approval_id = _approval_id(result)
    assert result.policy is not None
    assert result.policy["findings"] == []
    assert ex.approvals.get(approval_id).profile["name"] == "supervised"
    ran = ex.run_approved(approval_id, by="tester")
    assert ran.outcome is Outcome.OK, ran.reason
    assert ran.stdout == "1\n"
    # Still a deny finding stops the run before any person sees it.
    denied = ex.run(RunRequest(code="import ctypes"), profile="supervised")
    assert denied.outcome is Outcome.DENIED


def test_tampered_request_is_refused(ex: Executor) -> None:
    approval_id = _approval_id(ex.run(RunRequest(code=SUBPROCESS_ID)))
    db = ex.approvals.path
    conn = sqlite3.connect(db)
    try:
        (raw,) = conn.execute(
            "SELECT request FROM approvals WHERE id = ?", (approval_id,)
        ).fetchone()
        request = json.loads(raw)
        request["code"] = "print('not what was approved')"
        conn.execute(
            "UPDATE approvals SET request = ? WHERE id = ?", (json.dumps(request), approval_id)
        )
        conn.commit()
    finally:
        conn.close()
    assert not ex.approvals.get(approval_id).intact
    before = ex.audit.count()
    with pytest.raises(ApprovalError, match="changed after it was submitted"):
        ex.run_approved(approval_id, by="tester")
    assert ex.audit.count() == before
    assert ex.approvals.get(approval_id).status == "pending"


def test_profile_changed_after_submission_is_refused(
    ex: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    monkeypatch.setenv("SANDCELL_PROFILES", str(profiles))
    path = profiles / "mine.toml"
    path.write_text(USER_PROFILE)

    waiting = ex.run(RunRequest(code=SUBPROCESS_ID), profile="mine")
    approval_id = _approval_id(waiting)
    stored = ex.approvals.get(approval_id).profile
    assert stored["name"] == "mine"
    assert stored["source"] == str(path.resolve())

    path.write_text(USER_PROFILE.replace("a test profile", "a changed profile"))
    before = ex.audit.count()
    with pytest.raises(ConfigError, match="changed since approval"):
        ex.run_approved(approval_id, by="tester")
    assert ex.audit.count() == before
    assert ex.approvals.get(approval_id).status == "pending"

    # Back as it was, the same approval runs.
    path.write_text(USER_PROFILE)
    result = ex.run_approved(approval_id, by="tester")
    assert result.outcome is Outcome.OK, result.reason
    assert result.policy is not None
    profile = result.policy["profile"]
    assert isinstance(profile, dict)
    assert profile["name"] == "mine"


def test_approved_run_keeps_the_declared_result(ex: Executor) -> None:
    code = "import subprocess\nprint('{\"rate\": 142}')"
    approval_id = _approval_id(ex.run(RunRequest(code=code), schema=RATE_SCHEMA))
    result = ex.run_approved(approval_id, by="tester")
    assert result.outcome is Outcome.INVALID_OUTPUT


# --- validation -------------------------------------------------------------------------------


def _printing(value: object) -> RunRequest:
    return RunRequest(code=f"print('log line')\nprint({json.dumps(json.dumps(value))})")


def test_schema_invalid_and_valid(ex: Executor) -> None:
    bad = ex.run(_printing({"rate": 142}), schema=RATE_SCHEMA)
    assert bad.outcome is Outcome.INVALID_OUTPUT
    assert bad.exit_code == 0
    assert bad.validation is not None
    assert bad.validation["valid"] is False
    assert bad.validation["value"] is None
    errors = bad.validation["errors"]
    assert isinstance(errors, list)
    assert any("$.rate" in e and "100" in e for e in errors), errors
    assert "$.rate" in bad.reason
    assert _record(ex, bad)["outcome"] == "invalid_output"

    good = ex.run(_printing({"rate": 42}), schema=RATE_SCHEMA)
    assert good.outcome is Outcome.OK, good.reason
    assert good.validation == {"valid": True, "errors": [], "value": {"rate": 42}}


def test_invariants_string_and_callable(ex: Executor) -> None:
    text = '0 <= result["rate"] <= 100'
    bad = ex.run(_printing({"rate": 142}), invariants=[text])
    assert bad.outcome is Outcome.INVALID_OUTPUT
    assert bad.validation is not None
    assert any(text in str(e) for e in bad.validation["errors"])  # type: ignore[attr-defined]
    assert ex.run(_printing({"rate": 42}), invariants=[text]).outcome is Outcome.OK

    def below_100(result: object) -> bool:
        return isinstance(result, dict) and result["rate"] < 100

    assert ex.run(_printing({"rate": 142}), invariants=[below_100]).outcome is (
        Outcome.INVALID_OUTPUT
    )
    good = ex.run(_printing({"rate": 42}), invariants=[below_100])
    assert good.outcome is Outcome.OK, good.reason


def test_a_bad_invariant_or_schema_is_refused_before_running(ex: Executor) -> None:
    with pytest.raises(ConfigError):
        ex.run(_printing({"rate": 1}), invariants=["__import__('os')"])
    with pytest.raises(ConfigError):
        ex.run(_printing({"rate": 1}), schema={"type": "no-such-type"})
    assert ex.audit.count() == 0


class Rate(pydantic.BaseModel):
    rate: float = pydantic.Field(le=100)


def test_pydantic_model(ex: Executor) -> None:
    bad = ex.run(_printing({"rate": 142}), model=Rate)
    assert bad.outcome is Outcome.INVALID_OUTPUT
    assert bad.validation is not None
    assert any("rate" in str(e) for e in bad.validation["errors"])  # type: ignore[attr-defined]
    good = ex.run(_printing({"rate": 42}), model=Rate)
    assert good.outcome is Outcome.OK, good.reason
    assert good.validation is not None
    assert good.validation["value"] == Rate(rate=42)
    # The record keeps the model's JSON form (a model instance is not JSON).
    validation = _record(ex, good)["validation"]
    assert isinstance(validation, dict)
    assert validation["value"] == {"rate": 42.0}


def test_result_file(ex: Executor) -> None:
    writes = (
        "import json\nprint('stdout is not the result')\n"
        "with open('result.json', 'w') as f:\n    json.dump({'rate': 7}, f)\n"
    )
    result = ex.run(RunRequest(code=writes), result_file="result.json", schema=RATE_SCHEMA)
    assert result.outcome is Outcome.OK, result.reason
    assert result.validation == {"valid": True, "errors": [], "value": {"rate": 7}}
    assert [a.path for a in result.artifacts] == ["result.json"]

    missing = ex.run(RunRequest(code="print('{\"rate\": 1}')"), result_file="result.json")
    assert missing.outcome is Outcome.INVALID_OUTPUT
    assert missing.validation is not None
    errors = missing.validation["errors"]
    assert isinstance(errors, list)
    assert any("result.json" in e and "not written" in e for e in errors), errors


def test_failed_program_is_not_turned_into_invalid_output(ex: Executor) -> None:
    result = ex.run(RunRequest(code="raise SystemExit(3)"), schema=RATE_SCHEMA)
    assert result.outcome is Outcome.ERROR
    assert result.exit_code == 3
    assert result.validation is None


# --- redaction --------------------------------------------------------------------------------


def test_token_shapes_are_redacted(ex: Executor) -> None:
    result = ex.run(RunRequest(code=TOKEN_CODE))
    assert result.outcome is Outcome.OK, result.reason
    assert result.stdout == "[REDACTED:github_token]\n"
    assert [(leak["kind"], leak["stream"]) for leak in result.leaks] == [("github_token", "stdout")]
    preview = str(result.leaks[0]["preview"])
    assert "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4f" not in preview
    record = _record(ex, result)
    assert record["stdout"] == result.stdout  # the record keeps the redacted text only
    assert record["leaks"] == list(result.leaks)


def test_known_secret_is_redacted(tmp_path: Path) -> None:
    secret = "s3cr3t-value-123"
    with Executor(home=tmp_path, profile="strict", known_secrets=[secret]) as ex:
        code = (
            "import os, sys\nprint(os.environ['X'])\nprint('err', os.environ['X'], file=sys.stderr)"
        )
        result = ex.run(RunRequest(code=code, env={"X": secret}))
        assert result.outcome is Outcome.OK, result.reason
        assert secret not in result.stdout
        assert secret not in result.stderr
        assert "[REDACTED:known_secret]" in result.stdout
        assert "[REDACTED:known_secret]" in result.stderr
        assert {(leak["kind"], leak["stream"]) for leak in result.leaks} == {
            ("known_secret", "stdout"),
            ("known_secret", "stderr"),
        }
        record = _record(ex, result)
        assert secret not in json.dumps(record)
        assert record["env_names"] == ["X"]
        assert ex.audit.verify().ok


def test_token_in_an_artifact_is_reported_and_kept(ex: Executor) -> None:
    code = (
        "open('t.txt', 'w').write('token ' + 'gh' + 'p_' + 'Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7j')"
    )
    result = ex.run(RunRequest(code=code, exports=("*.txt",)))
    assert result.outcome is Outcome.OK, result.reason
    assert [(leak["kind"], leak["stream"]) for leak in result.leaks] == [("github_token", "t.txt")]
    (artifact,) = result.artifacts
    assert artifact.path == "t.txt"
    # Artifacts are stored under their hash: reported, never rewritten.
    data = ex.store.path_for(artifact.sha256).read_bytes()
    assert data == b"token ghp_Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7j"


# --- requests the profile refuses -------------------------------------------------------------


def test_limit_above_the_ceiling_is_refused_and_not_recorded(ex: Executor) -> None:
    request = RunRequest(code="print(1)", limits=Limits().with_(wall_time_s=120))
    with pytest.raises(ConfigError, match=r"ceiling 60") as info:
        ex.run(request)
    assert "wall_time_s" in str(info.value)
    assert "strict" in str(info.value)
    # The same limit is within analysis's ceiling.
    assert ex.run(request, profile="analysis").outcome is Outcome.OK
    with pytest.raises(ConfigError, match="ceiling"):
        ex.run(RunRequest(code=SUBPROCESS_ID, limits=Limits().with_(wall_time_s=120)))
    assert ex.audit.count() == 1
    assert ex.approvals.list(None) == []


def test_export_outside_the_profile_is_refused(ex: Executor) -> None:
    with pytest.raises(ConfigError, match=r"does not allow exporting '\*\.so'"):
        ex.run(RunRequest(code="print(1)", exports=("*.so",)))
    with pytest.raises(ConfigError, match="does not allow exporting"):
        ex.run(RunRequest(code="print(1)", exports=("**",)), profile="analysis")
    assert ex.audit.count() == 0


def test_language_outside_the_profile_is_refused(ex: Executor) -> None:
    with pytest.raises(ConfigError, match="does not allow bash"):
        ex.run(RunRequest(code="echo hi", language="bash"), profile="analysis")
    assert ex.audit.count() == 0
    result = ex.run(RunRequest(code="echo hi", language="bash"))
    assert result.outcome is Outcome.OK, result.reason
    assert result.stdout == "hi\n"


def test_unknown_profile_is_refused(ex: Executor) -> None:
    with pytest.raises(ConfigError, match="available: strict"):
        ex.run(RunRequest(code="print(1)"), profile="nosuch")


def test_default_profile_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDCELL_PROFILE", raising=False)
    with Executor(home=tmp_path / "a", known_secrets=()) as ex:
        assert ex.profile.name == "strict"
    monkeypatch.setenv("SANDCELL_PROFILE", "unchecked")
    with Executor(home=tmp_path / "b", known_secrets=()) as ex:
        assert ex.profile.name == "unchecked"
        result = ex.run(RunRequest(code="import ctypes\nprint('ran')"))
        assert result.outcome is Outcome.OK, result.reason
        assert result.stdout == "ran\n"


def test_audit_log_verifies_after_every_path(ex: Executor) -> None:
    ex.run(RunRequest(code="print(6*7)"))
    ex.run(RunRequest(code="import ctypes"))
    ex.run_approved(_approval_id(ex.run(RunRequest(code=SUBPROCESS_ID))), by="tester")
    ex.deny_approval(_approval_id(ex.run(RunRequest(code=SUBPROCESS_ID))), reason="no")
    ex.run(_printing({"rate": 142}), schema=RATE_SCHEMA)
    ex.run(RunRequest(code=TOKEN_CODE))
    outcomes = [str(e.record["outcome"]) for e in ex.audit.list(limit=100)]
    assert sorted(outcomes) == sorted(
        [
            "ok",
            "denied",
            "awaiting_approval",
            "ok",
            "awaiting_approval",
            "denied",
            "invalid_output",
            "ok",
        ]
    )
    report = ex.audit.verify()
    assert report.ok, report.problems
    assert report.count == 8


def test_waiting_run_cannot_carry_a_callable_invariant(ex: Executor) -> None:
    # A callable cannot be stored with a run that waits for a person: refused before anything.
    with pytest.raises(ConfigError, match="cannot be stored"):
        ex.run(RunRequest(code="import subprocess\nprint(1)"), invariants=[lambda v: True])
