"""Warm starts, the pure parts: configuration, the template's command line, the setup filter,
the status report, and which requests start cold."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from sandcell import ConfigError, RunRequest, WarmConfig
from sandcell.backends.host import seccomp
from sandcell.backends.namespaces.template import (
    THREAD_ENV,
    ZYGOTE_PARTS,
    TemplateSpec,
    build_template_argv,
    compile_script,
    compile_zygote,
)
from sandcell.backends.namespaces.warm import WarmStarter
from sandcell.backends.namespaces.warm_drive import parse_done, parse_status
from sandcell.runtimes import python_runtime


def test_config_defaults() -> None:
    c = WarmConfig()
    assert (c.mode, c.preload, c.pool_size) == ("template", ("numpy", "pandas"), 4)


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "hot"},
        {"preload": "pandas"},
        {"preload": ("os; import evil",)},
        {"pool_size": 0},
        {"take_timeout_s": 0},
    ],
)
def test_config_is_checked(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        WarmConfig(**kw)  # type: ignore[arg-type]


def _argv(tmp_path: Path) -> list[str]:
    return build_template_argv(
        TemplateSpec(
            bwrap="/usr/bin/bwrap",
            runtime=python_runtime(),
            control_dir=tmp_path / "control",
            etc_dir=tmp_path / "etc",
            env={"A": "1", **THREAD_ENV},
            preload=("numpy", "pandas"),
            seccomp_fd=7,
            control_fd=5,
        )
    )


def test_template_argv_isolates_like_a_cold_sandbox(tmp_path: Path) -> None:
    argv = _argv(tmp_path)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--clearenv" in argv
    assert argv[argv.index("--seccomp") + 1] == "7"
    # The children create their own user namespaces, and mount their own /proc: no bwrap --dev
    # (its /proc covers) and no --disable-userns.
    assert "--disable-userns" not in argv and "--dev" not in argv
    # The template is pid 1 of its namespace: its end kills every run, none waits to relay it.
    assert "--as-pid-1" in argv
    assert argv[-5:] == [
        python_runtime().sandbox_python,
        "-I",
        "/sandcell/zygote.pyc",
        "5",
        "numpy,pandas",
    ]
    # /dev is read-only: a writable tmpfs there would be shared by every run of the template.
    i = argv.index("--remount-ro")
    assert argv[i + 1] == "/dev"
    i = argv.index(str(tmp_path / "control"))
    assert argv[i - 1 : i + 2] == ["--ro-bind", str(tmp_path / "control"), "/sandcell"]


def test_template_runs_single_threaded_numerics(tmp_path: Path) -> None:
    argv = _argv(tmp_path)
    env = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}
    for key in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert env[key] == "1"


def test_setup_filter_allows_only_the_setup_calls() -> None:
    arch = seccomp.native_arch()
    full = {d.name for d in seccomp.build_policy(arch).denied}
    setup = {d.name for d in seccomp.build_setup_policy(arch).denied}
    assert full - setup == set(seccomp.SETUP_ALLOWED)
    # Everything else stays refused in the template itself: ptrace, bpf, keyrings, setns...
    for name in ("ptrace", "bpf", "keyctl", "setns", "pivot_root", "open_by_handle_at"):
        assert name in setup
    program = seccomp.build_setup_policy(arch).compile()
    assert len(program) % struct.calcsize("=HBBI") == 0


def test_status_report_is_parsed() -> None:
    assert parse_status(b"1W256 12.500 4096\n") == (True, 256, 12.5, 4096)
    assert parse_status(b"W32000 0.000 0\n") == (False, 32000, 0.0, 0)
    # No report (pid 1 died): no wait status.
    assert parse_status(b"1") == (True, None, 0.0, 0)
    assert parse_status(b"1W12") == (True, None, 0.0, 0)
    # pid 1's early report of a program that stopped itself does not disturb the final one.
    assert parse_status(b"1D3\nW2304 1.000 0\n") == (True, 2304, 1.0, 0)


def test_early_end_report_is_parsed() -> None:
    assert parse_done(b"1D3\n") == 3
    assert parse_done(b"1D0\nW9 0.000 0\n") == 0
    # Incomplete, absent, after the final report, or not a number: no early end.
    for data in (b"1D3", b"1", b"1W0 0.000 0\nD1\n", b"1Dx\n", b"1D\n", b"1D12345\n"):
        assert parse_done(data) is None, data


def test_zygote_parts_are_compiled_for_the_template() -> None:
    files = compile_zygote()
    assert sorted(files) == [
        "zygote.pyc",
        "zygote_base.pyc",
        "zygote_init.pyc",
        "zygote_program.pyc",
    ]
    magic = __import__("importlib.util").util.MAGIC_NUMBER
    assert all(data[:4] == magic for data in files.values())
    # The entry loads the parts the host compiled, in the same order.
    from sandcell.backends.namespaces import _zygote

    assert _zygote._PARTS == ZYGOTE_PARTS


@pytest.mark.parametrize(
    ("request_kw", "why"),
    [
        ({"code": "echo", "language": "bash"}, "bash programs start cold"),
        ({"code": "print(1)", "packages": (Path("/x"),)}, "packages"),
        (
            {"code": "print(1)", "runtime": "datascience"},
            "the template serves runtime default; this run is in runtime datascience",
        ),
    ],
)
def test_what_starts_cold(request_kw: dict[str, object], why: str) -> None:
    starter = WarmStarter.__new__(WarmStarter)  # the check needs no template
    starter.config = WarmConfig()
    starter._stamp = None  # the default runtime: not a stored build
    reason = starter.unservable(RunRequest(**request_kw))  # type: ignore[arg-type]
    assert reason is not None and why in reason
    assert starter.unservable(RunRequest(code="print(1)")) is None
    # Rich outputs start warm: the template ships the display module.
    assert starter.unservable(RunRequest(code="1", display=True)) is None
    # None and "default" are the same runtime.
    assert starter.unservable(RunRequest(code="print(1)", runtime="default")) is None


def test_a_template_serves_its_own_runtime_only() -> None:
    starter = WarmStarter.__new__(WarmStarter)
    starter.config = WarmConfig(mode="pool", runtime="minimal")
    starter._stamp = None  # its build's changes: tests/integration/test_runtime_changed.py
    assert starter.unservable(RunRequest(code="print(1)", runtime="minimal")) is None
    for other in (None, "default", "datascience"):
        reason = starter.unservable(RunRequest(code="print(1)", runtime=other))
        assert reason is not None and reason.startswith("the pool serves runtime minimal;")


def test_zygote_compiles_for_this_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("X = 1\n")
    data = compile_script(script, "/sandcell/s.py")
    assert data[:4] == __import__("importlib.util").util.MAGIC_NUMBER
    assert os.path.getsize(script) == int.from_bytes(data[12:16], "little")


def test_runtime_mounts_under_tmp_are_kept_when_a_run_gets_its_own_tmp() -> None:
    # A checkout (and its venv) under /tmp: the template sees the venv as a read-only mount
    # below /tmp, which each run's fresh /tmp would otherwise hide (found by CI in /tmp/ci7).
    from sandcell.backends.namespaces._zygote_init import _mounts_below

    table = "\n".join(
        [
            "22 1 0:20 / / ro,relatime - tmpfs tmpfs rw",
            "23 22 0:21 / /tmp rw,nosuid - tmpfs tmpfs rw",
            "24 23 8:1 /ci/.venv /tmp/ci/.venv ro,nosuid - ext4 /dev/sda1 rw",
            "25 24 8:1 /x /tmp/ci/.venv/lib/x ro - ext4 /dev/sda1 rw",
            "26 23 8:1 /y /tmp/with\\040space ro - ext4 /dev/sda1 rw",
            "27 22 8:1 /usr /usr ro - ext4 /dev/sda1 rw",
            "28 22 8:1 /z /tmpfoo ro - ext4 /dev/sda1 rw",
        ]
    )
    assert _mounts_below("/tmp", table) == ["/tmp/ci/.venv", "/tmp/with space"]


def test_preload_keeps_what_the_runtime_can_import() -> None:
    from sandcell.backends.host.warm_runtime import importable_preload

    # The default runtime is this environment: numpy and pandas stay, as before.
    preload = ("numpy", "pandas", "json", "os.path")
    assert importable_preload(preload, None) == preload
    assert importable_preload(preload, "default") == preload
    assert importable_preload(("numpy", "no_such_module_here"), None) == ("numpy",)
    try:
        kept = importable_preload(("numpy", "pandas", "json", "os.path"), "minimal")
    except ConfigError as exc:
        pytest.skip(str(exc))
    # The standard library only.
    assert kept == ("json", "os.path")
