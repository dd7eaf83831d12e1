"""What a warm run's child is sent: its request document, its Landlock rules, its input trees.

The document is what pid 1 of a warm sandbox acts on (mounts, tmpfs sizes, rlimits, environment,
the program); the inputs travel as detached mount trees (``_trees.py``), because no host path is
visible in a namespace made from the template's.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandcell.backends.host import landlock
from sandcell.backends.host.layout import SANDBOX_WORKDIR
from sandcell.backends.host.rlimits import plan_rlimits
from sandcell.backends.namespaces import _trees, outside
from sandcell.display import DISPLAY_DIRNAME
from sandcell.errors import InfraError
from sandcell.run_sockets import PROXY_PORT, SandboxSockets
from sandcell.runtimes import Runtime
from sandcell.spec import RunRequest

__all__ = ["LandlockPlans", "for_armed", "input_trees", "request_doc"]

_DISPLAY_DIR = f"{SANDBOX_WORKDIR}/{DISPLAY_DIRNAME}"
_INPUTS = "/inputs"
_TREE_HELPER = Path(_trees.__file__)


class LandlockPlans:
    """The program's Landlock rules, the same for every run but for the egress bridge's port
    (``/inputs`` is always readable: it is empty, or the run's inputs mounted read-only; so is
    ``/sandcell``, which holds the run's socket directory when it has one), so a pooled child
    applies them before its request exists. Built once per ABI and ``egress`` (the bridge's
    port reachable: runs with sockets, see ``outside.py``).

    A pooled child is prepared with the bridge's port reachable, since its run's profile is not
    known yet: without a bridge nothing listens there, and nothing in the sandbox can (Landlock
    denies the program every TCP bind; pid 1 listens on nothing)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._plans: dict[tuple[int, bool], dict[str, Any]] = {}

    def for_abi(self, abi: int | None, *, egress: bool = False) -> dict[str, Any] | None:
        if abi is None:
            return None
        plan = self._plans.get((abi, egress))
        if plan is None:
            runtime = self._runtime
            plan = landlock.build_plan(
                runtime_paths=runtime.sandbox_paths,
                input_dir=_INPUTS,
                work_dir=SANDBOX_WORKDIR,
                abi=abi,
                connect_tcp_ports=(PROXY_PORT,) if egress else (),
            ).to_dict()
            self._plans[(abi, egress)] = plan
        return plan


def request_doc(
    request: RunRequest,
    *,
    env: dict[str, str],
    landlock_plan: dict[str, Any] | None,
    sockets: SandboxSockets | None = None,
) -> dict[str, Any]:
    """The request pid 1 of the warm sandbox acts on. With ``sockets``, the last descriptor
    sent with it is the socket directory's mount tree (``input_trees``' ``plain``)."""
    limits = request.effective_limits
    return {
        "script": "main.py",
        "code": request.code,
        "display": _DISPLAY_DIR if request.display else None,
        "env": outside.program_env(env, sockets, request.env),
        "sockets": sockets is not None,
        "bridge": outside.bridge_script(sockets),
        "python_paths": outside.python_paths(sockets),
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


# What pid 1 of a pooled sandbox hands its waiting program's process, and needs no more itself.
_PROGRAM_ONLY = ("env", "display", "python_paths")


def for_armed(doc: dict[str, Any]) -> dict[str, Any]:
    """The request of a pooled (armed) sandbox: the program's process's part (environment,
    script, display, quiesce, paths) encoded here, once, for pid 1 to forward as it is, instead
    of decoding it and encoding it again on the request's path (its first JSON encoding since
    the fork, which copies pages of the template's image)."""
    program = {
        "env": doc["env"],
        "script": doc["script"],
        "display": doc.get("display"),
        "quiesce": bool(doc.get("quiesce")),
        "python_paths": doc.get("python_paths") or [],
    }
    rest = {k: v for k, v in doc.items() if k not in _PROGRAM_ONLY}
    rest["program"] = json.dumps(program)
    return rest


def input_trees(
    request: RunRequest, scratch: Path, empty: Path, *, plain: Sequence[Path] = ()
) -> list[int]:
    """Descriptors of detached mount trees of the run's inputs, in order, then of the ``plain``
    directories (the run's socket directory, cloned as it is: see ``outside.py``); the caller
    closes them. Cloned here as root, else by the ``_trees.py`` helper in a namespace of its
    own. ``scratch``: a directory of this supervisor's, where the clones' mount points are made;
    ``empty``: the empty directory their overlays stack the inputs on (made if missing; it must
    outlive the runs)."""
    paths = [str(i.host_path) for i in request.inputs]
    plain_paths = [str(p) for p in plain]
    if not paths and not plain_paths:
        return []
    with contextlib.suppress(FileExistsError):
        empty.mkdir(mode=0o555)
    work = tempfile.mkdtemp(dir=scratch, prefix="trees-")
    try:
        return _input_trees(paths, work, str(empty), plain_paths)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(work)


def _input_trees(paths: list[str], scratch: str, empty: str, plain: list[str]) -> list[int]:
    if os.geteuid() == 0:
        return _trees.open_trees(paths, scratch, empty, plain)
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
                    *([_trees.PLAIN, *plain] if plain else []),
                ],
                pass_fds=(child.fileno(),),
                capture_output=True,
                timeout=30,
                check=False,
                env={},
            )
        finally:
            child.close()
        msg, fds, _, _ = socket.recv_fds(parent, 4096, len(paths) + len(plain))
    if proc.returncode != 0 or msg != b"K" or len(fds) != len(paths) + len(plain):
        for fd in fds:
            os.close(fd)
        raise InfraError(
            f"the input helper failed: {msg.decode(errors='replace')[1:]} "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return list(fds)
