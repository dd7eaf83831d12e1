"""The isolation ladder: which backends exist, how strong each is, and how to build one by name.

The rungs, weakest first:

- ``namespaces``: Linux namespaces on the host's kernel (bubblewrap, seccomp, Landlock, cgroups).
  A kernel bug reachable through the allowed system calls reaches the host.
- ``wasm``: Python compiled to WebAssembly (Pyodide, run by Node.js) inside a namespaces sandbox:
  two walls, the program has no system calls of its own; Python and pure-Python packages only.
  Ranked above namespaces (it is one, plus a wall), below gVisor (Node's own system calls still
  reach the host's kernel).
- ``gvisor``: gVisor's user-space kernel (``runsc``) between the program and the host's kernel.
- ``microvm``: a dedicated guest kernel per run in a minimal virtual machine (QEMU ``microvm``).

Backends are imported only when one is built, so a host without QEMU or runsc pays nothing for
them and a namespaces run never imports their modules.

This is the one place outside the rungs that imports them (``tests/unit/test_floor_plan.py``
checks it). Each rung's package offers its backend class (:class:`~sandcell.backends.base.
Backend`, sessions included), and what needs no built backend: ``probe()`` where the doctor asks
(gVisor, microVM) and ``sweep_stale()``, which :func:`sweep_stale` calls.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, get_args

from sandcell.errors import ConfigError, IsolationUnavailable

if TYPE_CHECKING:
    from sandcell.backends.base import Backend, BackendStatus
    from sandcell.backends.warm import WarmConfig

BackendName = Literal["namespaces", "wasm", "gvisor", "microvm"]
LADDER: tuple[BackendName, ...] = get_args(BackendName)
"""Every backend, weakest isolation first."""

ENV_BACKEND = "SANDCELL_BACKEND"
"""The environment variable naming the backend a caller asks for when it names none."""

_CLASSES: dict[BackendName, tuple[str, str]] = {
    "namespaces": ("sandcell.backends.namespaces", "NamespacesBackend"),
    "wasm": ("sandcell.backends.wasm", "WasmBackend"),
    "gvisor": ("sandcell.backends.gvisor", "GVisorBackend"),
    "microvm": ("sandcell.backends.microvm", "MicroVMBackend"),
}

SWEEP_ORDER: tuple[BackendName, ...] = ("gvisor", "microvm", "wasm", "namespaces")
"""The order of :func:`sweep_stale`: gVisor's containers are deleted before anything removes
their run directories (the microVM's sweep and the namespaces rung's remove those of every dead
supervisor), and the host's shared sweep (the namespaces rung's) comes last."""

PROTECTS: dict[BackendName, str] = {
    "namespaces": "the host's files, network, processes and resources; not a kernel bug",
    "wasm": (
        "also the program's own system calls: Python runs as WebAssembly (Pyodide) inside the "
        "namespaces sandbox; Python only, pure-Python packages"
    ),
    "gvisor": "also most host-kernel bugs: system calls are served by gVisor's own kernel",
    "microvm": "also a compromised guest kernel: each run has its own, behind a minimal VMM",
}
"""What each rung protects against, for ``doctor`` and the README's ladder."""


def check_name(name: str, *, what: str = "backend") -> BackendName:
    """``name`` as a backend name; a ConfigError that lists the choices otherwise."""
    if name not in LADDER:
        raise ConfigError(f"unknown {what} {name!r}; choose one of {', '.join(LADDER)}")
    return name


def rank(name: BackendName) -> int:
    """The rung of ``name``: higher is stronger isolation."""
    return LADDER.index(name)


def requested_backend(explicit: str | None = None) -> BackendName | None:
    """The backend the caller named: ``explicit``, else ``$SANDCELL_BACKEND``, else None."""
    name = explicit or os.environ.get(ENV_BACKEND) or None
    if name is None:
        return None
    source = "backend" if explicit else f"backend in ${ENV_BACKEND}"
    return check_name(name, what=source)


def create_backend(name: str, *, warm: WarmConfig | None = None) -> Backend:
    """A new backend of that name. Raises IsolationUnavailable when the host cannot provide it
    (with the reason and the fix); never falls back to another rung."""
    module, cls = _CLASSES[check_name(name)]
    try:
        factory: Callable[..., Backend] = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as exc:  # a partial install: name the missing piece
        raise IsolationUnavailable(
            name, f"the {name} backend cannot be imported: {exc}", "reinstall sandcell"
        ) from exc
    return factory(warm=warm)


def sweep_stale() -> list[str]:
    """Remove what dead supervisors left on this host, on every rung (their processes,
    containers, VMs, run directories, mounts, cgroups), without building a backend: a rung
    looks further only where it finds something of its own. Returns what went."""
    removed: list[str] = []
    for name in SWEEP_ORDER:
        sweep: Callable[[], list[str]] = importlib.import_module(_CLASSES[name][0]).sweep_stale
        removed += sweep()
    return removed


def probe(name: str) -> BackendStatus:
    """Whether this host can run backend ``name``, without running a program."""
    from sandcell.backends.base import BackendStatus

    module = _CLASSES[check_name(name)][0]
    try:
        found: Callable[[], BackendStatus] = importlib.import_module(module).probe
        return found()
    except Exception as exc:  # a probe must not take the doctor down with it
        return BackendStatus(
            name=name,
            usable=False,
            detail=f"the probe failed: {type(exc).__name__}: {exc}",
            fix="report this output to the sandcell maintainers",
        )


__all__ = [
    "ENV_BACKEND",
    "LADDER",
    "PROTECTS",
    "SWEEP_ORDER",
    "BackendName",
    "check_name",
    "create_backend",
    "probe",
    "rank",
    "requested_backend",
    "sweep_stale",
]
