"""The sweep of what dead supervisors left on the host: run directories, mounts and cgroups.

Every rung lays out its runs the same way (``workspace``, ``cgroups``), so one sweep serves
them; a rung that keeps more (gVisor's runsc state, the microVM's jails) sweeps that first and
then calls this.
"""

from __future__ import annotations

from sandcell.backends.host import cgroups, workspace


def sweep() -> list[str]:
    """Remove what dead supervisors left: run directories, mounts, cgroups. Returns what went."""
    removed = [str(p) for p in workspace.sweep_runs()]
    host = cgroups.detect()
    if isinstance(host, cgroups.CgroupHost):
        for _ctrl, group in cgroups.stale_groups(host):
            owner = group.name.partition(".")[0]
            if workspace.owner_alive(owner):
                continue
            rc = cgroups.RunCgroup(host, group.name, freezer=True)
            rc.kill_all()
            if rc.remove():
                removed.append(str(group))
    return sorted(set(removed))
