"""The cgroup made ahead for the next cold run: taken under the run's own name, with the run's own
limits (rewritten where they differ from the last run's), and gone after ``close``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from sandcell.backends.namespaces import cgroups, workspace
from sandcell.backends.namespaces.spare_cgroup import SpareCgroup
from sandcell.spec import Limits

from .hostscan import wait_until

MiB = 1 << 20


def _host() -> cgroups.CgroupHost:
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root here; this test run is not root")
    host = cgroups.detect()
    if not isinstance(host, cgroups.CgroupHost):
        pytest.skip(f"no usable cgroups: {host.reason}")
    if not SpareCgroup.usable(host):
        pytest.skip("spare cgroups are kept on cgroup v1 hosts only (v2 cannot rename a group)")
    return host


def _spares(host: cgroups.CgroupHost) -> list[Path]:
    prefix = f"{workspace.owner_tag()}.w"
    return [
        d
        for base in host.bases.values()
        if base.is_dir()
        for d in base.iterdir()
        if d.name.startswith(prefix) and "-cold-" in d.name
    ]


def test_spare_is_renamed_limited_and_removed() -> None:
    host = _host()
    before = set(_spares(host))
    spare = SpareCgroup(host)
    taken: list[cgroups.RunCgroup] = []
    try:
        first = f"{workspace.owner_tag()}.{uuid.uuid4().hex}"
        taken.append(spare.take(Limits(), first))  # nothing made ahead yet: created now
        assert all(d.name == first and d.is_dir() for d in taken[0].dirs.values())
        # Its directories appear before the group is handed over as the spare: wait for that.
        assert wait_until(lambda: spare.waiting() is not None, timeout=10), (
            "no spare was made after the first take"
        )
        waiting = set(_spares(host)) - before
        # One group, a directory in each controller's hierarchy.
        assert {d.name for d in waiting} == {spare.waiting()}
        assert len(waiting) == len(host.bases)

        second = f"{workspace.owner_tag()}.{uuid.uuid4().hex}"
        limits = Limits().with_(memory_bytes=200 * MiB, max_pids=17)
        group = spare.take(limits, second)
        taken.append(group)
        assert not any(d.exists() for d in waiting), "the spare kept its waiting name"
        assert all(d.name == second and d.is_dir() for d in group.dirs.values())
        memory = group.dirs["memory"] / "memory.limit_in_bytes"
        assert int(memory.read_text()) == 200 * MiB
        assert (group.dirs["pids"] / "pids.max").read_text().strip() == "17"
        assert (group.dirs["memory"] / "cgroup.procs").read_text() == ""
    finally:
        spare.close()
        for g in taken:
            g.remove()
    assert set(_spares(host)) == before, "close() left a spare behind"
