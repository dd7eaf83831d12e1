"""Runtimes as the policy, the record, the CLI, the agent's prompt and replay see them: which
runtime a run gets, what it may import from it, and that the record pins the exact build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import runtime_required

from sandcell import Executor, Outcome, RunRequest
from sandcell.agent.prompt import system_prompt
from sandcell.errors import ConfigError
from sandcell.policy.approvals import request_from_dict, request_to_dict
from sandcell.policy.gate import admit
from sandcell.policy.profiles import load_profile, parse_profile
from sandcell.runtimes.store import find
from sandcell.spec import Limits

SANDCELL = [sys.executable, "-m", "sandcell"]


@pytest.fixture(autouse=True)
def _built() -> None:
    for name in ("minimal", "datascience"):
        runtime_required(name)


def _profile(text: str, tmp_path: Path, name: str = "custom") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_at_runtime_allows_what_the_runs_runtime_offers() -> None:
    strict = load_profile("strict")
    scipy = RunRequest(code="import scipy.stats\nprint(1)")
    # strict's runtime, analysis, offers numpy, pandas, matplotlib: scipy is neither allowed
    # nor there.
    default = admit(scipy, strict)
    assert default.request.runtime == "analysis"
    assert {f.rule_id for f in default.decision.findings} >= {"py.import"}
    # In datascience it is both.
    chosen = admit(RunRequest(code=scipy.code, runtime="datascience"), strict)
    assert chosen.request.runtime == "datascience"
    assert chosen.decision.verdict == "allow", chosen.decision.reason
    # minimal offers nothing: numpy is outside the allowlist and, with the wheel cache's
    # resolution, named as missing from that runtime.
    minimal = admit(RunRequest(code="import numpy", runtime="minimal"), strict)
    assert minimal.decision.verdict != "allow"
    assert any("numpy" in f.message for f in minimal.decision.findings)


def test_a_profile_names_its_runtime_and_may_forbid_others(tmp_path: Path) -> None:
    ds = load_profile("datascience")
    assert ds.runtime.runtime == "datascience"
    assert admit(RunRequest(code="import sklearn"), ds).decision.verdict == "allow"
    with pytest.raises(ConfigError, match=r"does not allow runtime 'minimal'.*datascience"):
        admit(RunRequest(code="print(1)", runtime="minimal"), ds)
    # A profile naming a runtime that is not built: the run is refused with the build command.
    missing = parse_profile(
        b'[runtime]\nruntime = "nosuchruntime"\n', name="m", source=str(tmp_path / "m.toml")
    )
    with (
        Executor(home=tmp_path / "home", profile=missing) as ex,
        pytest.raises(ConfigError, match=r"sandcell runtime build nosuchruntime --lock"),
    ):
        ex.run(RunRequest(code="print(1)"))


def test_the_record_pins_the_build_and_replay_runs_in_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs in-process as root")
    stored = find("datascience")
    with Executor(home=tmp_path / "home", profile="strict") as ex:
        result = ex.run(
            RunRequest(
                code="import scipy, sys\nprint(scipy.__version__, sys.prefix)",
                runtime="datascience",
            )
        )
        assert result.outcome is Outcome.OK, result.stderr
        version = stored.manifest.distributions["scipy"]
        assert result.stdout == f"{version} /opt/sandcell/venv\n"
        record = ex.audit.get(result.run_id)
        assert record is not None
        runtime = record.record["runtime"]
        assert runtime["selected"] == "datascience"
        assert runtime["tree_sha256"] == stored.manifest.tree_sha256
        assert runtime["lock_sha256"] == stored.manifest.lock_sha256
        again = ex.replay(result.run_id)
        assert again.plan.request.runtime == f"datascience@{stored.manifest.tree_sha256}"
        assert not again.plan.runtime_changed
        assert again.matched, again.comparison


def test_an_approval_keeps_the_runtime(tmp_path: Path) -> None:
    request = RunRequest(code="print(1)", runtime="datascience")
    assert request_from_dict(request_to_dict(request)).runtime == "datascience"
    # A request stored before runtimes existed has no key, and reads back as the default.
    stored = request_to_dict(RunRequest(code="print(1)"))
    assert "runtime" not in stored
    assert request_from_dict(stored).runtime is None


def test_the_prompt_lists_the_runtime_with_versions() -> None:
    stored = find("datascience")
    text = system_prompt(load_profile("datascience"), limits=Limits(), exports=())
    line = next(line for line in text.splitlines() if line.startswith("- Languages"))
    assert "The runtime (datascience) has these packages:" in line
    for name in ("scipy", "scikit-learn", "statsmodels", "seaborn", "pyarrow", "openpyxl"):
        assert f"{name} {stored.manifest.distributions[name]}" in line
    assert "sklearn" in line  # the import name, in the allowlist part
    minimal = parse_profile(b'[runtime]\nruntime = "minimal"\n', name="m", source="m.toml")
    text = system_prompt(minimal, limits=Limits(), exports=())
    assert "The runtime (minimal) has the standard library only." in text


def test_the_cli_lists_shows_verifies_and_runs(tmp_path: Path) -> None:
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SANDCELL, *args], capture_output=True, text=True, env=env, check=False
        )

    listed = json.loads(cli("runtime", "list", "--json").stdout)
    names = {r["name"]: r for r in listed}
    assert names["datascience"]["tree_sha256"] == find("datascience").manifest.tree_sha256
    shown = cli("runtime", "show", "datascience")
    assert shown.returncode == 0 and "scikit-learn==" in shown.stdout
    assert cli("runtime", "verify", "minimal").returncode == 0
    run = cli(
        "run", "--no-service", "--runtime", "datascience", "-c",
        "import scipy, sklearn, openpyxl\nprint(scipy.__version__)",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == find("datascience").manifest.distributions["scipy"]
    missing = cli("run", "--no-service", "--runtime", "nosuchruntime", "-c", "print(1)")
    assert missing.returncode == 78
    assert "sandcell runtime build nosuchruntime --lock" in missing.stderr
    bad = cli("runtime", "build", "--lock", str(_profile("numpy==2.4.6\n", tmp_path, "bad")))
    assert bad.returncode == 78 and "is not an exact pin with hashes" in bad.stderr


def test_json_results_name_the_runtime_as_the_record_does(tmp_path: Path) -> None:
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SANDCELL, *args], capture_output=True, text=True, env=env, check=False
        )

    manifest = find("minimal").manifest
    named = {
        "name": "minimal",
        "tree_sha256": manifest.tree_sha256,
        "lock_sha256": manifest.lock_sha256,
    }
    run = cli("run", "--no-service", "--json", "--runtime", "minimal", "-c", "print(1)")
    assert run.returncode == 0, run.stderr
    body = json.loads(run.stdout)
    assert body["runtime"] == named
    shown = cli("audit", "show", "--json", body["run_id"])
    assert shown.returncode == 0, shown.stderr
    recorded = json.loads(shown.stdout)["record"]["runtime"]
    assert (recorded["selected"], recorded["tree_sha256"], recorded["lock_sha256"]) == (
        named["name"],
        named["tree_sha256"],
        named["lock_sha256"],
    )
    # unchecked runs in sandcell's own environment: no built runtime to name.
    own = cli("run", "--no-service", "--json", "--profile", "unchecked", "-c", "print(1)")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["runtime"] is None
    # A session's cells say the same.
    profile = _profile('[runtime]\nruntime = "minimal"\n', tmp_path, "in-minimal")
    started = cli("session", "start", "--no-service", "--profile", str(profile), "--json")
    assert started.returncode == 0, started.stderr
    session_id = json.loads(started.stdout)["id"]
    try:
        cell = cli("session", "run", "--no-service", session_id, "--json", "-c", "x = 1")
        assert cell.returncode == 0, cell.stderr
        assert json.loads(cell.stdout)["runtime"] == named
    finally:
        cli("session", "close", "--no-service", session_id)
