"""``sandcell doctor``: the report on this host, and each check's failure path on synthetic input.

Failures are produced by handing the check functions their inputs (a fake ``/proc/sys``, a fake
``/proc/self/status``, an :class:`IsolationUnavailable`, a fake bwrap), not by mocking.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandcell import doctor
from sandcell.backends import registry
from sandcell.backends.base import BackendStatus
from sandcell.backends.host.cgroups import CgroupHost
from sandcell.doctor import Check, DoctorReport, diagnose, render
from sandcell.errors import IsolationUnavailable

NAMES = (
    "sandcell",
    "kernel",
    "bubblewrap",
    "user namespaces",
    "seccomp",
    "landlock",
    "cgroups",
    "python runtime",
    "bash runtime",
    "node runtime",
    "kvm",
    "backend namespaces",
    "backend wasm",
    "backend gvisor",
    "backend microvm",
)


@pytest.fixture(scope="module")
def report() -> DoctorReport:
    return diagnose()


def _proc_sys(root: Path, **values: int) -> Path:
    """A fake /proc/sys with the given sysctls (``user__max_user_namespaces=0``...)."""
    for key, value in values.items():
        path = root.joinpath(*key.split("__"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return root


# -- the real host --------------------------------------------------------------------------


def test_diagnose_has_every_check(report: DoctorReport) -> None:
    assert tuple(c.name for c in report.checks) == NAMES
    for c in report.checks:
        assert c.detail
        assert c.ok or c.fix, f"{c.name} failed without a fix"


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root (or delegation) for strict runs")
def test_default_run_can_work_here_as_root(report: DoctorReport) -> None:
    assert report.can_run, render(report)
    assert render(report).endswith("a default run can work on this host")


def test_render_names_every_check(report: DoctorReport) -> None:
    text = render(report)
    for name in NAMES:
        assert name in text
    # Aligned: details and fix lines all start in one column, after the longest name.
    column = len("[ok] ") + max(map(len, NAMES)) + 2
    for line in text.splitlines()[:-1]:
        assert line[column - 2 : column] == "  " and line[column] != " ", line
        assert line.startswith(("[ok] ", "[!!] ", "[--] ")) or line[column:].startswith("fix: ")


def test_to_dict_is_json(report: DoctorReport) -> None:
    data = json.loads(json.dumps(report.to_dict()))
    assert data["can_run"] == report.can_run
    assert [c["name"] for c in data["checks"]] == list(NAMES)
    assert set(data["checks"][0]) == {"name", "ok", "detail", "fix", "required"}


# -- failure paths --------------------------------------------------------------------------


def test_cgroups_unavailable_blocks_and_names_rlimits() -> None:
    exc = IsolationUnavailable("cgroups", "no usable cgroup hierarchy", "mount cgroup v2")
    check = doctor._cgroup_check(exc)
    assert not check.ok and check.required
    assert check.fix is not None and "--isolation rlimits" in check.fix
    text = render(DoctorReport((check,)))
    assert text.splitlines()[0].startswith("[!!] cgroups")
    assert "fix: mount cgroup v2" in text
    assert text.endswith(
        "blocked by cgroups; the weaker mode --isolation rlimits can run without cgroups"
    )


def test_cgroups_v2_reports_controllers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    check = doctor._cgroup_check(CgroupHost(version=2, bases={"unified": tmp_path / "sandcell"}))
    assert check.ok
    assert "cgroup.controllers: cpu memory pids" in check.detail


def test_userns_disabled_by_max_user_namespaces(tmp_path: Path) -> None:
    check = doctor._userns_check(_proc_sys(tmp_path, user__max_user_namespaces=0), euid=0)
    assert not check.ok and check.required
    assert "max_user_namespaces=0" in check.detail
    assert check.fix is not None and "user.max_user_namespaces" in check.fix


def test_userns_debian_sysctl(tmp_path: Path) -> None:
    root = _proc_sys(tmp_path, user__max_user_namespaces=100, kernel__unprivileged_userns_clone=0)
    check = doctor._userns_check(root, euid=1000)
    assert not check.ok
    assert check.fix is not None and "kernel.unprivileged_userns_clone=1" in check.fix
    assert doctor._userns_check(root, euid=0).ok  # root is not restricted by it


def test_userns_apparmor_restriction(tmp_path: Path) -> None:
    root = _proc_sys(
        tmp_path, user__max_user_namespaces=100, kernel__apparmor_restrict_unprivileged_userns=1
    )
    check = doctor._userns_check(root, euid=1000)
    assert not check.ok
    assert check.fix is not None
    assert "apparmor_restrict_unprivileged_userns=0" in check.fix and "userns," in check.fix
    assert doctor._userns_check(root, euid=0).ok


def test_userns_probe_failure_reports_stderr(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    root = _proc_sys(tmp_path / "sys", user__max_user_namespaces=100)
    check = doctor._userns_check(root, euid=1000, bwrap=str(fake))
    assert not check.ok
    assert "status 1: bwrap: No permissions to create new namespace" in check.detail
    assert check.fix is not None and "seccomp" in check.fix


def test_userns_probe_success_overrides_sysctl(tmp_path: Path) -> None:
    # An AppArmor profile for bwrap lets it through a restrictive sysctl: the probe decides.
    root = _proc_sys(
        tmp_path, user__max_user_namespaces=100, kernel__apparmor_restrict_unprivileged_userns=1
    )
    check = doctor._userns_check(root, euid=1000, bwrap="/usr/bin/true")
    assert check.ok and check.fix is None
    assert "test sandbox ran" in check.detail


def test_seccomp_missing_field(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nPid:\t1\n")
    check = doctor._seccomp_check(status)
    assert not check.ok and check.required
    assert check.fix is not None and "CONFIG_SECCOMP" in check.fix


def test_landlock_missing_is_informational() -> None:
    exc = IsolationUnavailable("landlock", "no Landlock (ENOSYS)", "use a newer kernel")
    check = doctor._landlock_check(exc)
    assert not check.ok and not check.required and check.fix == "use a newer kernel"
    report = DoctorReport((check,))
    assert report.can_run
    assert render(report).startswith("[--] landlock")
    assert doctor._landlock_check(7).detail.startswith("ABI 7 (")


def test_kvm_is_informational(tmp_path: Path) -> None:
    kvm = doctor._kvm_check(tmp_path / "kvm")
    assert not kvm.ok and not kvm.required and kvm.fix and "TCG" in kvm.fix


def test_one_row_per_backend_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_probe(name: str) -> BackendStatus:
        if name == "gvisor":
            return BackendStatus(name=name, usable=True, detail="runsc 2022", fix=None)
        return BackendStatus(name=name, usable=False, detail="no kernel", fix="run install-vm")

    monkeypatch.setattr(doctor, "probe", fake_probe)
    rows = {c.name: c for c in doctor.diagnose().checks if c.name.startswith("backend ")}
    assert list(rows) == [
        "backend namespaces",
        "backend wasm",
        "backend gvisor",
        "backend microvm",
    ]
    assert rows["backend gvisor"].ok and "protects" in rows["backend gvisor"].detail
    micro = rows["backend microvm"]
    assert not micro.ok and not micro.required and micro.fix == "run install-vm"
    assert "no kernel" in micro.detail


def test_backend_probe_crash_is_a_failed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    def broken(name: str) -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(importlib, "import_module", broken)
    st = registry.probe("gvisor")
    assert not st.usable and "RuntimeError: boom" in st.detail and st.fix


def test_crashing_check_becomes_a_failure() -> None:
    def boom() -> Check:
        raise RuntimeError("unexpected")

    check = doctor._guarded("cgroups", True, boom)
    assert not check.ok and check.required
    assert "RuntimeError: unexpected" in check.detail and check.fix
