"""The wasm rung's contract, with real sandboxes: Pyodide run by Node.js in a namespaces sandbox.

As root through the in-process executor (``backend="wasm"``) and as an ordinary user through the
CLI (``--backend wasm``): each limit ends the run with its outcome (the memory limit as the Wasm
heap's maximum), inputs, exports, stdin, exit status and tracebacks work as on the other rungs, the
run record names the rung's layers, and what the rung cannot run (bash, numpy, the network) is
refused before the run with the rungs that can. The escapes are tests/escapes/test_wasm_escapes.py.
Each cold run costs about half a second: a program proves several facts where it can.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.conftest import Sandbox, _make_runner, ladder_executor, settle_pools

from sandcell import (
    ConfigError,
    Executor,
    RunRequest,
)
from sandcell.backends.warm import WarmConfig

IDENTITIES = ["root", "user"]
OTHER_RUNGS = "namespaces, gvisor or microvm"


def wasm_executor(request: pytest.FixtureRequest, root_home: Path) -> Executor:
    """The suite's root executor on the wasm rung (skips, or fails where CI requires the rung,
    when Pyodide is not installed)."""
    return ladder_executor(request.getfixturevalue("ladder_executors"), root_home, "wasm", "cold")


def wasm_sandbox(
    request: pytest.FixtureRequest, identity: str, root_home: Path, tmp_path: Path
) -> Sandbox:
    """A runner of cold wasm runs as ``identity`` (``root``: the in-process executor; ``user``:
    the CLI), the shared ``sandbox`` fixture's own (tests/conftest.py) without its skip of other
    languages: a refusal before the run raises ConfigError, for both identities."""
    # The root executor is built first: it skips this host when the rung is not installed.
    wasm_executor(request, root_home)
    return _make_runner(
        request, root_home, tmp_path, identity=identity, backend="wasm", start="cold"
    )


@pytest.fixture(params=IDENTITIES)
def wasm(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    return wasm_sandbox(request, str(request.param), root_home, tmp_path)


@pytest.fixture
def wasm_root(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    return wasm_sandbox(request, "root", root_home, tmp_path)


def _show(r: dict[str, object]) -> str:
    return f"{r['outcome']} ({r['reason']}): stdout={r['stdout']!r} stderr={r['stderr']!r}"


# --- the run --------------------------------------------------------------------------------


def test_runs_in_sandbox_workdir_with_inputs_stdin_exports_and_exit_status(
    wasm: Sandbox, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("from the host\n")
    data.chmod(0o644)
    r = wasm.run(
        """
import os, sys
print(os.getcwd())
print(open('/inputs/data.txt').read().strip(), open('data.txt').read().strip())
print(os.path.islink('data.txt'), os.readlink('data.txt'))
print(sys.stdin.read())
with open('result.txt', 'w') as f:
    f.write('made inside')
sys.exit(3)
""",
        inputs=[data],
        exports=["result.txt"],
        stdin=b"from stdin",
    )
    assert r["outcome"] == "error" and r["exit_code"] == 3, _show(r)
    assert str(r["stdout"]).splitlines() == [
        "/sandbox",
        "from the host from the host",
        "True /inputs/data.txt",
        "from stdin",
    ], _show(r)
    artifacts = r["artifacts"]
    assert isinstance(artifacts, list)
    assert [(a["path"], a["size"]) for a in artifacts] == [("result.txt", 11)], artifacts


def test_traceback_names_the_program_on_stderr(wasm_root: Sandbox) -> None:
    r = wasm_root.run("x = 1\nraise ValueError('boom')")
    assert r["outcome"] == "error" and r["exit_code"] == 1, _show(r)
    stderr = str(r["stderr"])
    assert 'File "/sandcell/main.py", line 2' in stderr and "ValueError: boom" in stderr, stderr


def test_enforcement_names_the_rung_and_its_layers(wasm: Sandbox) -> None:
    r = wasm.run("print('ok')")
    assert r["outcome"] == "ok" and r["stdout"] == "ok\n", _show(r)
    enf = r["enforcement"]
    assert isinstance(enf, dict) and enf["backend"] == "wasm", enf
    layers = enf["layers"]
    for layer in ("webassembly", "wasm_heap", "javascript", "node_permissions"):
        assert layer in layers, f"no {layer} layer in {sorted(layers)}"
    # The outer wall is an ordinary namespaces sandbox.
    assert "seccomp" in layers and "network_namespace" in layers, sorted(layers)


def test_a_refused_write_is_a_permission_error_and_leaves_stdin_readable(
    wasm_root: Sandbox, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("original\n")
    r = wasm_root.run(
        """
import errno, sys
try:
    open('/inputs/data.txt', 'w')
except OSError as e:
    print('refused', e.errno in (errno.EACCES, errno.EPERM, errno.EROFS), e)
print(sys.stdin.read())
""",
        inputs=[data],
        stdin=b"still here",
    )
    assert r["outcome"] == "ok", _show(r)
    assert str(r["stdout"]).splitlines()[0].startswith("refused True"), _show(r)
    assert str(r["stdout"]).splitlines()[1] == "still here", _show(r)


# --- limits ---------------------------------------------------------------------------------


def test_wall_time_limit_is_a_timeout(wasm_root: Sandbox) -> None:
    r = wasm_root.run("while True: pass", wall_time_s=3)
    assert r["outcome"] == "timeout", _show(r)


def test_memory_limit_is_the_wasm_heaps_maximum(wasm: Sandbox) -> None:
    r = wasm.run("b = bytearray(600 << 20)\nprint(len(b))", memory_mb=512)
    assert r["outcome"] == "memory_limit", _show(r)
    assert "Wasm heap" in str(r["reason"]), r["reason"]
    assert r["stdout"] == "", _show(r)


def test_stdout_cap_is_an_output_limit(wasm_root: Sandbox) -> None:
    r = wasm_root.run("print('x' * 100_000)", stdout_bytes=1000)
    assert r["outcome"] == "output_limit" and r["stdout_truncated"], _show(r)
    assert len(str(r["stdout"])) <= 1000


def test_workspace_cap_is_no_space_left(wasm_root: Sandbox) -> None:
    r = wasm_root.run(
        """
import errno
try:
    with open('big', 'wb') as f:
        f.write(b'x' * (40 << 20))
except OSError as e:
    print('refused', e.errno == errno.ENOSPC)
else:
    print('wrote 40 MiB')
""",
        workspace_mb=16,
    )
    assert r["outcome"] == "ok" and r["stdout"] == "refused True\n", _show(r)


# --- refused before the run -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "lang", "says"),
    [
        ("echo hi", "bash", "runs Python only"),
        ("import numpy as np\nprint(np.ones(2))", "python", "imports numpy"),
        ("from pandas import DataFrame", "python", "imports pandas"),
    ],
    ids=["bash", "numpy", "pandas"],
)
def test_refuses_what_it_cannot_run_and_names_the_rungs_that_can(
    wasm: Sandbox, code: str, lang: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        wasm.run(code, lang=lang)
    assert says in str(info.value) and OTHER_RUNGS in str(info.value), str(info.value)


def test_refuses_a_way_outside(request: pytest.FixtureRequest, root_home: Path) -> None:
    """A run with the network or governed tools gets sandbox sockets; the rung has no way to
    speak them, and refuses rather than running without them."""
    ex = wasm_executor(request, root_home)
    with pytest.raises(ConfigError) as info:
        ex.backend.run(
            RunRequest(code="print(1)"),
            run_id="wasm-outside",
            collect=lambda ws: ((), ()),
            sockets=object(),  # type: ignore[arg-type]
        )
    assert "no network and no governed tools" in str(info.value), str(info.value)
    assert OTHER_RUNGS in str(info.value)


@pytest.mark.parametrize("start", ["cold", "pool"])
def test_rich_outputs_are_the_last_value_and_displayed_objects(
    request: pytest.FixtureRequest, root_home: Path, start: str
) -> None:
    """The display module runs inside Pyodide: a program's displayed objects and its last
    expression's value come back as outputs, cold and from the pool (whose sandboxes are made
    for runs that display); a run that does not ask for them gets none."""
    ex = ladder_executor(request.getfixturevalue("ladder_executors"), root_home, "wasm", start)
    code = 'x = 6 * 7\nprint("hi")\ndisplay({"k": [1, 2]})\nx'
    for _ in range(2 if start == "pool" else 1):  # the pool's first run may start cold
        result = ex.run(RunRequest(code=code, display=True))
    assert result.outcome.value == "ok", (result.reason, result.stderr)
    assert result.stdout == "hi\n"
    assert [(o.kind, o.data, o.displayed) for o in result.outputs] == [
        ("value", {"text/plain": "{'k': [1, 2]}"}, True),
        ("value", {"text/plain": "42"}, False),
    ]
    if start == "pool":
        assert result.start.mode == "pool"
    plain = ex.run(RunRequest(code="x = 6 * 7\nx"))
    assert plain.outcome.value == "ok" and plain.outputs == ()


def test_a_session_keeps_its_variables_and_shows_each_cells_value(
    request: pytest.FixtureRequest, root_home: Path
) -> None:
    ex = wasm_executor(request, root_home)
    with ex.session() as s:
        first = s.run("y = [1, 2]\ny")
        assert first.outcome.value == "ok"
        assert [(o.kind, o.data) for o in first.outputs] == [("value", {"text/plain": "[1, 2]"})]
        second = s.run("y.append(3)\nprint(sum(y))")
        assert second.stdout == "6\n" and second.outputs == ()
        failed = s.run("1/0")
        assert failed.outcome.value == "error"
        assert 'File "<cell 3>", line 1' in failed.stderr
        assert "ZeroDivisionError" in failed.stderr
        assert "lockdown" not in failed.stderr  # the runner's own frames are not shown
        assert s.run("print(y)").stdout == "[1, 2, 3]\n"


def test_a_closed_pool_leaves_no_sandbox(root_home: Path, request: pytest.FixtureRequest) -> None:
    """The pool's waiting sandboxes say so in a listing (its command line's last word), and
    ``close`` ends them all, the used ones' teardowns included."""
    from tests.integration.hostscan import children_of

    wasm_executor(request, root_home)  # skips where the rung is not installed
    me = os.getpid()

    def pooled() -> dict[int, str]:
        return {
            p.pid: p.cmdline
            for p in children_of(me)
            if p.comm == "bwrap" and "runner.mjs" in p.cmdline
        }

    # The suite's own pools full and idle first: its waiting sandboxes stay what they are.
    settle_pools(request.getfixturevalue("ladder_executors"))
    before = pooled()
    ex = Executor(
        home=root_home,
        profile="unchecked",
        backend="wasm",
        warm=WarmConfig(mode="pool", pool_size=2),
    )
    try:
        for _ in range(3):
            assert ex.run(RunRequest(code="print(1)")).outcome.value == "ok"
        settle_pools({("wasm", "pool"): ex})  # refilled: two sandboxes waiting
        mine = {pid: c for pid, c in pooled().items() if pid not in before}
        assert mine and all(c.endswith(" pooled") for c in mine.values()), mine
    finally:
        ex.close()
    assert set(pooled()) <= set(before)
