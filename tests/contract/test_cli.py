"""The command-line contract: what scripts and other tools may rely on.

Every test runs ``python -m sandcell`` as a subprocess with ``SANDCELL_HOME`` pointing at a fresh
temporary directory, so records and artifacts never touch the real data directory. A few cases go
through ``sandcell.cli.main`` in-process, which must return the exit status rather than exit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from tests.conftest import run_cli, runtime_required

from sandcell import Executor, RunRequest, RunResult
from sandcell.backends.host import cgroups
from sandcell.cli import main
from sandcell.errors import IsolationUnavailable
from sandcell.status import EXIT_CONFIG, EXIT_MEMORY_LIMIT, EXIT_OUTPUT_LIMIT, EXIT_TIMEOUT

JSON_KEYS = {
    "run_id",
    "outcome",
    "exit_code",
    "signal",
    "stdout",
    "stderr",
    "stdout_truncated",
    "stderr_truncated",
    "usage",
    "artifacts",
    "enforcement",
}


def _mode_args() -> list[str]:
    """``--isolation=rlimits`` where this identity gets no cgroups (an ordinary user on a host
    without delegation); nothing where the default strict mode works."""
    return ["--isolation=rlimits"] if isinstance(cgroups.detect(), IsolationUnavailable) else []


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def sandcell(
    home: Path, *args: str, stdin: bytes = b"", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``sandcell ARGS`` with its data directory in ``home``; ``run`` gets the isolation mode."""
    argv = list(args)
    if argv and argv[0] == "run":
        argv[1:1] = _mode_args()
    # These tests are about the execution layer's command line, so the code goes straight to the
    # sandbox; the policy commands have their own tests (tests/contract/test_policy_cli.py).
    env = {**os.environ, "SANDCELL_HOME": str(home), "SANDCELL_PROFILE": "unchecked"}
    return run_cli(argv, env=env, stdin=stdin, cwd=cwd)


def run_json(home: Path, *args: str, stdin: bytes = b"") -> tuple[int, dict[str, object]]:
    p = sandcell(home, "run", "--json", *args, stdin=stdin)
    body = json.loads(p.stdout)
    assert isinstance(body, dict), p.stdout
    return p.returncode, body


# -- running programs --------------------------------------------------------------------------


def test_run_code(home: Path) -> None:
    p = sandcell(home, "run", "-c", "print(6*7)")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "42\n"
    assert p.stderr == ""


def test_run_file(home: Path, tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nprint('from file', sys.argv[0].endswith('.py'))\n")
    p = sandcell(home, "run", str(prog))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "from file True\n"


def test_run_javascript_and_typescript(home: Path, tmp_path: Path) -> None:
    runtime_required("node")
    program = 'const _ = require("lodash");\nconsole.log(_.sum([40, 2]), process.version);\n'
    p = sandcell(home, "run", "--lang", "js", "-c", program)
    assert (p.returncode, p.stdout) == (0, "42 v22.23.5\n"), p.stderr
    prog = tmp_path / "main.ts"
    prog.write_text("const n: number = 6;\nconsole.log(n * 7);\n")
    p = sandcell(home, "run", "--lang", "TypeScript", "--json", str(prog))
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert (result["outcome"], result["stdout"]) == ("ok", "42\n"), result
    p = sandcell(home, "run", "--lang", "ruby", "-c", "puts 1")
    assert p.returncode == 2 and "unknown language 'ruby'" in p.stderr, p.stderr


def test_run_program_from_stdin(home: Path) -> None:
    p = sandcell(home, "run", "-", stdin=b"print(1)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "1\n"


def test_run_bash(home: Path) -> None:
    p = sandcell(home, "run", "--lang", "bash", "-c", "id; ls /; echo --; ls /opt")
    assert p.returncode == 0, p.stderr
    first, *rest = p.stdout.splitlines()
    assert first.startswith("uid=1000(sandbox) gid=1000(sandbox)"), p.stdout
    # The root lists only the sandbox's own layout, nothing of the host's; /opt holds only the
    # runtime at its fixed neutral path.
    cut = rest.index("--")
    listing, opt = set(rest[:cut]), rest[cut + 1 :]
    assert {"sandbox", "tmp", "proc", "dev", "usr", "home"} <= listing, listing
    assert not listing & {"root", "var", "srv", "mnt", "boot"}, listing
    assert opt == ["sandcell"], opt
    # /home holds the workspace again, at /home/user (layout.SANDBOX_HOME), and nothing else.
    p = sandcell(home, "run", "--lang", "bash", "-c", "ls -a /home; touch x; ls /home/user")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [".", "..", "user", "x"], p.stdout


def test_input_env_and_stdin_flags(home: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("input text\n")
    feed = tmp_path / "feed.bin"
    feed.write_bytes(b"fed bytes")
    p = sandcell(
        home,
        "run",
        "--input",
        str(data),
        "--env",
        "GREETING=hi=there",
        "--stdin",
        str(feed),
        "-c",
        "import os, sys\n"
        "print(open('data.txt').read().strip(), open('/inputs/data.txt').read().strip())\n"
        "print(os.environ['GREETING'])\n"
        "print(sys.stdin.read())",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == "input text input text\nhi=there\nfed bytes\n"


def test_timeout_exits_124(home: Path) -> None:
    p = sandcell(home, "run", "--timeout", "1", "-c", "print('go', flush=True)\nwhile True: pass")
    assert p.returncode == EXIT_TIMEOUT == 124, p.stderr
    assert p.stdout == "go\n"
    assert "sandcell: timeout" in p.stderr


# -- --json ------------------------------------------------------------------------------------


def test_json_prints_exactly_one_object(home: Path) -> None:
    p = sandcell(
        home,
        "run",
        "--json",
        "--export",
        "out/*.txt",
        "-c",
        "import os, sys\nos.mkdir('out')\nopen('out/a.txt', 'w').write('A')\n"
        "print('hello')\nprint('warn', file=sys.stderr)",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("\n") and p.stdout.count("\n") == 1
    body = json.loads(p.stdout)
    assert isinstance(body, dict)
    assert set(body) >= JSON_KEYS
    assert body["outcome"] == "ok"
    assert body["exit_code"] == 0
    assert body["signal"] is None
    assert body["stdout"] == "hello\n"
    assert body["stderr"] == "warn\n"
    assert body["stdout_truncated"] is False and body["stderr_truncated"] is False
    assert set(body["usage"]) >= {"wall_ms", "cpu_ms", "peak_memory_bytes"}
    assert body["usage"]["wall_ms"] > 0
    [art] = body["artifacts"]
    assert {"path", "sha256", "size"} <= set(art)
    assert art["path"] == "out/a.txt"
    assert art["size"] == 1
    assert art["sha256"] == "559aead08264d5795d3909718cdd05abd49572e84fe55590eef31a88a08fdffd"
    assert isinstance(body["enforcement"], dict) and body["enforcement"]["layers"]
    assert len(body["run_id"]) == 32
    # The program's output goes into the object only, never around it.
    assert p.stderr == ""


def test_export_and_out_copy_artifacts(home: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    p = sandcell(
        home,
        "run",
        "--export",
        "out/*.txt",
        "--out",
        str(dest),
        "-c",
        "import os\nos.makedirs('out/sub')\n"
        "open('out/a.txt', 'w').write('alpha')\n"
        "open('out/b.txt', 'w').write('beta')\n"
        "open('out/c.csv', 'w').write('no')\n"
        "open('out/sub/d.txt', 'w').write('no')\n"
        "open('top.txt', 'w').write('no')",
    )
    assert p.returncode == 0, p.stderr
    copied = sorted(str(f.relative_to(dest)) for f in dest.rglob("*") if f.is_file())
    assert copied == ["out/a.txt", "out/b.txt"]
    assert (dest / "out" / "a.txt").read_text() == "alpha"
    assert (dest / "out" / "b.txt").read_text() == "beta"
    assert f"sandcell: exported {dest / 'out' / 'a.txt'}" in p.stderr


# -- exit statuses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected", "outcome"),
    [
        ("import sys; sys.exit(5)", 5, "error"),
        ("raise SystemExit('message')", 1, "error"),
        ("b = b'x' * (200 * 1024 * 1024)", EXIT_MEMORY_LIMIT, "memory_limit"),
        ("while True: print('y' * 50)", EXIT_OUTPUT_LIMIT, "output_limit"),
        ("import os; os.kill(os.getpid(), 9)", 128 + 9, "killed"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 128 + 15, "killed"),
    ],
    ids=["error", "error-message", "memory", "output", "sigkill", "sigterm"],
)
def test_exit_status_mapping(home: Path, code: str, expected: int, outcome: str) -> None:
    args = ["--memory", "64", "--max-stdout", "1000", "-c", code]
    p = sandcell(home, "run", *args)
    assert p.returncode == expected, p.stderr
    rc, body = run_json(home, *args)
    assert rc == expected
    assert body["outcome"] == outcome, body


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/prog.py"], "does not exist"),
        (["prog.py", "-c", "print(1)"], "not both"),
        (["--env", "NOEQUALS", "-c", "print(1)"], "NAME=VALUE"),
        (["--env", "=value", "-c", "print(1)"], "NAME=VALUE"),
        (["--input", "/nonexistent/data.csv", "-c", "print(1)"], "does not exist"),
        (["--input", "/proc/cpuinfo", "-c", "print(1)"], "kernel pseudo-filesystem"),
        (["--input", "/proc/self/environ", "-c", "print(1)"], "kernel pseudo-filesystem"),
        (["--export", "../escape/*", "-c", "print(1)"], ".."),
        (["--export", "/etc/*", "-c", "print(1)"], "relative"),
        (["--out", "somewhere", "-c", "print(1)"], "--export"),
        # Refused before the run: after it, the run's output was lost behind the error.
        (["--export", "*.txt", "--out", "prog.py", "-c", "print(1)"], "is not a directory"),
        ([], "no program given"),
    ],
    ids=[
        "missing-file",
        "file-and-c",
        "env-no-equals",
        "env-no-name",
        "missing-input",
        "procfs-input",
        "procfs-self-input",
        "export-dotdot",
        "export-absolute",
        "out-without-export",
        "out-is-a-file",
        "no-program",
    ],
)
def test_bad_input_is_a_clear_config_error(
    home: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "prog.py").write_text("print(1)\n")
    p = sandcell(home, "run", *args, cwd=tmp_path)
    assert p.returncode == EXIT_CONFIG == 78, (p.returncode, p.stderr)
    assert p.stderr.startswith("sandcell: "), p.stderr
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout == ""
    # Nothing ran, so nothing was recorded.
    listing = sandcell(home, "audit", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout) == []


def test_a_bad_profile_in_the_environment_is_named_as_such(home: Path) -> None:
    env = {**os.environ, "SANDCELL_HOME": str(home), "SANDCELL_PROFILE": "stric"}
    p = run_cli(["run", "-c", "print(1)"], env=env)
    assert p.returncode == EXIT_CONFIG, p.stderr
    assert p.stderr.startswith("sandcell: $SANDCELL_PROFILE: unknown profile 'stric'"), p.stderr
    # Named on the command line, the profile wins over the environment.
    assert run_cli(["run", "--profile", "stric", "-c", "1"], env=env).stderr.startswith(
        "sandcell: unknown profile 'stric'"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--lang", "cobol", "-c", "x"],
        ["run", "--timeout", "soon", "-c", "x"],
        ["frobnicate"],
    ],
    ids=["bad-lang", "bad-number", "bad-command"],
)
def test_usage_errors_exit_2(home: Path, args: list[str]) -> None:
    p = sandcell(home, *args)
    assert p.returncode == 2, p.stderr
    assert "usage:" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        # A value no limit can have names the option the user typed, in the user's units.
        ("--timeout", "0", "--timeout must be a positive number, got 0"),
        ("--memory", "-5", "--memory must be a positive number, got -5"),
        ("--timeout", "nan", "--timeout must be a positive number, got nan"),
        ("--timeout", "inf", "--timeout must be a positive number, got inf"),
        ("--pids", "1", "limit max_pids must be at least 2"),
        ("--memory", "1", "limit memory_bytes=1048576 is below 16 MiB"),
    ],
    ids=[
        "zero-timeout",
        "negative-memory",
        "nan-timeout",
        "infinite-timeout",
        "one-pid",
        "tiny-memory",
    ],
)
def test_bad_limits_are_config_errors(home: Path, flag: str, value: str, said: str) -> None:
    p = sandcell(home, "run", flag, value, "-c", "print(1)")
    assert p.returncode == EXIT_CONFIG, p.stderr
    assert p.stderr.startswith(f"sandcell: {said}"), p.stderr
    assert "Traceback" not in p.stderr


# -- audit -------------------------------------------------------------------------------------


def test_audit_list_show_verify_and_tamper(home: Path) -> None:
    _, first = run_json(home, "-c", "print(6*7)")
    _, second = run_json(home, "--lang", "bash", "-c", "echo second; exit 3")
    ids = [str(first["run_id"]), str(second["run_id"])]

    p = sandcell(home, "audit", "list")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(ids[1]) and lines[1].startswith(ids[0])  # newest first
    assert "error" in lines[0] and "ok" in lines[1]

    p = sandcell(home, "audit", "list", "--json")
    summaries = json.loads(p.stdout)
    assert [s["run_id"] for s in summaries] == ids[::-1]
    assert [s["language"] for s in summaries] == ["bash", "python"]

    p = sandcell(home, "audit", "show", ids[0])
    assert p.returncode == 0, p.stderr
    assert '"code": "print(6*7)"' in p.stdout
    assert f'"run_id": "{ids[0]}"' in p.stdout

    p = sandcell(home, "audit", "show", "--json", ids[1][:8])
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert shown["record"]["run_id"] == ids[1]
    assert shown["record"]["exit_code"] == 3
    assert shown["record"]["stdout"] == "second\n"
    assert shown["seq"] == 2

    p = sandcell(home, "audit", "show", "0" * 32)
    assert p.returncode == 1
    assert "no run" in p.stderr

    p = sandcell(home, "audit", "verify")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("ok: 2 records")

    # Rewrite history: claim the first run printed something else.
    db = home / "audit.sqlite3"
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT record FROM runs WHERE run_id = ?", (ids[0],)).fetchone()
        record = json.loads(text)
        record["stdout"] = "43\n"
        conn.execute("UPDATE runs SET record = ? WHERE run_id = ?", (json.dumps(record), ids[0]))
    conn.close()
    p = sandcell(home, "audit", "verify")
    assert p.returncode == 1, p.stdout
    assert ids[0] in p.stdout
    assert ids[1] not in p.stdout
    assert "changed" in p.stdout


# -- in-process ---------------------------------------------------------------------------------


def test_main_returns_exit_status(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mode = _mode_args()
    assert main(["--home", str(home), "run", *mode, "-c", "print(6*7)"]) == 0
    assert capsys.readouterr().out == "42\n"

    assert main(["--home", str(home), "run", *mode, "-c", "import sys; sys.exit(4)"]) == 4

    assert main(["--home", str(home), "run", *mode, "--json", "-c", "print('j')"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["stdout"] == "j\n"

    assert main(["--home", str(home), "run", "/nonexistent/prog.py"]) == EXIT_CONFIG
    assert "does not exist" in capsys.readouterr().err

    assert main(["--home", str(home), "audit", "verify"]) == 0
    assert capsys.readouterr().out.startswith("ok: 3 records")


def test_main_usage_error_raises_system_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--lang", "cobol", "-c", "x"])
    assert exc.value.code == 2
    assert "argument --lang: unknown language 'cobol'" in capsys.readouterr().err


# -- asyncio -----------------------------------------------------------------------------------


def test_run_async_runs_overlap_in_time(executor: Executor) -> None:
    """Two awaited runs are in their sandboxes at the same time: each run's interval, as the host
    recorded it (start, then the sandbox's wall time), overlaps the other's. Run one after the
    other, the second would start only once the first had ended, three seconds later at least."""
    code = "import time\ntime.sleep(3)\nprint('slept')"

    async def two() -> list[RunResult]:
        runs = (executor.run_async(RunRequest(code=code)) for _ in range(2))
        return list(await asyncio.gather(*runs))

    intervals = []
    for r in asyncio.run(two()):
        assert r.ok and r.stdout == "slept\n", (r.outcome, r.reason, r.stderr)
        assert r.usage.wall_ms >= 3000, r.usage
        start = dt.datetime.fromisoformat(r.started_at).timestamp()
        intervals.append((start, start + r.usage.wall_ms / 1000))
    (_, first_end), (second_start, _) = sorted(intervals)
    assert second_start < first_end, f"the runs did not overlap: {sorted(intervals)}"


def test_run_async_runs_concurrently(executor: Executor) -> None:
    code = (
        "import os, sys\nn = int(sys.stdin.read())\nos.mkdir('out')\n"
        "open('out/n.txt', 'w').write(str(n * n))\nprint(n)"
    )

    async def many() -> list[RunResult]:
        return list(
            await asyncio.gather(
                *(
                    executor.run_async(
                        RunRequest(code=code, stdin=str(i).encode(), exports=("out/*.txt",))
                    )
                    for i in range(4)
                )
            )
        )

    results = asyncio.run(many())
    assert len(results) == 4
    for i, r in enumerate(results):
        assert r.ok, (r.outcome, r.reason, r.stderr)
        assert r.stdout == f"{i}\n"
        [art] = r.artifacts
        assert executor.store.path_for(art.sha256).read_text() == str(i * i)
    assert len({r.run_id for r in results}) == 4
