"""The patch workflow end to end: a real git repository as a run's working directory, its
change set, approvals bound to the change set's hash, and the governed apply."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import (
    UnprivEnv,
    ladder_executor,
    run_as_user,
    run_cli,
)

from sandcell.artifacts import ExportLimits
from sandcell.audit import AuditLog
from sandcell.changes.apply import ApplyError, apply
from sandcell.changes.approvals import FILENAME, ChangeApprovalError, ChangeApprovals
from sandcell.changes.record import load
from sandcell.changes.run import run_in_workdir
from sandcell.errors import ConfigError
from sandcell.executor import Executor
from sandcell.spec import Limits, Outcome, RunRequest, RunResult

BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
FIX = "sed -i 's/a - b/a + b/' calc.py"
TEST = "python3 -m unittest -q"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small git repository whose one test fails: ``add`` subtracts."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path / "repo"
    r.mkdir()
    (r / "calc.py").write_text(BUGGY)
    (r / "test_calc.py").write_text(TESTS)
    (r / "run.sh").write_text("#!/bin/sh\nexec python3 -m unittest\n")
    (r / "run.sh").chmod(0o755)
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "init")
    return r


def tree_hash(root: Path) -> str:
    """Every entry under ``root``, .git included: path, kind, mode, content or link target."""
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)}\0{st.st_mode:o}\0".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def run(ex: Executor, repo: Path, code: str, *, lang: str = "bash", **kw: object) -> RunResult:
    request = RunRequest(code=code, language=lang, limits=Limits(wall_time_s=60))  # type: ignore[arg-type]
    return run_in_workdir(ex, request, repo, **kw)  # type: ignore[arg-type]


@pytest.fixture
def stores(executor: Executor) -> Iterator[ChangeApprovals]:
    approvals = ChangeApprovals(executor.audit.path.parent / FILENAME)
    yield approvals
    approvals.close()


def _apply(ex: Executor, approvals: ChangeApprovals, run_id: str, to: Path, **kw: object) -> object:
    rec = load(ex.audit, ex.store, run_id)
    return apply(
        rec,
        to,
        approvals=approvals,
        audit=ex.audit,
        needs_approval=True,
        profile_name="strict",
        applied_by="test",
        **{"allow_binary": False, **kw},  # type: ignore[arg-type]
    )


def test_a_fix_makes_the_failing_test_pass_and_applies_after_approval(
    executor: Executor, repo: Path, stores: ChangeApprovals, tmp_path: Path
) -> None:
    before = tree_hash(repo)
    failing = run(executor, repo, TEST)
    assert failing.outcome is Outcome.ERROR and failing.exit_code != 0, failing.stderr
    fixed = run(executor, repo, f"{FIX} && git diff --stat && {TEST}")
    assert fixed.outcome is Outcome.OK, fixed.stderr
    assert "calc.py" in fixed.stdout  # git works inside: .git was copied
    assert tree_hash(repo) == before, "the host copy was written to"
    names = {a.path for a in fixed.artifacts}
    assert {"changes.patch", "changes.json", "changes.tar", "workdir.manifest.json"} <= names
    rec = load(executor.audit, executor.store, fixed.run_id)
    assert [(c.action, c.path) for c in rec.changes] == [("modify", "calc.py")]
    assert b"-    return a - b\n+    return a + b" in rec.patch
    assert rec.outcome == "ok"
    entry = executor.audit.get(fixed.run_id)
    assert entry is not None and entry.record["workdir"]["source"] == str(repo)  # type: ignore[index]

    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    with pytest.raises(ChangeApprovalError, match="needs an approval"):
        _apply(executor, stores, fixed.run_id, target)
    assert (target / "calc.py").read_text() == BUGGY
    approval = stores.decide(fixed.run_id, rec.changeset_sha256, approve=True, by="reviewer")
    report = _apply(executor, stores, fixed.run_id, target)
    assert (target / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")
    assert report.as_expected  # type: ignore[attr-defined]
    audit = executor.audit.get(report.apply_id)  # type: ignore[attr-defined]
    assert audit is not None
    assert audit.record["approval"]["decided_by"] == "reviewer"  # type: ignore[index]
    assert audit.record["target_before_sha256"] == rec.manifest.sha256
    assert audit.record["target_after_sha256"] != rec.manifest.sha256
    # The approval is used up: applying again (even to a fresh copy) needs a new one.
    again = tmp_path / "again"
    shutil.copytree(repo, again, symlinks=True)
    with pytest.raises(ChangeApprovalError, match="already used"):
        _apply(executor, stores, fixed.run_id, again, approval_id=approval.id)
    assert (again / "calc.py").read_text() == BUGGY


def test_a_breaking_change_is_recorded_with_the_failing_outcome(
    executor: Executor, repo: Path
) -> None:
    broke = run(executor, repo, f"echo 'def add(a, b): return 0' > calc.py && {TEST}")
    assert broke.outcome is Outcome.ERROR and broke.exit_code == 1
    rec = load(executor.audit, executor.store, broke.run_id)
    assert rec.outcome == "error"
    assert [c.path for c in rec.changes] == ["calc.py"]


def test_python_runs_get_the_workdir_too(executor: Executor, repo: Path) -> None:
    code = (
        "import pathlib, subprocess, sys\n"
        "p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace('a - b', 'a + b'))\n"
        "sys.exit(subprocess.call([sys.executable, '-m', 'pytest', '-q', '-p', "
        "'no:cacheprovider']))\n"
    )
    result = run(executor, repo, code, lang="python")
    assert result.outcome is Outcome.OK, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    rec = load(executor.audit, executor.store, result.run_id)
    assert [c.path for c in rec.changes] == ["calc.py"]


def test_writes_never_reach_the_host_copy(executor: Executor, repo: Path) -> None:
    before = tree_hash(repo)
    code = (
        f"echo x > {repo}/calc.py; echo x > /inputs/sandcell-workdir.tar; "
        "echo x >> .git/config; rm -rf .git/objects; echo pwned > calc.py; "
        f"ls {repo} 2>&1; true"
    )
    result = run(executor, repo, code)
    assert result.outcome is Outcome.OK, result.stderr
    assert tree_hash(repo) == before
    rec = load(executor.audit, executor.store, result.run_id)
    # .git is never part of a change set.
    assert [c.path for c in rec.changes] == ["calc.py"]


def test_symlinks_out_of_the_repository(
    executor: Executor, repo: Path, stores: ChangeApprovals, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("HOST-ONLY-CONTENT\n")
    os.symlink(str(secret), repo / "escape")
    os.symlink("../host-secret", repo / "up")
    result = run(
        executor,
        repo,
        "readlink escape; cat escape up 2>&1; ln -s /etc/shadow leak; ln -s calc.py inside; true",
    )
    assert result.outcome is Outcome.OK
    assert str(secret) in result.stdout  # copied as a link...
    assert "HOST-ONLY-CONTENT" not in result.stdout  # ...never followed to the host
    rec = load(executor.audit, executor.store, result.run_id)
    by_path = {c.path: c for c in rec.changes}
    assert set(by_path) == {"leak", "inside"}
    assert not by_path["leak"].applicable and by_path["inside"].applicable
    assert b"NOT APPLICABLE" in rec.patch
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    stores.decide(result.run_id, rec.changeset_sha256, approve=True, by="reviewer")
    with pytest.raises(ApplyError, match="pointing outside"):
        _apply(executor, stores, result.run_id, target)
    assert not (target / "leak").is_symlink() and not (target / "inside").exists()


def test_apply_never_follows_a_link_in_the_target(
    executor: Executor, repo: Path, stores: ChangeApprovals, tmp_path: Path
) -> None:
    (repo / "sub").mkdir()
    (repo / "sub" / "a.txt").write_text("a\n")
    result = run(executor, repo, "echo b > sub/a.txt")
    rec = load(executor.audit, executor.store, result.run_id)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("a\n")
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    shutil.rmtree(target / "sub")
    os.symlink(outside, target / "sub")
    stores.decide(result.run_id, rec.changeset_sha256, approve=True, by="reviewer")
    with pytest.raises(ApplyError, match="not in the state"):
        _apply(executor, stores, result.run_id, target)
    assert (outside / "a.txt").read_text() == "a\n"


def test_binary_and_oversized_changes(
    executor: Executor, repo: Path, stores: ChangeApprovals, tmp_path: Path, root_home: Path
) -> None:
    (repo / "pkg").mkdir()
    (repo / "pkg" / "m.py").write_text("x = 1\n")
    (repo / "was_dir").mkdir()
    (repo / "was_dir" / "f").write_text("f\n")
    blob = (
        "printf '\\x00\\x01\\xff' > data.bin; rm run.sh; mv test_calc.py test_renamed.py; "
        "rm -rf pkg was_dir; echo now-a-file > was_dir"
    )
    result = run(executor, repo, blob)
    rec = load(executor.audit, executor.store, result.run_id)
    actions = {c.path: c.action for c in rec.changes}
    assert actions == {
        "data.bin": "add",
        "run.sh": "delete",
        "test_renamed.py": "rename",
        "pkg": "delete",
        "pkg/m.py": "delete",
        "was_dir": "modify",
        "was_dir/f": "delete",
    }
    assert b"Binary files /dev/null and b/data.bin differ" in rec.patch
    assert b"# sandcell: binary new: 3 bytes, sha256 " in rec.patch
    assert b"rename from test_calc.py" in rec.patch
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    stores.decide(result.run_id, rec.changeset_sha256, approve=True, by="reviewer")
    report = _apply(executor, stores, result.run_id, target, allow_binary=True)
    assert report.as_expected  # type: ignore[attr-defined]
    assert (target / "data.bin").read_bytes() == b"\x00\x01\xff"
    assert not (target / "run.sh").exists() and not (target / "test_calc.py").exists()
    assert (target / "test_renamed.py").read_text() == TESTS
    assert not (target / "pkg").exists()
    assert (target / "was_dir").read_text() == "now-a-file\n"

    small = ExportLimits(max_file_bytes=64 * 1024)
    with Executor(home=root_home, profile="unchecked", export_limits=small) as ex:
        huge = run(ex, repo, "head -c 300000 /dev/urandom > big.bin")
    assert huge.outcome is Outcome.OK
    assert not any(a.path == "changes.patch" for a in huge.artifacts)
    reasons = [r.reason for r in huge.rejected_exports if r.path == "changes.patch"]
    assert reasons and "no change set" in reasons[0]


def test_the_source_must_fit_the_workspace(executor: Executor, repo: Path) -> None:
    (repo / "big").write_bytes(b"x" * (2 * 1024 * 1024))
    request = RunRequest(code="true", language="bash", limits=Limits(workspace_bytes=1024 * 1024))
    with pytest.raises(ConfigError, match="more than the workspace"):
        run_in_workdir(executor, request, repo)
    (repo / "big").unlink()
    os.mkfifo(repo / "pipe")
    with pytest.raises(ConfigError, match="FIFO"):
        run(executor, repo, "true")
    (repo / "pipe").unlink()
    node = RunRequest(code="console.log(1)", language="javascript")
    with pytest.raises(ConfigError, match="javascript program cannot run in a working directory"):
        run_in_workdir(executor, node, repo)


def test_apply_refuses_a_target_that_moved(
    executor: Executor, repo: Path, stores: ChangeApprovals, tmp_path: Path
) -> None:
    result = run(executor, repo, FIX)
    rec = load(executor.audit, executor.store, result.run_id)
    approval = stores.decide(result.run_id, rec.changeset_sha256, approve=True, by="reviewer")
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    (target / "test_calc.py").write_text(TESTS + "# edited meanwhile\n")
    with pytest.raises(ApplyError, match=r"test_calc\.py: content changed"):
        _apply(executor, stores, result.run_id, target, approval_id=approval.id)
    assert (target / "calc.py").read_text() == BUGGY
    # Refused before the approval was used: once the target is back, it applies.
    (target / "test_calc.py").write_text(TESTS)
    _apply(executor, stores, result.run_id, target, approval_id=approval.id)
    assert "a + b" in (target / "calc.py").read_text()


def test_forged_foreign_and_denied_approvals(
    executor: Executor, repo: Path, stores: ChangeApprovals, tmp_path: Path
) -> None:
    one = run(executor, repo, FIX)
    other = run(executor, repo, "echo other > other.txt")
    rec_one = load(executor.audit, executor.store, one.run_id)
    rec_other = load(executor.audit, executor.store, other.run_id)
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    with pytest.raises(ChangeApprovalError, match="never given"):
        _apply(executor, stores, one.run_id, target, approval_id="c" + "0" * 32)
    for_other = stores.decide(other.run_id, rec_other.changeset_sha256, approve=True, by="r")
    with pytest.raises(ChangeApprovalError, match="is for run"):
        _apply(executor, stores, one.run_id, target, approval_id=for_other.id)
    # An approval naming this run but another hash (what a reviewer saw before a change).
    stale = stores.decide(one.run_id, "f" * 64, approve=True, by="r")
    with pytest.raises(ChangeApprovalError, match="approves another diff"):
        _apply(executor, stores, one.run_id, target, approval_id=stale.id)
    earlier = stores.decide(one.run_id, rec_one.changeset_sha256, approve=True, by="r")
    denied = stores.decide(one.run_id, rec_one.changeset_sha256, approve=False, by="r")
    with pytest.raises(ChangeApprovalError, match="overruled"):
        _apply(executor, stores, one.run_id, target, approval_id=earlier.id)
    with pytest.raises(ChangeApprovalError, match="was denied"):
        _apply(executor, stores, one.run_id, target, approval_id=denied.id)
    with pytest.raises(ChangeApprovalError, match="was denied"):
        _apply(executor, stores, one.run_id, target)
    assert (target / "calc.py").read_text() == BUGGY


def test_a_tampered_change_set_is_refused(repo: Path, tmp_path: Path) -> None:
    # A store of its own: stored content is shared by every run with the same bytes.
    with Executor(home=tmp_path / "home", profile="unchecked") as ex:
        result = run(ex, repo, FIX)
        for name in ("changes.patch", "changes.tar"):
            art = next(a for a in result.artifacts if a.path == name)
            stored = ex.store.path_for(art.sha256)
            original = stored.read_bytes()
            stored.write_bytes(original.replace(b"a + b", b"a * b"))
            with pytest.raises(ConfigError, match=f"{name} of run .* does not match the hash"):
                load(ex.audit, ex.store, result.run_id)
            stored.write_bytes(original)
        assert load(ex.audit, ex.store, result.run_id).changes


def test_secret_shaped_tokens_in_the_diff_are_findings(executor: Executor, repo: Path) -> None:
    token = "ghp_" + "a1B2c3D4e5" * 3 + "a1B2c3"
    result = run(executor, repo, f"echo 'TOKEN = \"{token}\"' >> calc.py")
    rec = load(executor.audit, executor.store, result.run_id)
    assert any(f["check"] == "secrets" for f in rec.findings), rec.findings


def test_changed_code_goes_through_the_static_checks(executor: Executor, repo: Path) -> None:
    result = run(
        executor,
        repo,
        "printf 'import socket\\nsocket.socket()\\n' > net.py; "
        "printf 'const n: number = 1;\\nprocess.dlopen(module, \"/x.node\");\\n' > load.ts; "
        "printf 'eval(\"1\" + n)\\n' > tool.cjs",
    )
    rec = load(executor.audit, executor.store, result.run_id)
    code = [f for f in rec.findings if f["check"] == "code"]
    assert {f["path"] for f in code} == {"net.py", "load.ts", "tool.cjs"}, rec.findings
    # Each file is judged in its own language, at its own line.
    assert ("load.ts", "js.native", 2) in {(f["path"], f["what"], f["line"]) for f in code}
    assert ("tool.cjs", "js.dynamic-code", 1) in {(f["path"], f["what"], f["line"]) for f in code}


def test_cli_show_approve_apply(repo: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "SANDCELL_HOME": str(home), "SANDCELL_APPROVER": "cli-reviewer"}
    ran = run_cli(
        ["run", "--json", "--profile", "unchecked", "--lang", "bash", "--workdir-from",
         str(repo), "--export-diff", "-c", f"{FIX} && {TEST}"],
        env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    shown = run_cli(["changes", "show", run_id], env=env)
    assert shown.returncode == 0, shown.stderr
    assert "outcome ok" in shown.stdout and "modify      calc.py" in shown.stdout
    assert "Ran 1 test" in shown.stdout  # the tests' report, from the run's record
    assert "+    return a + b" in shown.stdout
    sha = json.loads(run_cli(["changes", "show", "--json", run_id], env=env).stdout)[
        "changeset_sha256"
    ]
    target = tmp_path / "target"
    shutil.copytree(repo, target, symlinks=True)
    refused = run_cli(["changes", "apply", run_id, "--to", str(target)], env=env)
    assert refused.returncode != 0 and "needs an approval" in refused.stderr
    wrong = run_cli(["changes", "approve", run_id, "--sha256", "0" * 64], env=env)
    assert wrong.returncode != 0 and "review it again" in wrong.stderr
    ok = run_cli(["changes", "approve", run_id, "--sha256", sha], env=env)
    assert ok.returncode == 0, ok.stderr
    applied = run_cli(["changes", "apply", run_id, "--to", str(target)], env=env)
    assert applied.returncode == 0, applied.stderr
    assert "a + b" in (target / "calc.py").read_text()
    reused = run_cli(["changes", "apply", run_id, "--to", str(repo)], env=env)
    assert reused.returncode != 0 and "already used" in reused.stderr
    assert (repo / "calc.py").read_text() == BUGGY
    listed = run_cli(["audit", "list"], env=env)
    assert listed.returncode == 0 and "applied" in listed.stdout, listed.stderr
    assert run_cli(["audit", "verify"], env=env).returncode == 0


def test_unprivileged_user(unpriv: UnprivEnv, repo: Path) -> None:
    mine = unpriv.home / "repo"
    shutil.copytree(repo, mine, symlinks=True)
    subprocess.run(["chown", "-R", f"{unpriv.user}:", str(mine)], check=True)
    before = tree_hash(mine)
    proc = run_as_user(
        unpriv,
        ["run", "--json", "--isolation", unpriv.mode.value, "--lang", "bash", "--workdir-from",
         str(mine), "--export-diff", "-c", f"{FIX} && {TEST}"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    assert {a["path"] for a in out["artifacts"]} >= {"changes.patch", "changes.json"}
    assert tree_hash(mine) == before
    with AuditLog(unpriv.home / "audit.sqlite3") as audit:
        entry = audit.get(out["run_id"])
    assert entry is not None


@pytest.mark.parametrize("backend", ["gvisor", "microvm"])
def test_upper_rungs(
    backend: str,
    ladder_executors: dict[tuple[str, str], Executor],
    root_home: Path,
    repo: Path,
) -> None:
    start = "pool" if backend == "microvm" else "cold"
    ex = ladder_executor(ladder_executors, root_home, backend, start)
    before = tree_hash(repo)
    result = run(ex, repo, f"{FIX}; chmod -x run.sh; ln -s calc.py link; {TEST}")
    assert result.outcome is Outcome.OK, result.stdout + result.stderr
    assert result.enforcement is not None and result.enforcement.backend == backend
    assert tree_hash(repo) == before
    rec = load(ex.audit, ex.store, result.run_id)
    assert {(c.action, c.path) for c in rec.changes} == {
        ("modify", "calc.py"),
        ("mode", "run.sh"),
        ("add", "link"),
    }


def test_a_run_that_needs_approval_does_not_wait_without_its_snapshot(
    executor: Executor, repo: Path
) -> None:
    result = run(executor, repo, "true", profile="supervised")
    assert result.outcome is Outcome.DENIED
    assert "cannot wait for approval" in result.reason
    ticket = result.policy["approval"]["id"]  # type: ignore[index]
    assert executor.approvals.get(ticket).status == "denied"


FIX_TURN = (
    f"Plan: fix add, run the tests.\n\n```bash\n{FIX} && {TEST} && echo 'tests passed: 1'\n```\n"
)
FIX_ANSWER = (
    '```answer\n{"explanation": "add subtracted; it adds now and the test passes.", '
    '"figures": [{"name": "tests passed", "value": 1, "unit": "", "run": "1"}]}\n```'
)


def test_the_agent_answers_with_the_patch_and_its_tests(executor: Executor, repo: Path) -> None:
    from sandcell.agent import Agent
    from sandcell.models.fake import ScriptedModel

    # A JavaScript program first: unchecked runs JavaScript, but not in a working directory;
    # the model is told so and writes the Bash one.
    second = FIX_ANSWER.replace('"run": "1"', '"run": "2"')  # the Bash run is attempt 2
    model = ScriptedModel(["```js\nconsole.log(1)\n```", FIX_TURN, second])
    answer = Agent(executor, model).ask("Fix the failing test of this repository.", workdir=repo)
    assert answer.stop_reason == "answered", answer.message
    assert "cannot run in this task's working directory" in model.calls[1][-1].content
    assert "copy of the repository 'repo'" in model.calls[0][-1].content
    assert answer.run_ids and {"changes.patch", "changes.json"} <= {
        a.path for a in answer.artifacts
    }
    rec = load(executor.audit, executor.store, answer.run_ids[-1])
    assert rec.outcome == "ok" and [c.path for c in rec.changes] == ["calc.py"]
    assert (repo / "calc.py").read_text() == BUGGY


def test_cli_ask_prints_the_patch(repo: Path, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([FIX_TURN, FIX_ANSWER]))
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    proc = run_cli(
        ["ask", "--profile", "unchecked", "--model", f"scripted:{script}", "--workdir-from",
         str(repo), "Fix the failing test."],
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "patch of run" in proc.stdout and "+    return a + b" in proc.stdout
    assert "sandcell changes apply" in proc.stdout and str(repo) in proc.stdout


def test_warm_pool_python_runs(executor_pool: Executor, repo: Path) -> None:
    code = (
        "import pathlib, subprocess, sys\n"
        "p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace('a - b', 'a + b'))\n"
        "sys.exit(subprocess.call([sys.executable, '-m', 'unittest', '-q']))\n"
    )
    before = tree_hash(repo)
    result = run(executor_pool, repo, code, lang="python")
    assert result.outcome is Outcome.OK, result.stderr
    assert tree_hash(repo) == before
    rec = load(executor_pool.audit, executor_pool.store, result.run_id)
    assert [c.path for c in rec.changes] == ["calc.py"]
