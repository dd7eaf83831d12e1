"""Replay of recorded runs (``Executor.replay``, ``sandcell audit replay``) in real sandboxes."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from tests.conftest import backend_unavailable, run_cli, runtime_required
from tests.unit.test_packages import make_wheel

from sandcell.errors import IsolationUnavailable
from sandcell.executor import Executor
from sandcell.policy.profiles import load_profile
from sandcell.replay import ReplayRefused
from sandcell.spec import InputFile, Outcome, RunRequest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these replays run sandboxes as root")

UNCHECKED = (
    Path(__file__).resolve().parents[2] / "src/sandcell/policy/builtin/unchecked.toml"
).read_text()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def ex(home: Path) -> Iterator[Executor]:
    with Executor(home=home, profile="unchecked", backend="namespaces") as executor:
        yield executor


def _profile_file(tmp_path: Path, name: str, **replace: str) -> Path:
    """A user profile: the built-in unchecked one under another name, each line that starts
    with a key of ``replace`` replaced by ``key = value``."""
    path = tmp_path / "profiles" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        next((f"{k} = {v}" for k, v in replace.items() if line.startswith(f"{k} =")), line)
        for line in UNCHECKED.splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _record(ex: Executor, run_id: str) -> dict[str, object]:
    entry = ex.audit.get(run_id)
    assert entry is not None
    return dict(entry.record)


def test_identical_replay_matches_and_links(ex: Executor, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("3\n4\n")
    code = (
        "import sys\n"
        "nums = [int(x) for x in open('/inputs/data.txt')]\n"
        "open('sum.txt', 'w').write(str(sum(nums)))\n"
        "print(sys.stdin.read().upper(), sum(nums))\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    original = ex.run(
        RunRequest(
            code=code,
            inputs=(InputFile(host_path=data, name="data.txt"),),
            exports=("sum.txt",),
            stdin=b"piped in",
        )
    )
    assert original.outcome is Outcome.OK, original.reason
    assert original.stdout == "PIPED IN 7\n"

    report = ex.replay(original.run_id)

    assert report.matched, report.to_dict()
    assert report.plan.exact and report.plan.notes == ()
    assert report.result.run_id != original.run_id
    assert report.result.stdout == original.stdout
    assert [c.field for c in report.comparison.checks if c.matched] == [
        "outcome",
        "exit_code",
        "signal",
        "stdout",
        "stderr",
        "artifacts",
        "outputs",
    ]
    record = _record(ex, report.result.run_id)
    assert record["replay_of"] == original.run_id
    assert isinstance(record["replay"], dict) and record["replay"]["exact"] is True
    assert record["stdin_kept"] is True
    assert record["artifacts"] == _record(ex, original.run_id)["artifacts"]


def test_input_changed_or_gone_is_refused(ex: Executor, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("one")
    original = ex.run(
        RunRequest(
            code="print(open('/inputs/data.txt').read())",
            inputs=(InputFile(host_path=data, name="data.txt"),),
        )
    )
    assert original.outcome is Outcome.OK
    before = ex.audit.count()

    data.write_text("two")
    with pytest.raises(ReplayRefused, match=r"input 'data.txt' .* changed since the run"):
        ex.replay(original.run_id)
    data.unlink()
    with pytest.raises(ReplayRefused, match=r"input 'data.txt' .* is gone"):
        ex.replay(original.run_id)
    assert ex.audit.count() == before  # nothing ran, nothing recorded


def test_profile_changed_refused_then_replayed_under_current(home: Path, tmp_path: Path) -> None:
    path = _profile_file(tmp_path, "mine")
    with Executor(home=home, profile=str(path), backend="namespaces") as ex:
        original = ex.run(RunRequest(code="print(6 * 7)"))
        assert original.outcome is Outcome.OK

        path.write_text(path.read_text() + "\n# edited after the run\n")
        with pytest.raises(ReplayRefused, match=r"profile 'mine' .* changed since run"):
            ex.replay(original.run_id)

        report = ex.replay(original.run_id, use_current_profile=True)

    assert report.comparison.matched
    assert not report.plan.exact
    assert report.plan.profile.sha256 == load_profile(str(path)).sha256
    assert any("profile 'mine' changed" in n for n in report.plan.notes)
    with Executor(home=home, profile="unchecked", backend="namespaces") as ex:
        replay = _record(ex, report.result.run_id)["replay"]
    assert isinstance(replay, dict) and replay["profile"] == "current"
    assert replay["exact"] is False


def test_wheel_cache_packages_by_hash(home: Path, tmp_path: Path) -> None:
    path = _profile_file(tmp_path, "withpkg", allowed_packages='["tinypkg"]')
    with Executor(home=home, profile=str(path), backend="namespaces") as ex:
        ex.wheels.prepare_files([make_wheel(tmp_path / "v1", version="1.0")])
        original = ex.run(RunRequest(code="import tinypkg\nprint(tinypkg.VALUE)"))
        assert original.stdout == "1\n", original.reason
        packages = _record(ex, original.run_id)["packages"]
        assert isinstance(packages, list) and [p["version"] for p in packages] == ["1.0"]

        assert ex.replay(original.run_id).matched

        upgrade = {"tinypkg/__init__.py": b"VALUE = 2\n"}
        ex.wheels.prepare_files([make_wheel(tmp_path / "v2", version="2.0", files=upgrade)])
        with pytest.raises(ReplayRefused, match=r"package tinypkg .* changed in the wheel cache"):
            ex.replay(original.run_id)


def test_a_typescript_run_is_replayed_on_the_node_runtime(ex: Executor) -> None:
    runtime_required("node")
    code = 'const n: number = 42;\nconsole.log(require("lodash").sum([n, 0]));\n'
    original = ex.run(RunRequest(code=code, language="typescript", stdin=b"x"))
    assert (original.outcome, original.stdout) == (Outcome.OK, "42\n"), original.stderr

    report = ex.replay(original.run_id)

    assert report.matched and report.plan.exact, report.to_dict()
    assert report.plan.request.language == "typescript"
    assert _record(ex, report.result.run_id)["runtime"] == _record(ex, original.run_id)["runtime"]


def test_non_deterministic_program_is_reported_differing(ex: Executor) -> None:
    code = "import random, time\nprint(random.random(), time.time_ns())"
    original = ex.run(RunRequest(code=code))
    assert original.outcome is Outcome.OK

    report = ex.replay(original.run_id)

    assert not report.matched
    assert report.comparison.differing == ("stdout",)
    stdout = next(c for c in report.comparison.checks if c.field == "stdout")
    assert stdout.diff[0] == "--- original stdout"
    assert f"-{original.stdout.strip()}" in stdout.diff
    assert f"+{report.result.stdout.strip()}" in stdout.diff


def test_environment_values_must_be_given_again(ex: Executor) -> None:
    original = ex.run(
        RunRequest(code="import os; print(os.environ['GREETING'])", env={"GREETING": "hi"})
    )
    assert original.stdout == "hi\n"
    with pytest.raises(ReplayRefused, match="GREETING, whose values are never recorded"):
        ex.replay(original.run_id)
    with pytest.raises(ReplayRefused, match="had no environment variables OTHER"):
        ex.replay(original.run_id, env={"GREETING": "hi", "OTHER": "x"})

    report = ex.replay(original.run_id, env={"GREETING": "hi"})

    assert report.matched
    assert any("GREETING" in n for n in report.plan.notes)


def test_session_cell_is_refused(ex: Executor) -> None:
    with ex.session() as session:
        session.run("x = 41")
        cell = session.run("print(x + 1)")
    assert cell.stdout == "42\n"
    with pytest.raises(ReplayRefused, match=r"is a cell of session .* cannot be replayed on its"):
        ex.replay(cell.run_id)


def test_record_predating_replay_fields(ex: Executor) -> None:
    original = ex.run(RunRequest(code="print('old')"))
    record = _record(ex, original.run_id)
    for key in ("record_version", "stdin_kept", "packages", "landlock", "declared"):
        del record[key]
    # Two made-up ids with fixed, different prefixes: they can never be the same id.
    old = ex.audit.append({**record, "run_id": "0ldA" + original.run_id[4:]})

    report = ex.replay(old.run_id)

    assert report.matched
    assert not report.plan.exact
    assert any("predates replay records" in n for n in report.plan.notes)
    assert any("resolved from the current wheel cache, unverified" in n for n in report.plan.notes)

    # Stdin that an old record only hashed cannot be fed again: refused, not guessed.
    with_stdin = {**record, "run_id": "0ldB" + original.run_id[4:], "stdin_sha256": "ab" * 32}
    ex.audit.append(with_stdin)
    with pytest.raises(ReplayRefused, match="record predates kept stdin"):
        ex.replay(str(with_stdin["run_id"]))


def test_unknown_run_id(ex: Executor) -> None:
    with pytest.raises(ReplayRefused, match="no run 'feedface0000' in the audit log"):
        ex.replay("feedface0000")


def test_tampered_audit_chain_refuses(ex: Executor, home: Path) -> None:
    original = ex.run(RunRequest(code="print('real')"))
    ex.run(RunRequest(code="print('later')"))
    with sqlite3.connect(home / "audit.sqlite3") as conn:
        query = "SELECT record FROM runs WHERE run_id = ?"
        row = conn.execute(query, (original.run_id,)).fetchone()
        forged = str(row[0]).replace("print('real')", "print('forged')")
        conn.execute("UPDATE runs SET record = ? WHERE run_id = ?", (forged, original.run_id))
    before = ex.audit.count()
    with pytest.raises(ReplayRefused, match=r"fails verification .*changed"):
        ex.replay(original.run_id)
    assert ex.audit.count() == before


def test_replay_needs_approval_again(home: Path, tmp_path: Path) -> None:
    path = _profile_file(tmp_path, "gated", approval='"always"')
    with Executor(home=home, profile=str(path), backend="namespaces") as ex:
        original = ex.run(RunRequest(code="print('approved once')"), approve=lambda _t: True)
        assert original.outcome is Outcome.OK

        report = ex.replay(original.run_id)

        assert report.result.outcome is Outcome.AWAITING_APPROVAL
        assert report.pending is not None and "waits for approval" in report.pending
        assert not report.matched
        waiting = _record(ex, report.result.run_id)
        assert waiting["replay_of"] == original.run_id
        policy = waiting["policy"]
        assert isinstance(policy, dict)
        approval_id = str(policy["approval"]["id"])

        approved = ex.run_approved(approval_id, by="test")

        assert approved.stdout == "approved once\n"
        assert _record(ex, approved.run_id)["replay_of"] == original.run_id


@pytest.mark.parametrize("backend", ["gvisor", pytest.param("microvm", marks=pytest.mark.slow)])
def test_other_backend_and_override(home: Path, backend: str) -> None:
    try:
        upper = Executor(home=home, profile="unchecked", backend=backend)
    except IsolationUnavailable as exc:
        backend_unavailable(backend, str(exc))
    with upper:
        original = upper.run(RunRequest(code=f"print('on {backend}')"))
        assert original.outcome is Outcome.OK, original.reason
        same = upper.replay(original.run_id)
    assert same.matched
    assert same.plan.backend == backend
    assert _record_in(home, same.result.run_id)["backend"]["name"] == backend  # type: ignore[index]

    with Executor(home=home, profile="unchecked", backend="namespaces") as ns:
        with pytest.raises(ReplayRefused, match=rf"ran on backend '{backend}'.*override"):
            ns.replay(original.run_id)
        moved = ns.replay(original.run_id, backend="namespaces")
    assert moved.comparison.matched
    assert not moved.plan.exact
    replay = _record_in(home, moved.result.run_id)["replay"]
    assert replay["backend"] == {"recorded": backend, "used": "namespaces"}  # type: ignore[index]


def _record_in(home: Path, run_id: str) -> dict[str, object]:
    from sandcell.audit import AuditLog

    with AuditLog(home / "audit.sqlite3") as log:
        entry = log.get(run_id)
    assert entry is not None
    return dict(entry.record)


def test_cli_replay_compare_and_show(ex: Executor, home: Path, tmp_path: Path) -> None:
    data = tmp_path / "in.txt"
    data.write_text("cli")
    original = ex.run(
        RunRequest(
            code="print(open('/inputs/in.txt').read())",
            inputs=(InputFile(host_path=data, name="in.txt"),),
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SANDCELL_BACKEND", "SANDCELL_URL")}

    done = run_cli(["--home", str(home), "audit", "replay", original.run_id, "--json"], env=env)

    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["matched"] is True and body["original_run_id"] == original.run_id
    shown = run_cli(["--home", str(home), "audit", "show", body["replay_run_id"]], env=env)
    assert f"# replay of {original.run_id}" in shown.stdout
    compared = run_cli(
        ["--home", str(home), "audit", "compare", original.run_id, body["replay_run_id"]], env=env
    )
    assert compared.returncode == 0 and "same     stdout" in compared.stdout

    data.write_text("changed")
    refused = run_cli(["--home", str(home), "audit", "replay", original.run_id], env=env)
    assert refused.returncode == 78
    assert "input 'in.txt'" in refused.stderr and "changed since the run" in refused.stderr
    unknown = run_cli(["--home", str(home), "audit", "replay", "nosuchrun"], env=env)
    assert unknown.returncode == 78 and "no run 'nosuchrun'" in unknown.stderr


def test_cli_backend_unavailable_here_is_refused_with_the_fix(ex: Executor, home: Path) -> None:
    original = ex.run(RunRequest(code="print('rung')"))
    record = _record(ex, original.run_id)
    # The same run as recorded on gVisor; this host then loses runsc ($SANDCELL_RUNSC names
    # none), which is what a replay on a host without gVisor meets.
    moved = {**record, "run_id": "9d" + original.run_id[2:], "backend": {"name": "gvisor"}}
    ex.audit.append(moved)
    env = {k: v for k, v in os.environ.items() if k not in ("SANDCELL_BACKEND", "SANDCELL_URL")}
    env["SANDCELL_RUNSC"] = "/nonexistent/runsc"
    args = ["--home", str(home), "audit", "replay", str(moved["run_id"])]

    refused = run_cli(args, env=env)

    assert refused.returncode == 78, refused.stderr
    assert "backend 'gvisor', unavailable here" in refused.stderr
    assert "install gVisor" in refused.stderr and "--backend NAME" in refused.stderr

    overridden = run_cli([*args, "--backend", "namespaces", "--json"], env=env)

    assert overridden.returncode == 0, overridden.stderr
    body = json.loads(overridden.stdout)
    assert body["matched"] is True and body["exact"] is False
    assert body["backend"] == "namespaces" and body["recorded_backend"] == "gvisor"


def test_wrapped_run_is_replayed_as_it_ran_and_says_so(ex: Executor) -> None:
    def harness(request: RunRequest) -> RunRequest:
        return replace(request, code=f"print('harness:')\n{request.code}")

    original = ex.run(RunRequest(code="print('task')"), wrap=harness)
    assert original.stdout == "harness:\ntask\n"

    report = ex.replay(original.run_id)

    assert report.matched and report.result.stdout == original.stdout
    assert any("wrapped by a batch harness" in n for n in report.plan.notes)


def _workdir_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    (repo / "test_a.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_a(self):\n"
        "        self.assertEqual(open('a.txt').read(), 'b\\n')\n"
    )
    return repo


def test_a_workdir_run_is_replayed_on_its_kept_snapshot(
    ex: Executor, home: Path, tmp_path: Path
) -> None:
    from sandcell.changes.run import run_in_workdir

    repo = _workdir_repo(tmp_path)
    program = "echo b > a.txt && python3 -m unittest -q 2>/dev/null && echo tests passed"
    original = run_in_workdir(ex, RunRequest(code=program, language="bash"), repo)
    assert original.outcome is Outcome.OK and original.stdout == "tests passed\n", original.stdout
    recorded = _record(ex, original.run_id)["workdir"]
    assert recorded["program"] == program  # type: ignore[index]
    kept = recorded["snapshot"]  # type: ignore[index]
    assert ex.store.has(kept["archive_sha256"])
    assert kept["tree_sha256"] == recorded["manifest_sha256"]  # type: ignore[index]
    # The replay runs on the snapshot the run kept, not on what the directory holds now.
    (repo / "a.txt").write_text("changed since\n")

    report = ex.replay(original.run_id)

    assert report.matched, report.comparison.to_dict()
    assert report.plan.exact, report.plan.notes
    changes = next(c for c in report.comparison.checks if c.field == "changes")
    assert changes.matched and "patch sha256" in changes.original
    replayed = _record(ex, report.result.run_id)
    assert replayed["replay_of"] == original.run_id
    assert replayed["workdir"]["manifest_sha256"] == recorded["manifest_sha256"]  # type: ignore[index]
    # And through the CLI.
    env = {**os.environ, "SANDCELL_HOME": str(home)}
    shown = run_cli(["audit", "replay", original.run_id], env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr


def test_a_workdir_replay_with_another_change_set_differs(ex: Executor, tmp_path: Path) -> None:
    from sandcell.changes.run import run_in_workdir

    repo = _workdir_repo(tmp_path)
    program = "import os\nopen('a.txt', 'w').write(os.urandom(8).hex())\n"
    original = run_in_workdir(ex, RunRequest(code=program), repo)
    assert original.outcome is Outcome.OK, original.stderr

    report = ex.replay(original.run_id)

    assert not report.matched and "changes" in report.comparison.differing


def test_a_workdir_run_whose_snapshot_is_gone_is_refused(ex: Executor, tmp_path: Path) -> None:
    from sandcell.changes.run import run_in_workdir

    repo = _workdir_repo(tmp_path)
    original = run_in_workdir(ex, RunRequest(code="print(open('a.txt').read())"), repo)
    assert original.outcome is Outcome.OK, original.reason
    kept = _record(ex, original.run_id)["workdir"]["snapshot"]  # type: ignore[index]
    ex.store.path_for(kept["archive_sha256"]).unlink()
    with pytest.raises(ReplayRefused, match="no longer in the artifact store"):
        ex.replay(original.run_id)


def test_display_outputs_are_compared(ex: Executor) -> None:
    original = ex.run(RunRequest(code="{'answer': 6 * 7}", display=True))
    assert original.outcome is Outcome.OK and len(original.outputs) == 1

    report = ex.replay(original.run_id)

    assert report.matched
    [outputs] = [c for c in report.comparison.checks if c.field == "outputs"]
    assert outputs.matched and outputs.original == "1 output(s)"
