"""The gVisor bundle plan as pure data: config.json from a plan, without privileges or runsc."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandcell.backends.gvisor.plan import (
    POOL_CEILINGS,
    BundlePlan,
    build_config,
    mount_points,
    plan_rlimits,
    pool_rlimits,
    socket_link,
)
from sandcell.backends.gvisor.runsc import Runsc
from sandcell.spec import IsolationMode, Limits


def _plan(**changes: Any) -> BundlePlan:
    base: dict[str, Any] = {
        "rootfs": Path("/runs/r/rootfs"),
        "mounts": (("/usr", "/usr"), ("/home/u/venv/site", "/opt/sandcell/venv/site")),
        "files": ((Path("/runs/etc/runtime-x/cfg"), "/opt/sandcell/venv/pyvenv.cfg"),),
        "workspace": Path("/runs/r/work"),
        "control_dir": Path("/runs/r/control"),
        "etc_dir": Path("/runs/etc"),
        "inputs": [(Path("/data/sales.csv"), "sales.csv")],
        "packages": (Path("/cache/tomli-2.0.1"),),
        "env": {"PATH": "/usr/bin", "HOME": "/tmp"},
        "command": ["/opt/sandcell/venv/bin/python", "-I", "/sandcell/agent.pyc", ""],
        "rlimits": plan_rlimits(Limits(), IsolationMode.STRICT),
        "tmp_bytes": 64 << 20,
    }
    base.update(changes)
    return BundlePlan(**base)


def _mount(config: dict[str, Any], destination: str) -> dict[str, Any]:
    found = [m for m in config["mounts"] if m["destination"] == destination]
    assert len(found) == 1, f"expected one mount at {destination}, got {found}"
    mount: dict[str, Any] = found[0]
    return mount


def test_root_is_read_only_and_process_has_no_privileges() -> None:
    config = build_config(_plan())
    assert config["root"] == {"path": "/runs/r/rootfs", "readonly": True}
    proc = config["process"]
    assert proc["user"]["uid"] == 1000 and proc["user"]["gid"] == 1000
    assert proc["noNewPrivileges"] is True
    assert proc["terminal"] is False
    assert all(v == [] for v in proc["capabilities"].values())
    assert set(proc["capabilities"]) == {
        "bounding",
        "effective",
        "inheritable",
        "permitted",
        "ambient",
    }
    assert proc["cwd"] == "/sandbox"


def test_rootless_plan_runs_as_uid_zero_of_the_sentry_without_capabilities() -> None:
    config = build_config(_plan(uid=0))
    assert config["process"]["user"]["uid"] == 0
    assert config["process"]["user"]["gid"] == 0
    assert all(v == [] for v in config["process"]["capabilities"].values())


def test_every_namespace_and_no_resources_for_runsc() -> None:
    config = build_config(_plan())
    kinds = {ns["type"] for ns in config["linux"]["namespaces"]}
    assert kinds == {"pid", "network", "ipc", "uts", "mount"}
    # Limits are the host's cgroup and the rlimits: runsc's own resource handling is not used.
    assert config["linux"]["resources"] == {}


def test_environment_is_exactly_the_plans() -> None:
    config = build_config(_plan(env={"B": "2", "A": "1"}))
    assert config["process"]["env"] == ["A=1", "B=2"]


def test_mounts_view() -> None:
    config = build_config(_plan())
    work = _mount(config, "/sandbox")
    assert work["source"] == "/runs/r/work"
    assert "rw" in work["options"] and {"nosuid", "nodev"} <= set(work["options"])
    for dest, src in [
        ("/sandcell", "/runs/r/control"),
        ("/inputs/sales.csv", "/data/sales.csv"),
        ("/packages/tomli-2.0.1", "/cache/tomli-2.0.1"),
        ("/etc/passwd", "/runs/etc/passwd"),
        ("/usr", "/usr"),
        ("/opt/sandcell/venv/site", "/home/u/venv/site"),
        ("/opt/sandcell/venv/pyvenv.cfg", "/runs/etc/runtime-x/cfg"),
    ]:
        m = _mount(config, dest)
        assert m["source"] == src
        assert "ro" in m["options"] and "rw" not in m["options"], dest
        assert {"nosuid", "nodev"} <= set(m["options"])
    for dest in ("/tmp", "/dev/shm"):
        tmp = _mount(config, dest)
        assert tmp["type"] == "tmpfs"
        assert f"size={64 << 20}" in tmp["options"] and "mode=1777" in tmp["options"]
    # gVisor's own sysfs is always there: covered by an empty read-only tmpfs.
    sys_mount = _mount(config, "/sys")
    assert sys_mount["type"] == "tmpfs" and "ro" in sys_mount["options"]
    assert _mount(config, "/proc")["type"] == "proc"
    # Nothing else of the host: every bind source is one the plan named.
    sources = {m["source"] for m in config["mounts"] if m["type"] == "bind"}
    named = {
        "/runs/r/work",
        "/runs/r/control",
        "/data/sales.csv",
        "/cache/tomli-2.0.1",
        "/usr",
        "/home/u/venv/site",
        "/runs/etc/runtime-x/cfg",
        *(f"/runs/etc/{n}" for n in ("passwd", "group", "hosts", "nsswitch.conf")),
    }
    assert sources == named


def test_runtime_is_mounted_after_the_sandbox_paths() -> None:
    # A runtime under a path the sandbox also uses (a venv in /tmp) must stay visible.
    config = build_config(_plan(mounts=(("/tmp/venv", "/tmp/venv"),)))
    dests = [m["destination"] for m in config["mounts"]]
    assert dests.index("/tmp/venv") > dests.index("/tmp")


@pytest.mark.parametrize("mode", list(IsolationMode))
def test_rlimits_never_include_cpu_and_match_the_limits(mode: IsolationMode) -> None:
    limits = Limits(max_open_files=77, max_file_bytes=1234, max_pids=9, memory_bytes=300 << 20)
    got = {r.name: r.value for r in plan_rlimits(limits, mode)}
    # gVisor does not enforce RLIMIT_CPU: the host does; an rlimit would be a false promise.
    assert "RLIMIT_CPU" not in got
    assert got["RLIMIT_NOFILE"] == 77
    assert got["RLIMIT_FSIZE"] == 1234
    assert got["RLIMIT_NPROC"] == 9
    assert got["RLIMIT_CORE"] == 0
    if mode is IsolationMode.RLIMITS:
        assert got["RLIMIT_AS"] == 300 << 20
    else:
        assert "RLIMIT_AS" not in got
    config = build_config(_plan(rlimits=plan_rlimits(limits, mode)))
    for entry in config["process"]["rlimits"]:
        assert entry["soft"] == entry["hard"] == got[entry["type"]]


def test_pool_ceilings_are_at_least_the_default_limits() -> None:
    got = {r.name: r.value for r in pool_rlimits()}
    default = {r.name: r.value for r in plan_rlimits(Limits(), IsolationMode.RLIMITS)}
    for name, ceiling in POOL_CEILINGS.items():
        assert got[name] == ceiling >= default[name]


def test_mount_points_cover_every_mount() -> None:
    plan = _plan()
    points = set(mount_points(plan))
    config = build_config(plan)
    for m in config["mounts"]:
        dest = m["destination"]
        # /etc/NAME, /inputs/NAME, /packages/NAME sit in directories the root holds.
        parent = dest if dest in points else str(Path(dest).parent)
        assert parent in points, dest


def test_synthetic_files_are_bound_after_the_mounts_they_sit_in() -> None:
    config = build_config(_plan())
    dests = [m["destination"] for m in config["mounts"]]
    assert dests.index("/opt/sandcell/venv/pyvenv.cfg") > dests.index("/opt/sandcell/venv/site")


def test_config_is_json_with_the_command() -> None:
    text = json.dumps(build_config(_plan()))
    assert json.loads(text)["process"]["args"][-2] == "/sandcell/agent.pyc"


def test_a_run_without_ways_out_has_no_socket_directory() -> None:
    plan = _plan()
    config = build_config(plan)
    assert not [m for m in config["mounts"] if m["destination"].startswith("/run")]
    assert not [p for p in mount_points(plan) if p.startswith("/run")]
    assert socket_link(plan) is None


def test_the_socket_directory_is_bound_read_only_at_run_sandcell() -> None:
    plan = _plan(sockets_dir=Path("/runs/r/ways/view"))
    m = _mount(build_config(plan), "/run/sandcell")
    assert m["source"] == "/runs/r/ways/view"
    assert "ro" in m["options"] and "rw" not in m["options"]
    assert {"nosuid", "nodev"} <= set(m["options"])
    assert "/run/sandcell" in mount_points(plan) and socket_link(plan) is None


def test_a_pooled_sandbox_binds_its_view_aside_and_links_run_into_it() -> None:
    plan = _plan(sockets_dir=Path("/runs/r/ways/view"), sockets_later=True)
    config = build_config(plan)
    m = _mount(config, "/.sandcell")
    assert m["source"] == "/runs/r/ways/view" and "ro" in m["options"]
    assert not [m for m in config["mounts"] if m["destination"].startswith("/run")]
    # Relative, inside the root: /run leads nowhere until a run that reaches outside makes
    # run/sandcell in the view.
    assert socket_link(plan) == ("/run", ".sandcell/run")
    assert "/.sandcell" in mount_points(plan)
    assert not [p for p in mount_points(plan) if p.startswith("/run")]


def test_runsc_allows_connecting_to_host_sockets_only_when_asked() -> None:
    rs = Runsc(
        path="/usr/bin/runsc",
        version_text="runsc version x",
        release="x",
        platform="ptrace",
        rootless=False,
        state_dir=Path("/state"),
        host_uds=True,
    )
    plain = rs.argv("run", "c")
    assert not [a for a in plain if "uds" in a] and "--network=none" in plain
    asked = rs.argv("run", "c", host_uds=True)
    # Connect only: never "create" or "all", which would let the sandbox bind host sockets.
    assert [a for a in asked if "uds" in a] == ["--host-uds=open"]
    assert "--network=none" in asked and asked[-2:] == ["run", "c"]
