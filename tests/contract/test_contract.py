"""The contract every backend must keep, checked on real sandboxes.

Each test runs on every rung of the ladder and start mode as root through the in-process
executor, and as an ordinary user through ``sandcell run --json`` (in the weaker ``rlimits`` mode
where this host gives ordinary users no cgroups): ``CONTRACT_PARAMS`` in tests/conftest.py. The
enforcement report, which differs by identity on every rung, runs in every case. A result is the
``--json`` dict in all of them.

What a test observes inside the sandbox is printed by the program as one JSON line, so the
assertions read what the program saw, not only how the run ended.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import CONTRACT_PARAMS, SANDBOX_PARAMS, Sandbox, make_sandbox, wasm_cannot

from sandcell import ConfigError
from sandcell.artifacts import ArtifactStore
from sandcell.backends.host import landlock
from sandcell.spec import IsolationMode

MiB = 1024 * 1024


def _code(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


def _seen(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON line the program printed last on stdout."""
    lines = [ln for ln in str(result["stdout"]).splitlines() if ln.strip()]
    assert lines, f"the program printed nothing; result: {result}"
    value: dict[str, Any] = json.loads(lines[-1])
    return value


def _readable(path: Path) -> Path:
    """Make a file or directory tree readable by anyone (the unprivileged identity reads it)."""
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        p.chmod(p.stat().st_mode | (0o005 if p.is_dir() else 0o004))
    return path


@pytest.fixture(params=CONTRACT_PARAMS)
def sandbox(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    return make_sandbox(request, root_home, tmp_path)


# -- output and exit status ------------------------------------------------------------------


def test_stdout_and_stderr_are_captured_separately(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nprint('more out')"
    )
    assert r["outcome"] == "ok"
    assert r["exit_code"] == 0
    assert r["signal"] is None
    assert r["stdout"] == "to stdout\nmore out\n"
    assert r["stderr"] == "to stderr\n"
    assert r["stdout_truncated"] is False
    assert r["stderr_truncated"] is False


def test_sys_exit_code_is_an_error_with_that_code(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nprint('before')\nsys.exit(3)")
    assert r["outcome"] == "error"
    assert r["exit_code"] == 3
    assert r["signal"] is None
    assert r["stdout"] == "before\n"


def test_uncaught_exception_is_error_1_with_traceback(sandbox: Sandbox) -> None:
    r = sandbox.run("def f():\n    raise ValueError('boom here')\nf()")
    assert r["outcome"] == "error"
    assert r["exit_code"] == 1
    stderr = str(r["stderr"])
    assert "Traceback (most recent call last)" in stderr
    assert "ValueError: boom here" in stderr
    assert r["stdout"] == ""


def test_bash_exit_status(sandbox: Sandbox) -> None:
    r = sandbox.run("echo hello from bash\necho oops >&2\nexit 7", lang="bash")
    assert r["outcome"] == "error"
    assert r["exit_code"] == 7
    assert r["stdout"] == "hello from bash\n"
    assert r["stderr"] == "oops\n"


def test_bash_success(sandbox: Sandbox) -> None:
    r = sandbox.run("x=$((6*7)); echo $x", lang="bash")
    assert r["outcome"] == "ok"
    assert r["exit_code"] == 0
    assert r["stdout"] == "42\n"


def test_exit_status_above_128_is_an_error_not_a_signal(sandbox: Sandbox) -> None:
    # A program that exits with 137 was not killed by SIGKILL: the outcome must say so (the
    # JSON outcome is documented as authoritative where the CLI exit status is ambiguous).
    r = sandbox.run("import sys\nsys.exit(137)")
    assert (r["outcome"], r["exit_code"], r["signal"]) == ("error", 137, None), r
    r = sandbox.run("exit 130", lang="bash")
    assert (r["outcome"], r["exit_code"], r["signal"]) == ("error", 130, None), r


def test_killed_by_signal(sandbox: Sandbox) -> None:
    wasm_cannot(sandbox, "processes")
    r = sandbox.run("import os\nprint('dying', flush=True)\nos.kill(os.getpid(), 9)")
    assert r["outcome"] == "killed"
    assert r["signal"] == 9
    assert r["exit_code"] is None
    assert r["stdout"] == "dying\n"


def test_stdin_is_passed_to_the_program(sandbox: Sandbox) -> None:
    data = b"line one\nline two\n\xc3\xa9t\xc3\xa9\n"
    r = sandbox.run(
        "import sys, hashlib\n"
        "data = sys.stdin.buffer.read()\n"
        "print(len(data), hashlib.sha256(data).hexdigest())",
        stdin=data,
    )
    assert r["outcome"] == "ok", r
    assert r["stdout"] == f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


def test_stdin_is_empty_when_none_is_given(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nprint(repr(sys.stdin.read()))")
    assert r["outcome"] == "ok", r
    assert r["stdout"] == "''\n"


# -- inputs ----------------------------------------------------------------------------------


def test_inputs_file_and_directory_are_visible_and_read_only(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "readme.txt").write_text("hello input\n")
    (folder / "sub" / "deep.txt").write_text("deep\n")
    _readable(data)
    _readable(folder)

    r = sandbox.run(
        _code(
            """
            import json, os

            def attempt(fn):
                try:
                    fn()
                except OSError as exc:
                    return exc.errno
                return "written"

            def write(path, mode="w"):
                def go():
                    with open(path, mode) as f:
                        f.write("x")
                return go

            seen = {
                "file_abs": open("/inputs/data.csv").read(),
                "file_cwd": open("data.csv").read(),
                "dir_abs": open("/inputs/docs/readme.txt").read(),
                "dir_cwd": open("docs/sub/deep.txt").read(),
                "listing": sorted(os.listdir("docs")),
                "cwd": os.getcwd(),
                "w_file_abs": attempt(write("/inputs/data.csv", "a")),
                "w_file_cwd": attempt(write("data.csv", "w")),
                "w_dir_new": attempt(write("/inputs/docs/new.txt")),
                "w_dir_cwd_new": attempt(write("docs/new.txt")),
                "w_inputs_new": attempt(write("/inputs/other.txt")),
                "unlink": attempt(lambda: os.unlink("/inputs/docs/readme.txt")),
            }
            print(json.dumps(seen))
            """
        ),
        inputs=[data, folder],
    )
    assert r["outcome"] == "ok", r
    seen = _seen(r)
    assert seen["file_abs"] == seen["file_cwd"] == "a,b\n1,2\n"
    assert seen["dir_abs"] == "hello input\n"
    assert seen["dir_cwd"] == "deep\n"
    assert seen["listing"] == ["readme.txt", "sub"]
    assert seen["cwd"] == "/sandbox"
    for key in ("w_file_abs", "w_file_cwd", "w_dir_new", "w_dir_cwd_new", "w_inputs_new", "unlink"):
        assert seen[key] != "written", f"{key}: an input could be written"
        assert isinstance(seen[key], int), f"{key}: {seen[key]!r}"
    # The host files are untouched.
    assert data.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in folder.iterdir()) == ["readme.txt", "sub"]


# -- exports ---------------------------------------------------------------------------------


def test_exports_return_matching_files_with_hash_and_size(sandbox: Sandbox) -> None:
    contents = {
        "out/report.txt": b"the report\n" * 100,
        "out/notes.txt": "unicode: \u00e9\u00e8\n".encode(),
        "result.json": json.dumps({"answer": 42}).encode(),
    }
    others = {"out/skip.log": b"not wanted", "scratch.txt": b"not wanted either"}
    writes = {**contents, **others}
    r = sandbox.run(
        _code(
            f"""
            import os
            files = {writes!r}
            for path, data in files.items():
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            """
        ),
        exports=["out/*.txt", "*.json"],
    )
    assert r["outcome"] == "ok", r
    got = {a["path"]: a for a in r["artifacts"]}  # type: ignore[attr-defined]
    assert set(got) == set(contents)
    store = ArtifactStore(sandbox.home / "artifacts")
    for path, data in contents.items():
        assert got[path]["sha256"] == hashlib.sha256(data).hexdigest(), path
        assert got[path]["size"] == len(data), path
        assert store.path_for(got[path]["sha256"]).read_bytes() == data
    assert got["result.json"]["media_type"] == "application/json"
    assert r["rejected_exports"] == []


def test_the_workspace_is_also_the_home_other_sandboxes_use(sandbox: Sandbox) -> None:
    # /home/user is the same workspace, mounted twice (code written for E2B expects it): what is
    # written through one path is read through the other, a file written there is exported, and
    # its size counts towards the one workspace limit.
    r = sandbox.run(
        _code(
            """
            import errno, json, os
            os.makedirs("/home/user/out", exist_ok=True)
            with open("/home/user/out/a.txt", "w") as f:
                f.write("via home")
            with open("/sandbox/b.txt", "w") as f:
                f.write("via sandbox")
            os.chdir("/home/user")
            fd = os.open("/home/user/fill.bin", os.O_CREAT | os.O_WRONLY, 0o600)
            error = None
            try:
                for _ in range(12):
                    os.write(fd, b"w" * (1024 * 1024))
            except OSError as exc:
                error = errno.errorcode[exc.errno]
            os.close(fd)
            os.remove("/sandbox/fill.bin")
            print(json.dumps({
                "a": open("/sandbox/out/a.txt").read(),
                "b": open("/home/user/b.txt").read(),
                "cwd": os.getcwd(),
                "listed": sorted(os.listdir("/home/user")),
                "errno": error,
            }))
            """
        ),
        exports=["out/*.txt"],
        workspace_mb=8,
    )
    assert r["outcome"] == "ok", r
    seen = _seen(r)
    assert seen == {
        "a": "via home",
        "b": "via sandbox",
        "cwd": "/home/user",
        "listed": ["b.txt", "out"],
        "errno": "ENOSPC",
    }, seen
    assert [a["path"] for a in r["artifacts"]] == ["out/a.txt"]  # type: ignore[index]


def test_no_exports_without_globs(sandbox: Sandbox) -> None:
    r = sandbox.run("open('a.txt', 'w').write('x')")
    assert r["outcome"] == "ok", r
    assert r["artifacts"] == []


# -- limits ----------------------------------------------------------------------------------


def test_wall_time_limit_keeps_partial_output(sandbox: Sandbox) -> None:
    r = sandbox.run("print('partial', flush=True)\nwhile True:\n    pass", wall_time_s=1)
    assert r["outcome"] == "timeout", r
    assert r["stdout"] == "partial\n"
    assert "wall" in str(r["reason"])


def test_wall_time_limit_on_a_sleeping_program(sandbox: Sandbox) -> None:
    r = sandbox.run("import time\nprint('start', flush=True)\ntime.sleep(60)", wall_time_s=1)
    assert r["outcome"] == "timeout", r
    assert r["stdout"] == "start\n"


def test_cpu_time_limit(sandbox: Sandbox) -> None:
    # The wasm rung's smallest CPU-time limit is 2 s (Node.js and Pyodide spend ~0.7 s starting).
    cpu = 2 if sandbox.backend == "wasm" else 1
    r = sandbox.run("print('spin', flush=True)\nwhile True:\n    pass", cpu_time_s=cpu)
    assert r["outcome"] == "timeout", r
    assert "cpu" in str(r["reason"]).lower()
    assert r["stdout"] == "spin\n"


def test_memory_limit(sandbox: Sandbox) -> None:
    # Bytes that are written, so the pages are really used (calloc'd zeros would not count).
    r = sandbox.run(
        "print('allocating', flush=True)\nblob = b'\\x01' * (200 * 1024 * 1024)\nprint(len(blob))",
        # The wasm rung's smallest limit (Node.js and Pyodide take ~160 MiB before the program).
        memory_mb=256 if sandbox.backend == "wasm" else 64,
    )
    assert r["outcome"] == "memory_limit", r
    assert str(r["stdout"]).startswith("allocating\n")
    assert str(200 * MiB) not in str(r["stdout"])


def test_stdout_cap(sandbox: Sandbox) -> None:
    r = sandbox.run("while True:\n    print('x' * 99)", stdout_bytes=1000)
    assert r["outcome"] == "output_limit", r
    assert r["stdout_truncated"] is True
    assert r["stderr_truncated"] is False
    assert 0 < len(str(r["stdout"])) <= 1000
    assert set(str(r["stdout"])) <= {"x", "\n"}


def test_output_exactly_at_the_cap_is_kept_whole(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nsys.stdout.write('x' * 1000)", stdout_bytes=1000)
    assert r["outcome"] == "ok", r
    assert r["stdout_truncated"] is False
    assert r["stdout"] == "x" * 1000


def test_stderr_cap_is_independent_of_stdout(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import sys\nprint('small', flush=True)\n"
        "while True:\n    sys.stderr.write('e' * 99 + '\\n')",
        stderr_bytes=500,
    )
    assert r["outcome"] == "output_limit", r
    assert r["stderr_truncated"] is True
    assert r["stdout_truncated"] is False
    assert r["stdout"] == "small\n"
    assert 0 < len(str(r["stderr"])) <= 500


def test_max_pids(sandbox: Sandbox) -> None:
    wasm_cannot(sandbox, "processes")
    max_pids = 8
    r = sandbox.run(
        _code(
            """
            import errno, json, os, signal, time
            children, failures = [], []
            for _ in range(40):
                try:
                    pid = os.fork()
                except OSError as exc:
                    failures.append(exc.errno)
                    continue
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                children.append(pid)
            for pid in children:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            print(json.dumps({"forked": len(children), "failures": failures}))
            """
        ),
        max_pids=max_pids,
    )
    assert r["outcome"] == "ok", r
    seen = _seen(r)
    assert seen["failures"], f"every fork succeeded: {seen}"
    assert set(seen["failures"]) == {11}, seen  # EAGAIN
    # The program itself is one of the processes: its children stay below the limit.
    assert seen["forked"] >= 1, seen
    assert seen["forked"] + 1 <= max_pids, seen


# Errors are reported by name: the wasm rung's Python (Emscripten) numbers them differently
# (ENOSPC is 51 there, not 28), and the name is what each check means.


def test_max_open_files(sandbox: Sandbox) -> None:
    r = sandbox.run(
        _code(
            """
            import errno, json, os
            fds, error = [], None
            for i in range(100):
                try:
                    fds.append(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600))
                except OSError as exc:
                    error = errno.errorcode[exc.errno]
                    break
            print(json.dumps({"opened": len(fds), "errno": error}))
            """
        ),
        max_open_files=32,
    )
    assert r["outcome"] == "ok", r
    seen = _seen(r)
    assert seen["errno"] == "EMFILE", seen
    assert seen["opened"] < 32, seen


def test_max_file_size(sandbox: Sandbox) -> None:
    r = sandbox.run(
        _code(
            """
            import errno, json, os
            fd = os.open("big.bin", os.O_CREAT | os.O_WRONLY, 0o600)
            chunk = b"z" * (256 * 1024)
            error = None
            try:
                for _ in range(8):  # 2 MiB
                    os.write(fd, chunk)
                    print(json.dumps({"size": os.fstat(fd).st_size}), flush=True)
            except OSError as exc:
                error = errno.errorcode[exc.errno]
            print(json.dumps({"errno": error, "size": os.fstat(fd).st_size}), flush=True)
            """
        ),
        max_file_mb=1,
    )
    sizes = [json.loads(line)["size"] for line in str(r["stdout"]).splitlines()]
    assert sizes, r
    # Whichever way the write is stopped, no more than the limit was ever written.
    assert max(sizes) <= MiB, sizes
    if r["outcome"] == "killed":
        assert r["signal"] == 25, r  # SIGXFSZ
        return
    assert r["outcome"] == "ok", r
    seen = _seen(r)
    assert seen["errno"] == "EFBIG", seen
    assert seen["size"] == MiB, seen


def test_max_file_size_bash_is_killed_or_refused(sandbox: Sandbox) -> None:
    r = sandbox.run(
        # wc rather than stat or ls: this host's runsc fails their statx with EINVAL.
        "head -c 2097152 /dev/zero > big.bin; echo status=$?; echo size=$(wc -c < big.bin)",
        lang="bash",
        max_file_mb=1,
    )
    assert r["outcome"] in ("ok", "killed"), r
    out = str(r["stdout"])
    m = re.search(r"size=(\d+)", out)
    assert m, r
    size = int(m.group(1))
    assert size <= MiB
    assert "status=0" not in out


def test_workspace_quota(sandbox: Sandbox) -> None:
    r = sandbox.run(
        _code(
            """
            import errno, json, os
            fd = os.open("fill.bin", os.O_CREAT | os.O_WRONLY, 0o600)
            chunk = b"w" * (1024 * 1024)
            error = None
            try:
                for _ in range(20):
                    os.write(fd, chunk)
            except OSError as exc:
                error = errno.errorcode[exc.errno]
            print(json.dumps({"errno": error, "size": os.fstat(fd).st_size}))
            """
        ),
        workspace_mb=8,
    )
    assert r["outcome"] == "ok", r
    seen = _seen(r)
    assert seen["errno"] == "ENOSPC", seen
    assert seen["size"] <= 8 * MiB, seen


# -- usage, enforcement report, identity of runs ----------------------------------------------


def test_usage_is_reported(sandbox: Sandbox) -> None:
    r = sandbox.run("x = sum(range(100000))\nprint(x)")
    assert r["outcome"] == "ok", r
    usage = r["usage"]
    assert isinstance(usage, dict)
    assert usage["wall_ms"] > 0
    assert usage["cpu_ms"] is not None and usage["cpu_ms"] >= 0
    assert usage["peak_memory_bytes"] is not None and usage["peak_memory_bytes"] > 0


@pytest.mark.parametrize("sandbox", SANDBOX_PARAMS, indirect=True)
def test_enforcement_report_names_the_layers(
    sandbox: Sandbox, request: pytest.FixtureRequest
) -> None:
    r = sandbox.run("pass")
    assert r["outcome"] == "ok", r
    e = r["enforcement"]
    assert isinstance(e, dict)
    layers = e["layers"]
    weakened = e["weakened"]
    assert e["backend"] == sandbox.backend, e
    # The mode this identity must get here: root always the strict one; the ordinary user the
    # one this host must give it (tests/conftest.py _user_mode checked it against the host).
    expected = "strict" if sandbox.identity == "root" else request.getfixturevalue("unpriv").mode
    assert e["mode"] == IsolationMode(expected).value, (e["mode"], expected)
    if sandbox.backend == "microvm":
        # The guest's layers (backends/microvm enforcement()): the VM, its kernel and devices.
        for name in ("vmm", "guest_kernel", "devices", "user", "rlimits"):
            assert layers.get(name), (name, layers)
        return
    assert layers.get("seccomp")
    assert layers.get("rlimits")
    if sandbox.backend == "gvisor":
        # The sentry in between, its own namespaces, and CPU time enforced from the host.
        for name in ("kernel", "user", "namespaces", "cpu_time"):
            assert layers.get(name), (name, layers)
    else:
        for ns in ("user", "pid", "mount", "network", "ipc", "uts", "cgroup"):
            assert f"{ns}_namespace" in layers, ns
    if e["mode"] == "strict":
        assert "cgroups" in layers, layers
        assert not any(w.startswith("cgroups") for w in weakened), weakened
    else:
        assert "cgroups" not in layers, layers
        assert any(w.startswith("cgroups") for w in weakened), weakened
    if sandbox.backend == "gvisor":
        # No Landlock layer under gVisor: the program's file calls never reach the host kernel.
        assert "landlock" not in layers, layers
        return
    if landlock.probe_abi() is None:
        pytest.skip("this kernel has no Landlock; the rest of the report was checked")
    assert layers.get("landlock")
    assert not any(w.startswith("landlock") for w in weakened), weakened


def test_run_ids_are_unique(sandbox: Sandbox) -> None:
    ids = [sandbox.run("pass")["run_id"] for _ in range(3)]
    assert len(set(ids)) == 3
    for run_id in ids:
        assert isinstance(run_id, str) and len(run_id) >= 16


def test_environment_is_clean(sandbox: Sandbox) -> None:
    r = sandbox.run("import os, json\nprint(json.dumps(dict(os.environ)))")
    assert r["outcome"] == "ok", r
    env = _seen(r)
    assert env["HOME"] == "/tmp"
    for leaked in ("SANDCELL_HOME", "SANDCELL_RUNS", "PYTHONPATH", "PYTEST_CURRENT_TEST"):
        assert leaked not in env


# -- the analysis runtime --------------------------------------------------------------------


def _refused_on_wasm(sandbox: Sandbox, code: str, package: str) -> None:
    """On the wasm rung a program importing the analysis packages is refused before the run
    (it has no WebAssembly builds of them): check the refusal names the package, then skip."""
    if sandbox.backend == "wasm":
        with pytest.raises(ConfigError, match=rf"imports [\w, ]*\b{package}\b.*the wasm rung"):
            sandbox.run(code)
        wasm_cannot(sandbox, "packages")


def test_pandas_aggregates_an_input_csv(sandbox: Sandbox, tmp_path: Path) -> None:
    csv = tmp_path / "sales.csv"
    csv.write_text("region,amount\nnorth,10\nsouth,5\nnorth,7\nsouth,1\neast,3\n")
    _readable(csv)
    code = _code(
        """
        import json
        import pandas as pd
        df = pd.read_csv("sales.csv")
        totals = df.groupby("region")["amount"].sum().sort_index()
        print(json.dumps({k: int(v) for k, v in totals.items()}))
        """
    )
    _refused_on_wasm(sandbox, code, "pandas")
    r = sandbox.run(code, inputs=[csv])
    assert r["outcome"] == "ok", r
    assert _seen(r) == {"east": 3, "north": 17, "south": 6}


def test_matplotlib_figure_is_exported_as_png(sandbox: Sandbox) -> None:
    code = _code(
        """
        import os
        import matplotlib.pyplot as plt
        import numpy as np
        os.makedirs("out", exist_ok=True)
        x = np.linspace(0, 6.28, 50)
        fig, ax = plt.subplots()
        ax.plot(x, np.sin(x))
        fig.savefig("out/plot.png")
        print("saved")
        """
    )
    _refused_on_wasm(sandbox, code, "matplotlib")
    r = sandbox.run(code, exports=["out/*.png"])
    assert r["outcome"] == "ok", r
    arts = r["artifacts"]
    assert isinstance(arts, list) and len(arts) == 1
    art = arts[0]
    assert art["path"] == "out/plot.png"
    assert art["media_type"] == "image/png"
    data = ArtifactStore(sandbox.home / "artifacts").path_for(art["sha256"]).read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert art["size"] == len(data)
    assert art["sha256"] == hashlib.sha256(data).hexdigest()


def test_each_run_starts_from_an_empty_workspace(sandbox: Sandbox) -> None:
    first = sandbox.run("open('left.txt', 'w').write('x')\nopen('/tmp/t.txt', 'w').write('y')")
    assert first["outcome"] == "ok", first
    r = sandbox.run("import os\nprint(sorted(os.listdir('.')), os.path.exists('/tmp/t.txt'))")
    assert r["outcome"] == "ok", r
    assert r["stdout"] == "[] False\n"


def test_no_network(sandbox: Sandbox) -> None:
    r = sandbox.run(
        _code(
            """
            import socket
            try:
                socket.create_connection(("1.1.1.1", 53), timeout=2)
                print("connected")
            except OSError as exc:
                print("refused", exc.errno)
            """
        )
    )
    assert r["outcome"] == "ok", r
    assert str(r["stdout"]).startswith("refused"), r
