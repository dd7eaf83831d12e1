"""``sandcell ask`` end to end: a subprocess, a scripted model, the real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO, backend_unavailable, run_cli

EXAMPLES = REPO / "examples"
TURNS = EXAMPLES / "agent" / "conversion_rate.turns.json"


def _env(tmp_path: Path) -> dict[str, str]:
    # Nothing of the caller's model configuration: no keys, no SANDCELL_MODEL, no config file.
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "SANDCELL_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO / "src"),
    }


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0:
        pytest.skip("these runs use the root sandbox path; this test run is not root")


def test_no_model_configured_says_how_and_exits_78(tmp_path: Path) -> None:
    proc = run_cli(
        ["ask", "How many rows?", "--input", str(EXAMPLES / "sales.csv")], env=_env(tmp_path)
    )
    assert proc.returncode == 78, proc.stderr
    assert "no model is configured" in proc.stderr
    assert "--model" in proc.stderr and "SANDCELL_MODEL" in proc.stderr
    assert proc.stdout == ""


def test_interactive_approval_needs_a_terminal(tmp_path: Path) -> None:
    proc = run_cli(
        ["ask", "Rate?", "--approve-interactive", "--model", f"scripted:{TURNS}"],
        env=_env(tmp_path),
    )
    assert proc.returncode == 78
    assert "--approve-interactive needs a terminal" in proc.stderr


@pytest.mark.usefixtures("root")
def test_ask_with_a_scripted_model_renders_the_answer(tmp_path: Path) -> None:
    proc = run_cli(
        [
            "ask",
            "What is the average conversion rate per day in sales.csv?",
            "--input",
            str(EXAMPLES / "sales.csv"),
            "--model",
            f"scripted:{TURNS}",
        ],
        env=_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("Answer\n") and "6.60%" in out
    assert "Figures" in out and "mean daily conversion rate" in out
    assert "Code that ran (attempt 1, python" in out and "pd.read_csv" in out
    assert "sandcell audit show " in out
    # Progress went to stderr while it worked.
    assert "running attempt 1 (python)" in proc.stderr
    assert "stopped: answered" in proc.stderr


@pytest.mark.usefixtures("root")
def test_json_is_one_object_with_the_whole_transcript(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = run_cli(
        [
            "ask",
            "Plot weekly revenue",
            "--input",
            str(EXAMPLES / "sales.csv"),
            "--export",
            "out/*.png",
            "--out",
            str(tmp_path / "report"),
            "--profile",
            "analysis",
            "--model",
            f"scripted:{EXAMPLES / 'agent' / 'weekly_revenue.turns.json'}",
            "--json",
        ],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["stop_reason"] == "answered" and body["answered"] is True
    assert {"explanation", "figures", "attempts", "run_ids", "artifacts", "usage", "events"} <= set(
        body
    )
    assert body["figures"][0]["value"] == 13375.0
    (attempt,) = body["attempts"]
    assert attempt["outcome"] == "ok" and "savefig" in attempt["code"]
    assert body["run_ids"] == [attempt["run_id"]]
    assert [a["path"] for a in body["artifacts"]] == ["out/weekly_revenue.png"]
    png = tmp_path / "report" / "out" / "weekly_revenue.png"
    assert png.read_bytes().startswith(b"\x89PNG")
    assert body["model_settings"]["provider"] == "scripted"
    # The run ids resolve in the audit log.
    shown = run_cli(["audit", "show", attempt["run_id"]], env=env)
    assert shown.returncode == 0, shown.stderr


@pytest.mark.usefixtures("root")
def test_a_stop_reason_has_its_own_exit_code(tmp_path: Path) -> None:
    turns = tmp_path / "wait.turns.json"
    turns.write_text(json.dumps(["```python\nprint(94 / 1388 * 100)\n```"]))
    proc = run_cli(
        [
            "ask",
            "Conversion rate?",
            "--profile",
            "supervised",
            "--model",
            f"scripted:{turns}",
            "--json",
        ],
        env=_env(tmp_path),
    )
    assert proc.returncode == 125, proc.stderr
    body = json.loads(proc.stdout)
    assert body["stop_reason"] == "awaiting_approval" and body["approval_id"]
    assert f"sandcell approve {body['approval_id']}" in body["message"]


@pytest.mark.usefixtures("root")
def test_interactive_approval_asks_on_the_terminal(tmp_path: Path) -> None:
    primary, secondary = os.openpty()
    try:
        os.write(primary, b"y\n")  # the person's answer, waiting in the terminal
        proc = subprocess.run(
            [sys.executable, "-m", "sandcell", "ask", "What is the average conversion rate per "
             "day in sales.csv?", "--input", str(EXAMPLES / "sales.csv"), "--profile",
             "supervised", "--approve-interactive", "--model", f"scripted:{TURNS}", "--json"],
            stdin=secondary, capture_output=True, env=_env(tmp_path), timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(primary)
        os.close(secondary)
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert "approve this run? [y/N]" in stderr and "pd.read_csv" in stderr
    body = json.loads(proc.stdout)
    assert body["stop_reason"] == "answered"
    assert body["attempts"][0]["approval_id"]


RATE_TURNS = [
    "```python\nprint('rate %:', 94 / 1388 * 100)\n```",
    '```answer\n{"explanation": "6.77% of the leads converted.", "figures": [{"name": "rate", '
    '"value": 6.77, "unit": "%", "run": 1}]}\n```',
]


@pytest.mark.usefixtures("root")
def test_resume_after_approve_goes_on_with_the_question(tmp_path: Path) -> None:
    env = _env(tmp_path)
    turns = tmp_path / "rate.turns.json"
    turns.write_text(json.dumps(RATE_TURNS))
    asked = run_cli(
        ["ask", "Conversion rate?", "--profile", "supervised", "--model", f"scripted:{turns}"],
        env=env,
    )
    assert asked.returncode == 125, asked.stderr
    approval_id = asked.stdout.split("sandcell ask --resume ")[1].split()[0]
    pending = run_cli(["ask", "--resume", approval_id], env=env)
    assert pending.returncode == 78 and "still pending" in pending.stderr
    approved = run_cli(["approve", approval_id, "--json"], env=env)
    assert approved.returncode == 0, approved.stderr
    run_id = json.loads(approved.stdout)["run_id"]
    # No --model: the stored settings name the script, which goes on from its second turn.
    resumed = run_cli(["ask", "--resume", approval_id, "--json"], env=env)
    assert resumed.returncode == 0, resumed.stderr
    body = json.loads(resumed.stdout)
    assert body["stop_reason"] == "answered" and body["run_ids"] == [run_id]
    assert body["figures"][0]["run_id"] == run_id and body["usage"]["steps"] == 2
    assert body["model_settings"]["provider"] == "scripted"
    again = run_cli(["ask", "--resume", approval_id], env=env)
    assert again.returncode == 78 and "already resumed" in again.stderr


def test_resume_refuses_a_new_question_and_an_unknown_id(tmp_path: Path) -> None:
    env = _env(tmp_path)
    both = run_cli(["ask", "Rate?", "--resume", "abcdef123456"], env=env)
    assert both.returncode == 78 and "leave out QUESTION" in both.stderr
    unknown = run_cli(["ask", "--resume", "abcdef123456"], env=env)
    assert unknown.returncode == 78 and "no approval 'abcdef123456'" in unknown.stderr
    neither = run_cli(["ask"], env=env)
    assert neither.returncode == 78 and "--resume" in neither.stderr


@pytest.mark.usefixtures("root")
def test_a_script_of_tool_calls_answers(tmp_path: Path) -> None:
    turns = tmp_path / "tools.turns.json"
    figures = [{"name": "rate", "value": 6.77, "unit": "%", "run": 1}]
    turns.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "run_code", "arguments": {"code": "print(94/1388*100)"}}]},
                {
                    "text": "Done.",
                    "tool_calls": [
                        {
                            "name": "answer",
                            "arguments": {"explanation": "6.77% converted.", "figures": figures},
                        }
                    ],
                },
            ]
        )
    )
    proc = run_cli(["ask", "Rate?", "--model", f"scripted:{turns}", "--json"], env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["stop_reason"] == "answered" and body["figures"][0]["value"] == 6.77


_HELD = {
    "tool_calls": [
        {"name": "run_code", "arguments": {"code": "import subprocess\nprint(subprocess.run)"}}
    ]
}


@pytest.mark.usefixtures("root")
def test_backend_option_is_where_every_run_happens_resume_included(tmp_path: Path) -> None:
    # --backend was once ignored by ask: its runs (and the held run it approved) went to the
    # profile's default rung, below the one the user named.
    env = _env(tmp_path)
    turns = tmp_path / "held.turns.json"
    turns.write_text(
        json.dumps(
            [
                _HELD,
                _HELD,
                {"tool_calls": [{"name": "run_code", "arguments": {"code": "print('after')"}}]},
                {"tool_calls": [{"name": "answer", "arguments": {"explanation": "It ran."}}]},
            ]
        )
    )
    asked = run_cli(
        ["ask", "Run it", "--backend", "gvisor", "--model", f"scripted:{turns}"], env=env
    )
    if asked.returncode != 125 and "gvisor is unavailable" in asked.stderr:
        backend_unavailable("gvisor", asked.stderr.strip())
    assert asked.returncode == 125, asked.stderr
    approval_id = asked.stdout.split("sandcell ask --resume ")[1].split()[0]
    assert run_cli(["approve", approval_id], env=env).returncode == 0
    resumed = run_cli(["ask", "--resume", approval_id, "--json"], env=env)
    assert resumed.returncode == 0, resumed.stderr
    run_ids = json.loads(resumed.stdout)["run_ids"]
    assert len(run_ids) >= 2  # the approved run and the one after it, beside any held ones
    for run_id in run_ids:
        shown = run_cli(["audit", "show", run_id], env=env)
        assert shown.returncode == 0, shown.stderr
        boundary = [line for line in shown.stdout.splitlines() if line.startswith("# boundary:")]
        assert boundary and boundary[0].startswith("# boundary: gvisor "), boundary
