"""The policy commands of the command line: ``policy``, ``check``, ``run`` under a profile,
``approvals``, ``approve`` and ``deny``, and terminal safety of what ``run`` prints.

Every test runs ``python -m sandcell`` as a subprocess with ``SANDCELL_HOME`` in a fresh temporary
directory and without ``SANDCELL_PROFILE``/``SANDCELL_PROFILES``, so the default profile (strict)
applies unless a test says otherwise. Runs use the real sandbox, so they need root.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import backend_unavailable, run_cli

from sandcell.status import (
    EXIT_AWAITING_APPROVAL,
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_INVALID_OUTPUT,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="real sandboxed runs need root here")
APPROVAL_ID = re.compile(r"sandcell approve ([0-9a-f]{12})")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SANDCELL_PROFILE", "SANDCELL_PROFILES", "SANDCELL_APPROVER")
    }
    return {**env, "SANDCELL_HOME": str(home), **extra}


def sandcell(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sandcell ARGS`` with its data directory in ``home``; stdout and stderr as text."""
    return run_cli(args, env=env or _env(home), cwd=REPO)


def _submit(home: Path, code: str = "import subprocess\nprint('approved run')") -> str:
    """Run code that strict holds for approval; return the approval id it prints."""
    proc = sandcell(home, "run", "-c", code)
    assert proc.returncode == EXIT_AWAITING_APPROVAL, proc.stderr
    match = APPROVAL_ID.search(proc.stderr)
    assert match, proc.stderr
    return match.group(1)


# --- policy list / show -----------------------------------------------------------------------


def test_policy_list(home: Path) -> None:
    proc = sandcell(home, "policy", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    names = [line.split()[0] for line in lines[2:] if line.strip()]
    assert names == [
        "strict",
        "analysis",
        "datascience",
        "hostile",
        "pure",
        "supervised",
        "unchecked",
    ]
    assert "strict (default)" in proc.stdout
    assert "UNUSABLE" not in proc.stdout


def test_policy_list_json_and_a_user_profile(home: Path, tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "mine.toml").write_text('description = "mine"\n')
    (profiles / "broken.toml").write_text("approval = 3\n")
    proc = sandcell(home, "policy", "list", "--json", "--profile-dir", str(profiles))
    assert proc.returncode == 0, proc.stderr
    by_name = {s["name"]: s for s in json.loads(proc.stdout)}
    assert by_name["strict"]["approval"] == "on_findings"
    assert by_name["supervised"]["approval"] == "always"
    assert by_name["mine"]["problem"] is None
    assert by_name["mine"]["description"] == "mine"
    assert "broken.toml" in by_name["broken"]["problem"]


def test_policy_show_analysis(home: Path) -> None:
    proc = sandcell(home, "policy", "show", "analysis")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("profile analysis (builtin:analysis), sha256 ")
    assert "numpy, pandas, matplotlib" in out
    assert "out/**" in out
    assert re.search(r"wall_time_s\s+60 s \(ceiling 120 s\)", out), out
    assert "ceiling" in out
    as_json = json.loads(sandcell(home, "policy", "show", "analysis", "--json").stdout)
    assert as_json["name"] == "analysis"
    assert len(as_json["sha256"]) == 64


@needs_root
def test_the_pure_profile_runs_on_the_wasm_rung(home: Path) -> None:
    proc = sandcell(home, "run", "--json", "--profile", "pure", "-c", "print(sum(range(10)))")
    if "wasm is unavailable" in proc.stderr:
        backend_unavailable("wasm", proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["stdout"] == "45\n"
    assert result["enforcement"]["backend"] == "wasm"
    # Python only: the profile refuses bash before any rung is asked.
    bash = sandcell(home, "run", "--profile", "pure", "--lang", "bash", "-c", "echo hi")
    assert bash.returncode == EXIT_CONFIG and "does not allow bash" in bash.stderr


def test_policy_show_unknown(home: Path) -> None:
    proc = sandcell(home, "policy", "show", "nosuch")
    assert proc.returncode == EXIT_CONFIG
    assert "nosuch" in proc.stderr
    assert (
        "available: strict, analysis, datascience, hostile, pure, supervised, unchecked"
        in proc.stderr
    )


# --- check ------------------------------------------------------------------------------------


def test_check_verdicts(home: Path) -> None:
    allowed = sandcell(home, "check", "-c", "print(1)")
    assert allowed.returncode == 0, allowed.stderr
    assert "decision: allow" in allowed.stdout
    assert "'strict'" in allowed.stdout

    denied = sandcell(home, "check", "-c", "import ctypes")
    assert denied.returncode == EXIT_DENIED
    assert "py.native" in denied.stdout
    assert "decision: deny" in denied.stderr

    held = sandcell(home, "check", "-c", "import subprocess")
    assert held.returncode == EXIT_AWAITING_APPROVAL
    assert "py.process" in held.stdout
    assert "decision: approve" in held.stderr
    # check runs nothing and stores nothing.
    assert not (home / "approvals.sqlite3").exists()
    assert not (home / "audit.sqlite3").exists()


def test_check_json(home: Path) -> None:
    proc = sandcell(home, "check", "--json", "-c", "import subprocess")
    assert proc.returncode == EXIT_AWAITING_APPROVAL
    body = json.loads(proc.stdout)
    assert body["verdict"] == "approve"
    assert body["profile"]["name"] == "strict"
    assert {"py.process", "py.import"} <= {f["rule_id"] for f in body["findings"]}
    assert all(
        {"rule_id", "severity", "line", "column", "message"} <= f.keys() for f in body["findings"]
    )
    clean = json.loads(sandcell(home, "check", "--json", "-c", "print(1)").stdout)
    assert clean["verdict"] == "allow"
    assert clean["findings"] == []


def test_check_bash(home: Path) -> None:
    proc = sandcell(home, "check", "--lang", "bash", "-c", "curl http://x | sh")
    assert proc.returncode == EXIT_DENIED
    assert "sh.pipe-to-shell" in proc.stdout
    plain = sandcell(home, "check", "--lang", "bash", "-c", "echo hi")
    assert plain.returncode == 0, plain.stdout
    assert "sh." not in plain.stdout


def test_check_profile_and_its_default(home: Path) -> None:
    # numpy is in the runtime and allowed by both; a bash program only by strict.
    numpy = ("check", "-c", "import numpy")
    assert sandcell(home, *numpy).returncode == 0  # strict
    assert sandcell(home, *numpy, "--profile", "analysis").returncode == 0
    bash = ("check", "--lang", "bash", "-c", "echo hi")
    assert sandcell(home, *bash).returncode == 0
    assert sandcell(home, *bash, "--profile", "analysis").returncode == EXIT_CONFIG
    # Without --profile, check decides under the profile run would use.
    env = _env(home, SANDCELL_PROFILE="analysis")
    assert sandcell(home, *bash, env=env).returncode == EXIT_CONFIG


# --- run under a profile ----------------------------------------------------------------------


@needs_root
def test_run_denied(home: Path) -> None:
    proc = sandcell(home, "run", "-c", "import ctypes\nprint('ran')")
    assert proc.returncode == EXIT_DENIED
    assert proc.stdout == ""
    assert "denied" in proc.stderr
    assert "py.native" in proc.stderr


@needs_root
def test_approval_then_approve(home: Path) -> None:
    approval_id = _submit(home)

    listed = sandcell(home, "approvals", "list")
    assert listed.returncode == 0, listed.stderr
    assert approval_id in listed.stdout
    assert "pending" in listed.stdout

    shown = sandcell(home, "approvals", "show", approval_id)
    assert shown.returncode == 0, shown.stderr
    assert f"approval  {approval_id}  pending" in shown.stdout
    assert "1 | import subprocess" in shown.stdout
    assert "2 | print('approved run')" in shown.stdout
    assert "py.process" in shown.stdout
    assert "findings (" in shown.stdout
    # A unique prefix is enough.
    assert sandcell(home, "approvals", "show", approval_id[:6]).returncode == 0

    approved = sandcell(home, "approve", approval_id, "--json", "--reason", "looked at it")
    assert approved.returncode == 0, approved.stderr
    body = json.loads(approved.stdout)
    assert body["outcome"] == "ok"
    assert body["stdout"] == "approved run\n"
    approval = body["policy"]["approval"]
    assert approval["approval_id"] == approval_id
    assert approval["approved_by"]
    assert approval["decision_reason"] == "looked at it"

    assert sandcell(home, "approvals", "list").stdout.strip() == "no approvals"
    every = sandcell(home, "approvals", "list", "--all", "--json")
    (ticket,) = json.loads(every.stdout)
    assert ticket["status"] == "ran"
    assert ticket["run_id"] == body["run_id"]
    again = sandcell(home, "approve", approval_id)
    assert again.returncode == EXIT_CONFIG
    assert "ran" in again.stderr


@needs_root
def test_approve_on_another_backend_is_refused_and_the_run_still_waits(home: Path) -> None:
    # The refusal names `approve --backend`, so the option must exist and mean the same as on
    # `run`: the rung the run was submitted for, or a refusal before anything is approved.
    approval_id = _submit(home)
    other = sandcell(home, "approve", approval_id, "--backend", "gvisor")
    if "gvisor is unavailable" in other.stderr:
        backend_unavailable("gvisor", other.stderr.strip())
    assert other.returncode == EXIT_CONFIG, other.stderr
    assert "for a run on backend 'namespaces', not 'gvisor'" in other.stderr
    assert "usage:" not in other.stderr
    assert approval_id in sandcell(home, "approvals", "list").stdout
    same = sandcell(home, "approve", approval_id, "--backend", "namespaces", "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["stdout"] == "approved run\n"


@needs_root
def test_approval_then_deny(home: Path) -> None:
    approval_id = _submit(home)
    denied = sandcell(home, "deny", approval_id, "--reason", "no")
    assert denied.returncode == 0, denied.stderr
    assert "denied" in denied.stdout
    every = sandcell(home, "approvals", "list", "--all")
    assert approval_id in every.stdout
    assert "denied" in every.stdout
    shown = sandcell(home, "approvals", "show", approval_id)
    assert "reason    no" in shown.stdout

    refused = sandcell(home, "approve", approval_id)
    assert refused.returncode == EXIT_CONFIG
    assert "denied" in refused.stderr
    assert sandcell(home, "deny", approval_id, "--reason", "again").returncode == EXIT_CONFIG
    unknown = sandcell(home, "approve", "0123456789ab")
    assert unknown.returncode == EXIT_CONFIG
    # Both decisions are run records, and the log verifies.
    verify = sandcell(home, "audit", "verify")
    assert verify.returncode == 0, verify.stdout
    assert "2 records" in verify.stdout


@needs_root
def test_run_schema_and_invariant(home: Path, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"rate": {"type": "number", "maximum": 100}}})
    )
    bad = sandcell(home, "run", "--schema", str(schema), "-c", "print('{\"rate\": 142}')")
    assert bad.returncode == EXIT_INVALID_OUTPUT, bad.stderr
    assert "invalid_output" in bad.stderr
    assert "$.rate" in bad.stderr
    good = sandcell(home, "run", "--schema", str(schema), "-c", "print('{\"rate\": 42}')")
    assert good.returncode == 0, good.stderr

    invariant = ("run", "--invariant", 'result["x"] > 1', "-c")
    failed = sandcell(home, *invariant, 'print("{\\"x\\": 0}")')
    assert failed.returncode == EXIT_INVALID_OUTPUT, failed.stderr
    assert 'result["x"] > 1' in failed.stderr
    assert sandcell(home, *invariant, 'print("{\\"x\\": 2}")').returncode == 0
    # A bad invariant is refused before anything runs.
    assert sandcell(home, *invariant[:2], "__import__('os')", "-c", "pass").returncode == (
        EXIT_CONFIG
    )


@needs_root
def test_run_result_file(home: Path) -> None:
    code = "import json\njson.dump({'x': 5}, open('answer.json', 'w'))"
    proc = sandcell(home, "run", "--json", "--result-file", "answer.json", "-c", code)
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["validation"]["value"] == {"x": 5}
    missing = sandcell(home, "run", "--result-file", "answer.json", "-c", "print(1)")
    assert missing.returncode == EXIT_INVALID_OUTPUT
    assert "answer.json" in missing.stderr


@needs_root
def test_run_analysis_example(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = sandcell(
        home,
        "run",
        "--profile",
        "analysis",
        str(EXAMPLES / "analysis.py"),
        "--input",
        str(EXAMPLES / "sales.csv"),
        "--export",
        "out/*",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert "overall conversion rate" in proc.stdout
    chart = out / "out" / "revenue.png"
    assert chart.is_file()
    assert chart.read_bytes().startswith(b"\x89PNG")
    summary = json.loads((out / "out" / "summary.json").read_text())
    assert summary["days"] == 7
    # Under strict (the default) the same program runs too: the analysis basics are allowed.
    plain = sandcell(
        home, "run", str(EXAMPLES / "analysis.py"), "--input", str(EXAMPLES / "sales.csv")
    )
    assert plain.returncode == 0, plain.stderr


def test_run_limit_above_the_ceiling(home: Path) -> None:
    proc = sandcell(home, "run", "--profile", "analysis", "--timeout", "9999", "-c", "pass")
    assert proc.returncode == EXIT_CONFIG
    assert "wall_time_s=9999" in proc.stderr
    assert "ceiling 120" in proc.stderr
    assert "'analysis'" in proc.stderr
    strict = sandcell(home, "run", "--timeout", "61", "-c", "pass")
    assert strict.returncode == EXIT_CONFIG
    assert "ceiling 60" in strict.stderr


def test_run_refusals_of_the_profile(home: Path) -> None:
    export = sandcell(home, "run", "--export", "*.so", "-c", "pass")
    assert export.returncode == EXIT_CONFIG
    assert "does not allow exporting" in export.stderr
    bash = sandcell(home, "run", "--profile", "analysis", "--lang", "bash", "-c", "echo hi")
    assert bash.returncode == EXIT_CONFIG
    assert "does not allow bash" in bash.stderr
    # Nothing was recorded.
    assert sandcell(home, "audit", "list").stdout == ""


@needs_root
def test_run_plain_bash_under_strict(home: Path) -> None:
    proc = sandcell(home, "run", "--lang", "bash", "-c", "echo hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hi\n"
    assert "sh." not in proc.stderr


@needs_root
def test_run_redacts_tokens(home: Path) -> None:
    code = 'print("gh" + "p_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7j")'
    proc = sandcell(home, "run", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[REDACTED:github_token]\n"
    assert "redacted github_token in stdout" in proc.stderr


# --- terminal safety --------------------------------------------------------------------------

ESCAPE_CODE = 'print("\\x1b[31mred")'


@needs_root
def test_piped_output_passes_unchanged(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sandcell", "run", "-c", ESCAPE_CODE],
        capture_output=True,
        env=_env(home),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"\x1b[31mred\n"


def _read_terminal(fd: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> bytes:
    """Everything written to the pseudo-terminal until the program closes it."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: every process with the terminal open has closed it
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


@needs_root
def test_terminal_output_is_neutralised(home: Path) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandcell", "run", "-c", ESCAPE_CODE],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=subprocess.PIPE,
            env=_env(home),
        )
        os.close(slave)
        slave = -1
        seen = _read_terminal(master, proc)
        _, stderr = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    assert proc.returncode == 0, stderr
    assert b"\x1b" not in seen
    assert b"\\x1b[31mred" in seen
