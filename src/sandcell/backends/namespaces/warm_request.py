"""What a warm run's child is sent: its request document, its Landlock rules, its input trees.

The document is what pid 1 of a warm sandbox acts on (mounts, tmpfs sizes, rlimits, environment,
the program); the inputs travel as detached mount trees (``_trees.py``), because no host path is
visible in a namespace made from the template's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sandcell.backends.namespaces import _trees, landlock
from sandcell.backends.namespaces.bwrap import SANDBOX_WORKDIR
from sandcell.backends.namespaces.rlimits import plan_rlimits
from sandcell.display import DISPLAY_DIRNAME
from sandcell.errors import InfraError
from sandcell.runtimes import Runtime
from sandcell.spec import RunRequest

__all__ = ["LandlockPlans", "input_trees", "request_doc"]

_DISPLAY_DIR = f"{SANDBOX_WORKDIR}/{DISPLAY_DIRNAME}"
_INPUTS = "/inputs"
_TREE_HELPER = Path(_trees.__file__)


class LandlockPlans:
    """The program's Landlock rules, the same for every run (``/inputs`` is always readable: it
    is empty, or the run's inputs mounted read-only), so a pooled child applies them before its
    request exists. Built once per ABI."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._plans: dict[int, dict[str, Any]] = {}

    def for_abi(self, abi: int | None) -> dict[str, Any] | None:
        if abi is None:
            return None
        plan = self._plans.get(abi)
        if plan is None:
            runtime = self._runtime
            plan = landlock.build_plan(
                runtime_paths=runtime.sandbox_paths,
                input_dir=_INPUTS,
                work_dir=SANDBOX_WORKDIR,
                abi=abi,
            ).to_dict()
            self._plans[abi] = plan
        return plan


def request_doc(
    request: RunRequest, *, env: dict[str, str], landlock_plan: dict[str, Any] | None
) -> dict[str, Any]:
    """The request pid 1 of the warm sandbox acts on."""
    limits = request.effective_limits
    return {
        "script": "main.py",
        "code": request.code,
        "display": _DISPLAY_DIR if request.display else None,
        "env": {**env, **request.env},
        "limits": {
            "tmp_bytes": limits.tmp_bytes,
            "workspace_bytes": limits.workspace_bytes,
            "workspace_inodes": limits.workspace_inodes,
        },
        "rlimits": [
            [r.name, r.soft, r.hard, r.name == "RLIMIT_AS"]
            for r in plan_rlimits(limits, request.mode)
        ],
        "inputs": [i.name for i in request.inputs],
        "input_dirs": {i.name: i.host_path.is_dir() for i in request.inputs},
        "landlock": landlock_plan,
    }


def input_trees(request: RunRequest, scratch: Path, empty: Path) -> list[int]:
    """Descriptors of detached mount trees of the run's inputs, in order (the caller closes
    them): cloned here as root, else by the ``_trees.py`` helper in a namespace of its own.
    ``scratch``: a directory of this supervisor's, where the clones' mount points are made;
    ``empty``: the empty directory their overlays stack the inputs on (made if missing; it must
    outlive the runs)."""
    paths = [str(i.host_path) for i in request.inputs]
    if not paths:
        return []
    with contextlib.suppress(FileExistsError):
        empty.mkdir(mode=0o555)
    work = tempfile.mkdtemp(dir=scratch, prefix="trees-")
    try:
        return _input_trees(paths, work, str(empty))
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(work)


def _input_trees(paths: list[str], scratch: str, empty: str) -> list[int]:
    if os.geteuid() == 0:
        return _trees.open_trees(paths, scratch, empty)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with parent:
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(_TREE_HELPER),
                    str(child.fileno()),
                    scratch,
                    empty,
                    *paths,
                ],
                pass_fds=(child.fileno(),),
                capture_output=True,
                timeout=30,
                check=False,
                env={},
            )
        finally:
            child.close()
        msg, fds, _, _ = socket.recv_fds(parent, 4096, len(paths))
    if proc.returncode != 0 or msg != b"K" or len(fds) != len(paths):
        for fd in fds:
            os.close(fd)
        raise InfraError(
            f"the input helper failed: {msg.decode(errors='replace')[1:]} "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return list(fds)
