"""Resource limits (setrlimit) of a run, as a pure plan applied to the sandbox's first process.

rlimits are inherited across fork and exec, so setting them on the sandbox's init before it starts
the program covers every process of the run. They complement cgroups: CPU seconds, open files,
file size and core dumps have no cgroup equivalent. In the weaker ``rlimits`` mode, RLIMIT_AS and
RLIMIT_NPROC stand in for the memory and pids cgroups.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from sandcell.spec import IsolationMode, Limits


@dataclass(frozen=True, slots=True, kw_only=True)
class Rlimit:
    name: str
    resource: int
    soft: int
    hard: int


def plan_rlimits(
    limits: Limits, mode: IsolationMode, *, address_space: bool = True, reserve: int = 0
) -> tuple[Rlimit, ...]:
    """The rlimits of a run (pure). ``address_space=False``: no RLIMIT_AS in the ``rlimits``
    mode, for a sandbox whose program bounds its memory otherwise (the wasm rung: V8 reserves
    gigabytes of address space it never uses, and its Wasm heap has a maximum of its own).
    ``reserve``: bytes of address space the interpreter reserves without using them, added to
    RLIMIT_AS (a Node program's: ``node_program.py``)."""
    cpu = int(limits.cpu_time_s)
    plan = [
        # The hard CPU limit one second above the soft one: SIGXCPU first, SIGKILL if ignored.
        Rlimit(name="RLIMIT_CPU", resource=resource.RLIMIT_CPU, soft=cpu, hard=cpu + 1),
        Rlimit(
            name="RLIMIT_NOFILE",
            resource=resource.RLIMIT_NOFILE,
            soft=limits.max_open_files,
            hard=limits.max_open_files,
        ),
        Rlimit(
            name="RLIMIT_FSIZE",
            resource=resource.RLIMIT_FSIZE,
            soft=limits.max_file_bytes,
            hard=limits.max_file_bytes,
        ),
        Rlimit(name="RLIMIT_CORE", resource=resource.RLIMIT_CORE, soft=0, hard=0),
    ]
    if mode is IsolationMode.RLIMITS and address_space:
        plan.append(
            Rlimit(
                name="RLIMIT_AS",
                resource=resource.RLIMIT_AS,
                soft=limits.memory_bytes + reserve,
                hard=limits.memory_bytes + reserve,
            )
        )
    if mode is IsolationMode.RLIMITS:
        plan += [
            # Counted per user namespace on current kernels, so it counts only the sandbox.
            Rlimit(
                name="RLIMIT_NPROC",
                resource=resource.RLIMIT_NPROC,
                soft=limits.max_pids,
                hard=limits.max_pids,
            ),
        ]
    return tuple(plan)


def apply_rlimits(pid: int, plan: tuple[Rlimit, ...]) -> None:
    """Set the plan on a running process (the sandbox init, while it waits to start the program)."""
    for r in plan:
        resource.prlimit(pid, r.resource, (r.soft, r.hard))
