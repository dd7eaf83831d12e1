"""The rungs a session contract test runs on, and how it gets each rung's executor.

Every session test takes the ``rung`` fixture (tests/contract/sessions/conftest.py), whose
parameter is the rung's name, so ids read ``[namespaces]``, ``[wasm]``, ``[gvisor]``,
``[microvm]``. A test that holds on some rungs only says why with :func:`only_on`: the other
rungs skip with that reason, before any sandbox is started for them.

The executors are the suite's root executors (tests/conftest.py), shared with the run contract:
the namespaces backend's cold one, the wasm rung's and gVisor's cold ones (a wasm session opens
in about a second: Node restores Pyodide's memory snapshot) and the microVM's pool, whose clones
of a snapshot open a session VM in about a second where a cold boot takes seconds under emulation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import backend_unavailable, ladder_executor, settle_pools

from sandcell import Executor
from sandcell.errors import InfraError
from sandcell.sessions import Session

RUNGS = ("namespaces", "wasm", "gvisor", "microvm")


def only_on(*rungs: str, reason: str | Mapping[str, str]) -> pytest.MarkDecorator:
    """Parametrize ``rung`` over every rung, the ones not in ``rungs`` skipped with ``reason``
    (one for all of them, or one per rung)."""
    assert set(rungs) <= set(RUNGS), rungs
    why = {r: reason if isinstance(reason, str) else reason[r] for r in RUNGS if r not in rungs}
    params = [
        pytest.param(r, marks=() if r in rungs else pytest.mark.skip(reason=f"{r}: {why[r]}"))
        for r in RUNGS
    ]
    return pytest.mark.parametrize("rung", params, indirect=True)


def need_microvm() -> None:
    """Skip (or fail, where CI requires the rung) on a host without QEMU or a built guest; fail
    at once once a guest image without sessions was found."""
    from sandcell.backends.microvm import probe

    status = probe()
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    if _STALE:
        pytest.fail(_STALE[0])


_STALE: list[str] = []
"""Set once a guest image built before sessions was found: the other microVM tests fail at once."""


def executor_for(
    rung: str,
    namespaces: Executor,
    cache: dict[tuple[str, str], Executor],
    root_home: Path,
    *,
    microvm_start: str = "pool",
) -> Executor:
    """The root executor of ``rung``: ``namespaces`` (the suite's), or the ladder's (``cache``);
    the microVM's pool, or with ``microvm_start="cold"`` its executor that boots each VM."""
    if rung == "namespaces":
        return namespaces
    if rung in ("wasm", "gvisor"):
        return ladder_executor(cache, root_home, rung, "cold")
    need_microvm()
    if microvm_start == "cold":
        return ladder_executor(cache, root_home, "microvm", "cold")
    ex = ladder_executor(cache, root_home, "microvm", "pool")
    # Sessions start from pooled clones, as designed, not cold while the snapshot is taken.
    settle_pools({("microvm", "pool"): ex}, timeout=300)
    return ex


def open_session(ex: Executor, **options: Any) -> Session:
    """``ex.session(**options)``; a microVM guest image built before sessions fails the rest."""
    try:
        return ex.session(**options)
    except InfraError as exc:
        if "built before sessions" in str(exc):
            _STALE.append(f"the guest image cannot run sessions: {exc}")
        raise
