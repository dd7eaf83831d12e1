"""Pure plans, checked without privileges: the bwrap argument list, cgroup writes, rlimits, request
validation, exit statuses and the JSON shape of a result. No sandbox is started here.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sandcell.backends.host import cgroups
from sandcell.backends.host.layout import SANDBOX_HOME, SANDBOX_WORKDIR
from sandcell.backends.host.rlimits import plan_rlimits
from sandcell.backends.namespaces.bwrap import BwrapPlan, args_via_fd, build_argv
from sandcell.errors import AuditError, ConfigError, InfraError, IsolationUnavailable
from sandcell.runtimes.view import HostPython, neutral_view
from sandcell.spec import (
    Artifact,
    Enforcement,
    InputFile,
    IsolationMode,
    Limits,
    MiB,
    Outcome,
    RejectedExport,
    RunRequest,
    RunResult,
    Usage,
    input_from_path,
    result_to_dict,
)
from sandcell.status import (
    EXIT_CONFIG,
    EXIT_INFRA,
    EXIT_MEMORY_LIMIT,
    EXIT_OUTPUT_LIMIT,
    EXIT_TIMEOUT,
    exit_code_for,
    exit_code_for_error,
)

# -- bwrap -------------------------------------------------------------------------------------

# Every option build_argv may emit, with its number of arguments. An option missing here fails
# the parse below, so a new option has to be looked at (and added) deliberately.
_ARITY = {
    "--unshare-user": 0,
    "--unshare-pid": 0,
    "--unshare-net": 0,
    "--unshare-ipc": 0,
    "--unshare-uts": 0,
    "--unshare-cgroup": 0,
    "--uid": 1,
    "--gid": 1,
    "--hostname": 1,
    "--disable-userns": 0,
    "--cap-drop": 1,
    "--new-session": 0,
    "--die-with-parent": 0,
    "--clearenv": 0,
    "--setenv": 2,
    "--perms": 1,
    "--size": 1,
    "--tmpfs": 1,
    "--proc": 1,
    "--dev": 1,
    "--bind": 2,
    "--ro-bind": 2,
    "--symlink": 2,
    "--remount-ro": 1,
    "--chdir": 1,
    "--seccomp": 1,
    "--info-fd": 1,
    "--block-fd": 1,
}

Op = tuple[str, tuple[str, ...]]


def _parse(argv: Sequence[str]) -> tuple[list[Op], list[str]]:
    """bwrap options as (option, arguments) in order, and the command after ``--``."""
    ops: list[Op] = []
    i = 1
    while i < len(argv):
        opt = argv[i]
        if opt == "--":
            return ops, list(argv[i + 1 :])
        assert opt in _ARITY, f"unexpected bwrap option {opt!r} at {i}"
        n = _ARITY[opt]
        ops.append((opt, tuple(argv[i + 1 : i + 1 + n])))
        i += 1 + n
    raise AssertionError("no -- before the command")


def _index(ops: Sequence[Op], opt: str, *args: str) -> int:
    for i, (o, a) in enumerate(ops):
        if o == opt and (not args or a == args):
            return i
    raise AssertionError(f"{opt} {' '.join(args)} not in the argument list")


def _plan(**changes: object) -> BwrapPlan:
    base: dict[str, object] = {
        "bwrap": "/usr/bin/bwrap",
        "ro_dirs": ("/usr", "/opt/py"),
        "symlinks": (("/bin", "usr/bin"), ("/lib", "usr/lib")),
        "workspace": Path("/var/runs/abc/work"),
        "control_dir": Path("/var/runs/abc/control"),
        "etc_dir": Path("/var/runs/etc"),
        "inputs": ((Path("/data/sales.csv"), "sales.csv"), (Path("/data/docs"), "docs")),
        "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "EXTRA": "a b=c"},
        "tmp_bytes": 64 * MiB,
        "seccomp_fd": 7,
        "info_fd": 8,
        "block_fd": 9,
        "command": ("/opt/py/bin/python", "-I", "/sandcell/boot.py", "--", "x"),
    }
    base.update(changes)
    return BwrapPlan(**base)  # type: ignore[arg-type]


def test_argv_starts_with_bwrap_and_ends_with_the_command() -> None:
    plan = _plan()
    argv = build_argv(plan)
    assert argv[0] == "/usr/bin/bwrap"
    _, command = _parse(argv)
    # The command is passed through untouched, even when it contains "--" itself.
    assert command == list(plan.command)
    assert argv[-len(plan.command) - 1 :] == ["--", *plan.command]


def test_every_namespace_is_unshared_explicitly() -> None:
    ops, _ = _parse(build_argv(_plan()))
    names = {o for o, _ in ops}
    for ns in ("user", "pid", "net", "ipc", "uts", "cgroup"):
        assert f"--unshare-{ns}" in names, ns
    # Not --unshare-all, whose user namespace is only "try", nor any *-try variant.
    assert not any(o.endswith("-try") or o == "--unshare-all" for o in names)


def test_privileges_are_dropped() -> None:
    ops, _ = _parse(build_argv(_plan()))
    assert ("--disable-userns", ()) in ops
    assert ("--cap-drop", ("ALL",)) in ops
    assert ("--new-session", ()) in ops
    assert ("--die-with-parent", ()) in ops
    assert ("--uid", ("1000",)) in ops
    assert ("--gid", ("1000",)) in ops
    assert not any(o == "--cap-add" for o, _ in ops)


def test_environment_is_cleared_then_only_the_given_env_is_set() -> None:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "EXTRA": "a b=c"}
    ops, _ = _parse(build_argv(_plan(env=env)))
    setenvs = [(i, a) for i, (o, a) in enumerate(ops) if o == "--setenv"]
    assert {a[0]: a[1] for _, a in setenvs} == env
    assert len(setenvs) == len(env)
    clear = _index(ops, "--clearenv")
    assert all(i > clear for i, _ in setenvs)


def test_empty_env_sets_nothing() -> None:
    ops, _ = _parse(build_argv(_plan(env={})))
    assert ("--clearenv", ()) in ops
    assert not any(o == "--setenv" for o, _ in ops)


def test_only_the_workspace_is_bound_writable() -> None:
    plan = _plan()
    ops, _ = _parse(build_argv(plan))
    writable = [(o, a) for o, a in ops if o in ("--bind", "--dev-bind", "--bind-try")]
    # The workspace, twice: at its own path and at the home E2B code expects.
    assert writable == [
        ("--bind", (str(plan.workspace), SANDBOX_WORKDIR)),
        ("--bind", (str(plan.workspace), SANDBOX_HOME)),
    ]
    assert ("--chdir", (SANDBOX_WORKDIR,)) in ops
    assert SANDBOX_WORKDIR == "/sandbox"


def test_read_only_binds_control_inputs_etc_and_runtime() -> None:
    plan = _plan()
    ops, _ = _parse(build_argv(plan))
    ro = [a for o, a in ops if o == "--ro-bind"]
    assert (str(plan.control_dir), "/sandcell") in ro
    assert ("/data/sales.csv", "/inputs/sales.csv") in ro
    assert ("/data/docs", "/inputs/docs") in ro
    for d in plan.ro_dirs:
        assert (d, d) in ro
    for name in ("passwd", "group", "hosts", "nsswitch.conf"):
        assert (str(plan.etc_dir / name), f"/etc/{name}") in ro
    for link, target in plan.symlinks:
        assert ("--symlink", (target, link)) in ops
    # Nothing else of the host: every read-only source is one of the above.
    allowed = {
        str(plan.control_dir),
        "/data/sales.csv",
        "/data/docs",
        *plan.ro_dirs,
        *(str(plan.etc_dir / n) for n in ("passwd", "group", "hosts", "nsswitch.conf")),
    }
    assert {src for src, _ in ro} == allowed


def test_mount_order() -> None:
    plan = _plan()
    ops, _ = _parse(build_argv(plan))
    tmp = _index(ops, "--tmpfs", "/tmp")
    assert ops[tmp - 1] == ("--size", (str(64 * MiB),))
    proc = _index(ops, "--proc", "/proc")
    dev = _index(ops, "--dev", "/dev")
    work = _index(ops, "--bind", str(plan.workspace), SANDBOX_WORKDIR)
    control = _index(ops, "--ro-bind", str(plan.control_dir), "/sandcell")
    inputs = [_index(ops, "--ro-bind", str(h), f"/inputs/{n}") for h, n in plan.inputs]
    runtime = [_index(ops, "--ro-bind", d, d) for d in plan.ro_dirs]
    remount = _index(ops, "--remount-ro", "/")
    # The runtime comes after the private /tmp and the workspace, so a runtime that lives under a
    # path the sandbox also mounts (a venv in /tmp) stays visible rather than being covered.
    assert min(runtime) > max(tmp, work, proc, dev, control, *inputs)
    # The root goes read-only after every mount into it.
    assert remount > max(i for i, (o, _) in enumerate(ops) if o in ("--ro-bind", "--symlink"))
    assert _index(ops, "--chdir") > remount


def test_control_fds() -> None:
    ops, _ = _parse(build_argv(_plan(seccomp_fd=11, info_fd=12, block_fd=13)))
    assert ("--seccomp", ("11",)) in ops
    assert ("--info-fd", ("12",)) in ops
    assert ("--block-fd", ("13",)) in ops


def test_no_seccomp_fd_means_no_seccomp_option() -> None:
    ops, _ = _parse(build_argv(_plan(seccomp_fd=None)))
    assert not any(o == "--seccomp" for o, _ in ops)
    assert ("--info-fd", ("8",)) in ops


def test_no_inputs_no_input_mounts() -> None:
    ops, _ = _parse(build_argv(_plan(inputs=())))
    assert not any(a[1].startswith("/inputs") for o, a in ops if o == "--ro-bind")


# -- cgroups -----------------------------------------------------------------------------------


def _as_map(settings: Sequence[cgroups.CgroupSetting]) -> dict[tuple[str, str], str]:
    return {(s.controller, s.file): s.value for s in settings}


def test_cgroup_v1_plan_with_swap_accounting() -> None:
    settings = cgroups.plan_settings(1, memory_bytes=64 * MiB, max_pids=16, swap_accounting=True)
    m = _as_map(settings)
    assert m[("memory", "memory.limit_in_bytes")] == str(64 * MiB)
    assert m[("memory", "memory.memsw.limit_in_bytes")] == str(64 * MiB)
    assert m[("pids", "pids.max")] == "16"
    files = [s.file for s in settings]
    # The kernel refuses a memsw limit below the memory limit: memory is set first.
    assert files.index("memory.limit_in_bytes") < files.index("memory.memsw.limit_in_bytes")
    required = {s.file for s in settings if not s.optional}
    assert {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "pids.max"} <= required


def test_cgroup_v1_plan_without_swap_accounting_turns_swappiness_off() -> None:
    settings = cgroups.plan_settings(1, memory_bytes=128 * MiB, max_pids=8, swap_accounting=False)
    m = _as_map(settings)
    assert ("memory", "memory.memsw.limit_in_bytes") not in m
    assert m[("memory", "memory.limit_in_bytes")] == str(128 * MiB)
    assert m[("memory", "memory.swappiness")] == "0"
    assert m[("pids", "pids.max")] == "8"


def test_cgroup_v2_plan() -> None:
    settings = cgroups.plan_settings(2, memory_bytes=64 * MiB, max_pids=16, swap_accounting=True)
    assert {s.controller for s in settings} == {"unified"}
    m = {s.file: s.value for s in settings}
    assert m["memory.max"] == str(64 * MiB)
    assert m["memory.swap.max"] == "0"
    assert m["pids.max"] == "16"
    required = {s.file for s in settings if not s.optional}
    assert {"memory.max", "pids.max"} <= required


# -- rlimits -----------------------------------------------------------------------------------


def _rl(limits: Limits, mode: IsolationMode) -> dict[str, tuple[int, int, int]]:
    return {r.name: (r.resource, r.soft, r.hard) for r in plan_rlimits(limits, mode)}


def test_rlimits_strict_mode() -> None:
    limits = Limits(cpu_time_s=5, max_open_files=32, max_file_bytes=2 * MiB)
    plan = _rl(limits, IsolationMode.STRICT)
    assert set(plan) == {"RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE"}
    assert plan["RLIMIT_CPU"] == (resource.RLIMIT_CPU, 5, 6)
    assert plan["RLIMIT_NOFILE"] == (resource.RLIMIT_NOFILE, 32, 32)
    assert plan["RLIMIT_FSIZE"] == (resource.RLIMIT_FSIZE, 2 * MiB, 2 * MiB)
    assert plan["RLIMIT_CORE"] == (resource.RLIMIT_CORE, 0, 0)


def test_rlimits_mode_adds_address_space_and_processes() -> None:
    limits = Limits(cpu_time_s=3, memory_bytes=64 * MiB, max_pids=10)
    plan = _rl(limits, IsolationMode.RLIMITS)
    assert set(plan) == {
        "RLIMIT_CPU",
        "RLIMIT_NOFILE",
        "RLIMIT_FSIZE",
        "RLIMIT_CORE",
        "RLIMIT_AS",
        "RLIMIT_NPROC",
    }
    assert plan["RLIMIT_AS"] == (resource.RLIMIT_AS, 64 * MiB, 64 * MiB)
    assert plan["RLIMIT_NPROC"] == (resource.RLIMIT_NPROC, 10, 10)
    assert plan["RLIMIT_CPU"] == (resource.RLIMIT_CPU, 3, 4)


def test_rlimits_soft_never_above_hard() -> None:
    for mode in IsolationMode:
        for r in plan_rlimits(Limits(), mode):
            assert 0 <= r.soft <= r.hard, r


# -- Limits ------------------------------------------------------------------------------------


def test_default_limits_are_valid_and_finite() -> None:
    limits = Limits()
    assert limits.wall_time_s > 0 and limits.memory_bytes >= 16 * MiB
    assert limits.with_(wall_time_s=None, max_pids=5) == Limits(max_pids=5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"wall_time_s": -1}, "limit wall_time_s must be positive, got -1"),
        ({"cpu_time_s": 0}, "limit cpu_time_s must be positive, got 0"),
        ({"stdout_bytes": -10}, "limit stdout_bytes must be positive"),
        ({"max_pids": True}, "limit max_pids must be a number, got True"),
        ({"max_open_files": False}, "limit max_open_files must be a number"),
        ({"memory_bytes": "512M"}, "limit memory_bytes must be a number, got '512M'"),
        ({"memory_bytes": None}, "limit memory_bytes must be a number, got None"),
        ({"memory_bytes": 8 * MiB}, "below 16 MiB"),
        ({"max_pids": 1}, "max_pids must be at least 2"),
        ({"wall_time_s": float("nan")}, "limit wall_time_s must be a finite number, got nan"),
        ({"cpu_time_s": float("inf")}, "limit cpu_time_s must be a finite number, got inf"),
    ],
    ids=[
        "negative",
        "zero",
        "negative-bytes",
        "bool-true",
        "bool-false",
        "string",
        "none",
        "tiny-memory",
        "one-pid",
        "nan",
        "infinite",
    ],
)
def test_limits_validation(changes: Mapping[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Limits(**changes)  # type: ignore[arg-type]
    assert message in str(exc.value)
    assert isinstance(exc.value, ValueError)  # ConfigError is also a ValueError


def test_with_rejects_bad_values_too() -> None:
    with pytest.raises(ConfigError, match="wall_time_s must be positive"):
        Limits().with_(wall_time_s=0)


# -- RunRequest --------------------------------------------------------------------------------


def test_request_defaults() -> None:
    req = RunRequest(code="print(1)")
    assert req.language == "python"
    assert req.mode is IsolationMode.STRICT
    assert req.limits is None and req.effective_limits == Limits()
    assert req.inputs == () and req.exports == () and req.stdin == b""


def test_request_unknown_language() -> None:
    with pytest.raises(ConfigError, match=r"unknown language 'cobol'; choose one of python, bash"):
        RunRequest(code="x", language="cobol")  # type: ignore[arg-type]


def test_request_nul_in_code() -> None:
    with pytest.raises(ConfigError, match="NUL byte"):
        RunRequest(code="print(1)\x00")


def test_request_duplicate_input_names() -> None:
    a = InputFile(host_path=Path("/a/data.csv"), name="data.csv")
    b = InputFile(host_path=Path("/b/data.csv"), name="data.csv")
    with pytest.raises(ConfigError, match=r"two inputs are both named 'data\.csv'"):
        RunRequest(code="x", inputs=(a, b))


@pytest.mark.parametrize(
    "env",
    [{"": "v"}, {"A=B": "v"}, {"A\x00": "v"}, {"OK": "bad\x00value"}],
    ids=["empty", "equals", "nul-name", "nul-value"],
)
def test_request_bad_env(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="invalid environment variable"):
        RunRequest(code="x", env=env)


def test_request_good_env() -> None:
    req = RunRequest(code="x", env={"NAME": "a=b c", "EMPTY": ""})
    assert dict(req.env) == {"NAME": "a=b c", "EMPTY": ""}


def test_input_from_path(tmp_path: Path) -> None:
    f = tmp_path / "data.csv"
    f.write_text("a\n")
    item = input_from_path(f)
    assert item == InputFile(host_path=f.resolve(), name="data.csv")
    with pytest.raises(ConfigError, match="does not exist"):
        input_from_path(tmp_path / "missing.csv")


# -- exit statuses -------------------------------------------------------------------------------


def _result(outcome: Outcome, **changes: object) -> RunResult:
    base: dict[str, object] = {
        "run_id": "0123456789abcdef0123456789abcdef",
        "outcome": outcome,
        "exit_code": None,
        "signal": None,
        "stdout": "out",
        "stderr": "err",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "usage": Usage(wall_ms=12.5, cpu_ms=3.0, peak_memory_bytes=4096),
        "artifacts": (),
        "rejected_exports": (),
        "enforcement": None,
    }
    base.update(changes)
    return RunResult(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcome", "changes", "expected"),
    [
        (Outcome.OK, {"exit_code": 0}, 0),
        (Outcome.ERROR, {"exit_code": 3}, 3),
        (Outcome.ERROR, {"exit_code": 119}, 119),
        (Outcome.ERROR, {"exit_code": None}, 1),
        (Outcome.TIMEOUT, {}, EXIT_TIMEOUT),
        (Outcome.MEMORY_LIMIT, {}, EXIT_MEMORY_LIMIT),
        (Outcome.OUTPUT_LIMIT, {}, EXIT_OUTPUT_LIMIT),
        (Outcome.KILLED, {"signal": 9}, 137),
        (Outcome.KILLED, {"signal": 15}, 143),
        (Outcome.KILLED, {"signal": 25}, 153),
        (Outcome.INFRA_ERROR, {}, EXIT_INFRA),
    ],
)
def test_exit_code_for(outcome: Outcome, changes: dict[str, object], expected: int) -> None:
    assert exit_code_for(_result(outcome, **changes)) == expected


def test_exit_code_for_covers_every_outcome() -> None:
    codes = {o: exit_code_for(_result(o, exit_code=2, signal=6)) for o in Outcome}
    assert all(isinstance(c, int) and 0 <= c <= 255 for c in codes.values()), codes
    assert codes[Outcome.OK] == 0
    # Only a successful run exits 0.
    assert all(c != 0 for o, c in codes.items() if o is not Outcome.OK)
    assert (EXIT_OUTPUT_LIMIT, EXIT_MEMORY_LIMIT, EXIT_TIMEOUT) == (120, 121, 124)
    assert (EXIT_INFRA, EXIT_CONFIG) == (75, 78)


def test_exit_code_for_error() -> None:
    assert exit_code_for_error(ConfigError("bad")) == EXIT_CONFIG
    assert exit_code_for_error(IsolationUnavailable("cgroups", "none", "mount them")) == EXIT_CONFIG
    assert exit_code_for_error(InfraError("spawn failed")) == EXIT_INFRA
    assert exit_code_for_error(AuditError("locked")) == EXIT_CONFIG


# -- result_to_dict ----------------------------------------------------------------------------


def test_result_to_dict_shape() -> None:
    result = _result(
        Outcome.ERROR,
        exit_code=2,
        reason="exited with status 2",
        started_at="2026-01-01T00:00:00+00:00",
        artifacts=(Artifact(path="out/a.txt", sha256="ab" * 32, size=3, media_type="text/plain"),),
        rejected_exports=(RejectedExport(path="out/link", reason="a symbolic link"),),
        enforcement=Enforcement(
            backend="namespaces",
            layers={"seccomp": "yes"},
            mode=IsolationMode.RLIMITS,
            weakened=("cgroups: memory by RLIMIT_AS",),
        ),
    )
    d = result_to_dict(result)
    assert set(d) == {
        "run_id",
        "outcome",
        "reason",
        "exit_code",
        "signal",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "usage",
        "artifacts",
        "rejected_exports",
        "enforcement",
        "started_at",
        "policy",
        "validation",
        "leaks",
        "outputs",
        "start",
        "session_id",
        "network",
        "tools",
        "runtime",
    }
    assert d["policy"] is None and d["validation"] is None and d["leaks"] == []
    assert d["outputs"] == [] and d["session_id"] is None
    assert d["network"] is None and d["tools"] is None and d["runtime"] is None
    assert d["start"] == {"mode": "cold", "template": None, "preloaded": [], "wait_ms": 0.0}
    assert d["outcome"] == "error"
    assert d["exit_code"] == 2 and d["signal"] is None
    assert d["usage"] == {"wall_ms": 12.5, "cpu_ms": 3.0, "peak_memory_bytes": 4096}
    assert d["artifacts"] == [
        {"path": "out/a.txt", "sha256": "ab" * 32, "size": 3, "media_type": "text/plain"}
    ]
    assert d["rejected_exports"] == [{"path": "out/link", "reason": "a symbolic link"}]
    assert d["enforcement"] == {
        "backend": "namespaces",
        "mode": "rlimits",
        "layers": {"seccomp": "yes"},
        "weakened": ["cgroups: memory by RLIMIT_AS"],
    }
    # The JSON form is exactly that: it round-trips.
    assert json.loads(json.dumps(d)) == d


def test_result_to_dict_without_enforcement() -> None:
    d = result_to_dict(_result(Outcome.INFRA_ERROR))
    assert d["enforcement"] is None
    assert d["outcome"] == "infra_error"
    assert d["artifacts"] == [] and d["rejected_exports"] == []


# -- the runtime's neutral view -----------------------------------------------------------------


def test_neutral_view_moves_a_pyenv_venv_out_of_the_home() -> None:
    base = "/home/alice/.pyenv/versions/3.11.7"
    venv = "/home/alice/proj/.venv"
    view = neutral_view(
        HostPython(
            executable=f"{base}/bin/python3.11",
            base_prefix=base,
            venv=venv,
            site_packages=(f"{venv}/lib/python3.11/site-packages",),
            version="3.11.7",
            include_system_site_packages=False,
            shared_libpython=True,
            masked=(f"{venv}/lib/python3.11/site-packages/__editable__.x.pth",),
        ),
        same_path=("/usr", "/etc/fonts"),
    )
    dests = [dest for _, dest in view.mounts] + [path for path, _ in view.files]
    assert not [d for d in dests if "alice" in d or "pyenv" in d], dests
    assert (base, "/opt/sandcell/python") in view.mounts
    assert (f"{base}/bin/python3.11", "/opt/sandcell/venv/bin/python") in view.mounts
    assert view.python == "/opt/sandcell/venv/bin/python"
    files = dict(view.files)
    assert files["/opt/sandcell/venv/pyvenv.cfg"].startswith("home = /opt/sandcell/python/bin\n")
    assert files["/opt/sandcell/venv/lib/python3.11/site-packages/__editable__.x.pth"] == ""
    assert ("LD_LIBRARY_PATH", "/opt/sandcell/python/lib") in view.env


def test_neutral_view_keeps_usr_where_it_is() -> None:
    view = neutral_view(
        HostPython(
            executable="/usr/bin/python3.11",
            base_prefix="/usr",
            venv=None,
            site_packages=(),
            version="3.11.2",
            include_system_site_packages=False,
            shared_libpython=False,
        ),
        same_path=("/usr",),
    )
    assert view.mounts == (("/usr", "/usr"),) and view.files == () and view.env == ()
    assert view.python == "/usr/bin/python3.11"


def test_bwrap_options_travel_by_descriptor() -> None:
    argv = build_argv(_plan())
    short, data = args_via_fd(argv, 11)
    end = argv.index("--")
    assert short == [argv[0], "--args", "11", *argv[end:]]
    assert data.split(b"\0")[:-1] == [a.encode() for a in argv[1:end]]
    # Nothing of the host's layout stays on the command line (the sandbox reads it as pid 1).
    assert not [a for a in short if a.startswith(("/var/runs", "/data"))]
