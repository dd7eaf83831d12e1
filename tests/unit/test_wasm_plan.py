"""The wasm rung's pure decisions: Node's command line, the runner's settings, the heap's maximum,
what is refused before a run, the pool's shapes and the run-worded verdicts, and the rlimits plan
without an address-space limit. No sandbox is started here (tests/contract/test_wasm.py runs them).
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from sandcell.backends.cell import CellRun
from sandcell.backends.host.rlimits import plan_rlimits
from sandcell.backends.wasm import capabilities, plan
from sandcell.backends.wasm.dist import PyodideDist
from sandcell.backends.wasm.pool import Shape, _run_verdict, unservable
from sandcell.errors import ConfigError
from sandcell.spec import InputFile, IsolationMode, Limits, MiB, Outcome, RunRequest, Usage

DIST = PyodideDist(
    directory=Path("/var/lib/sandcell/wasm/pyodide-0.29.3"),
    version="0.29.3",
    python="3.13.2",
    snapshot=Path("/var/lib/sandcell/wasm/pyodide-0.29.3/snapshot.bin"),
    node="/usr/bin/node",
    node_version="v20.20.2",
)


def test_node_runs_under_its_permission_model_with_no_child_processes_or_code_from_strings() -> (
    None
):
    argv = plan.node_argv("/usr/bin/node", "run")
    assert argv[0] == "/usr/bin/node"
    assert "--experimental-permission" in argv
    assert "--disallow-code-generation-from-strings" in argv
    for power in ("--allow-child-process", "--allow-addons", "--allow-wasi", "--allow-worker"):
        assert power not in argv
    writes = {a.split("=", 1)[1] for a in argv if a.startswith("--allow-fs-write=")}
    assert writes == {"/sandbox/", "/home/user/", "/tmp/", "/dev/shm/"}
    assert argv[-2:] == ("/sandcell/runner.mjs", "/sandcell/wasm.json")


def test_only_a_kernel_may_start_its_interpreters_worker() -> None:
    assert "--allow-worker" in plan.node_argv("/usr/bin/node", "kernel")


def test_the_heap_maximum_is_the_memory_limit_less_nodes_share_with_a_floor() -> None:
    big = RunRequest(code="", limits=Limits().with_(memory_bytes=1024 * MiB))
    assert plan.heap_max(big) == 1024 * MiB - plan.INTERPRETER_RESERVE
    small = RunRequest(code="", limits=Limits().with_(memory_bytes=64 * MiB))
    assert plan.heap_max(small) == plan.HEAP_FLOOR


def test_the_settings_mount_only_the_workspace_tmp_inputs_and_packages(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    request = RunRequest(
        code="print(1)",
        inputs=(InputFile(host_path=data, name="data.csv"),),
        packages=(pkg,),
        env={"K": "v"},
    )
    settings = plan.plan(request, DIST, "run").settings
    assert settings["mounts"] == [
        ["/sandbox", "/sandbox"],
        ["/home/user", "/home/user"],
        ["/tmp", "/tmp"],
        ["/dev/shm", "/dev/shm"],
        ["/inputs", "/inputs"],
        ["/packages/pkg", "/packages/pkg"],
    ]
    assert settings["python_paths"] == ["/packages/pkg"]
    assert settings["pyodide_dir"] == "/packages/pyodide-0.29.3"
    assert settings["snapshot"] == "/packages/pyodide-0.29.3/snapshot.bin"
    assert settings["env"]["K"] == "v"  # type: ignore[index]
    assert settings["program"] == "/sandcell/main.py"
    assert plan.plan(request, DIST, "kernel").settings["program"] is None


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (RunRequest(code="echo hi", language="bash"), "runs Python only, not bash"),
        (RunRequest(code="import numpy as np"), "imports numpy"),
        (RunRequest(code="from pandas import DataFrame\nimport json"), "imports pandas"),
    ],
)
def test_what_the_rung_cannot_run_is_refused_naming_the_other_rungs(
    request_: RunRequest, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        capabilities.check(request_)
    assert words in str(err.value)
    assert capabilities.OTHER_RUNGS in str(err.value)


@pytest.mark.parametrize(
    ("limits", "words"),
    [
        (Limits().with_(memory_bytes=128 * MiB), "memory limit of at least 256 MiB"),
        (Limits().with_(cpu_time_s=1), "CPU-time limit of at least 2 s"),
    ],
)
def test_limits_below_what_node_and_pyodide_take_to_start_are_refused(
    limits: Limits, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        capabilities.check(RunRequest(code="print(1)", limits=limits))


def test_a_package_with_compiled_code_is_refused(tmp_path: Path) -> None:
    pkg = tmp_path / "fast"
    (pkg / "fast").mkdir(parents=True)
    (pkg / "fast" / "_speed.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    with pytest.raises(ConfigError, match="compiled code"):
        capabilities.check(RunRequest(code="import fast", packages=(pkg,)))


def test_pure_python_and_an_unparsable_program_pass_the_checks(tmp_path: Path) -> None:
    pkg = tmp_path / "pure"
    (pkg / "pure").mkdir(parents=True)
    (pkg / "pure" / "__init__.py").write_text("X = 1\n")
    capabilities.check(RunRequest(code="import pure, json, numbers", packages=(pkg,)))
    capabilities.check(RunRequest(code="def broken(:"))  # Python's own SyntaxError says why


def test_a_pooled_sandbox_serves_runs_of_its_shape_without_inputs_or_stdin(
    tmp_path: Path,
) -> None:
    base = RunRequest(code="print(1)")
    assert Shape.of(base) == Shape.of(RunRequest(code="print(2)", exports=("*.txt",)))
    assert Shape.of(base) != Shape.of(RunRequest(code="", env={"A": "1"}))
    assert Shape.of(base) != Shape.of(
        RunRequest(code="", limits=Limits().with_(memory_bytes=128 * MiB))
    )
    # The wall time is a cell's own: it does not make another shape.
    assert Shape.of(base) == Shape.of(RunRequest(code="", limits=Limits().with_(wall_time_s=3)))
    assert unservable(base) is None
    assert unservable(RunRequest(code="", stdin=b"x")) is not None
    f = tmp_path / "f"
    f.write_text("x")
    assert unservable(RunRequest(code="", inputs=(InputFile(host_path=f, name="f"),)))


def _cell(outcome: Outcome, reason: str, exit_code: int | None) -> CellRun:
    return CellRun(
        outcome=outcome,
        reason=reason,
        exit_code=exit_code,
        signal=None,
        stdout=b"",
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=1.0, cpu_ms=None, peak_memory_bytes=None),
        out_dir=None,
        session_ended=None,
    )


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        (_cell(Outcome.OK, "the cell called exit with status 0", 0), "exited with status 0"),
        (_cell(Outcome.ERROR, "the cell called exit with status 3", 3), "exited with status 3"),
        (
            _cell(
                Outcome.TIMEOUT, "wall-time limit of 2 s reached; the cell was interrupted", None
            ),
            "wall-time limit of 2 s reached",
        ),
        (
            _cell(Outcome.MEMORY_LIMIT, "Wasm heap maximum of 9 bytes reached (...)", 1),
            "Wasm heap maximum of 7 bytes reached",
        ),
        (
            _cell(Outcome.OUTPUT_LIMIT, "stdout exceeded its cap of 5 bytes; the cell was", None),
            "stdout exceeded its cap of 5 bytes",
        ),
        (
            _cell(
                Outcome.MEMORY_LIMIT,
                "memory limit of 9 bytes for the session reached, the kernel was killed; the "
                "session ended",
                None,
            ),
            f"memory limit of {512 * MiB} bytes reached",
        ),
        (
            _cell(
                Outcome.TIMEOUT,
                "CPU-time limit of 60 s for the session reached; the session ended",
                None,
            ),
            "CPU-time limit of 60 s reached",
        ),
    ],
)
def test_a_pooled_runs_verdict_is_worded_as_a_runs(cell: CellRun, expected: str) -> None:
    request = RunRequest(code="", limits=Limits().with_(wall_time_s=2))
    outcome, reason = _run_verdict(cell, request, heap=7, cancelled=None)
    assert outcome is cell.outcome
    assert reason == expected
    assert "kept" not in reason and "session" not in reason


def test_the_rlimits_mode_can_leave_the_address_space_to_the_program() -> None:
    limits = Limits()
    with_as = {r.resource for r in plan_rlimits(limits, IsolationMode.RLIMITS)}
    without = {r.resource for r in plan_rlimits(limits, IsolationMode.RLIMITS, address_space=False)}
    assert resource.RLIMIT_AS in with_as
    assert with_as - without == {resource.RLIMIT_AS}
    assert resource.RLIMIT_NPROC in without
