"""What a wasm sandbox runs, as data: Node's command line and the runner's settings.

Pure decisions from the request and the installed Pyodide (:mod:`~sandcell.backends.wasm.dist`);
the backend writes them into the run's control directory and starts them through the namespaces
sandbox. Node's permission model gets the narrowest lists the runner needs: it reads Pyodide, the
control directory, the inputs and packages, and reads and writes the workspace and ``/tmp``; no
child processes, workers (except a session's kernel, whose interpreter runs on one), addons or
WASI, and no code built from strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sandcell.backends.host.layout import (
    CONTROL_DIR,
    DISPLAY_DIR,
    PACKAGES_DIR,
    SANDBOX_HOME,
    SANDBOX_WORKDIR,
    SESSION_OUTPUTS_DIR,
)
from sandcell.backends.wasm.capabilities import COMPILED_MODULES
from sandcell.backends.wasm.dist import PyodideDist
from sandcell.runtimes import code_path, common_env
from sandcell.spec import MiB, RunRequest

RUNNER = "runner.mjs"
DISPLAY = "display.py"
LOCKDOWN = "lockdown.py"
SETTINGS = "wasm.json"


def pyodide_mount(dist: PyodideDist) -> str:
    """Where Pyodide's files appear in the sandbox: read-only, beside the packages."""
    return f"{PACKAGES_DIR}/{dist.directory.name}"


INTERPRETER_RESERVE = 160 * MiB
"""What Node and Pyodide's compiled code take beside the Wasm heap (measured: ~150 MiB resident
with Pyodide loaded): the heap's maximum is the run's memory limit less this, so that a program
that fills its heap meets a MemoryError before the cgroup's limit kills the sandbox."""
HEAP_FLOOR = 32 * MiB
"""The smallest heap maximum: below it Pyodide cannot restore its snapshot."""

Mode = Literal["run", "kernel"]


@dataclass(frozen=True, slots=True)
class WasmPlan:
    """Node's argument list and the runner's settings file for one sandbox."""

    argv: tuple[str, ...]
    settings: dict[str, object]
    heap_max_bytes: int


def heap_max(request: RunRequest) -> int:
    """The Wasm heap's maximum for ``request`` (see :data:`INTERPRETER_RESERVE`)."""
    memory = request.effective_limits.memory_bytes
    return max(HEAP_FLOOR, memory - INTERPRETER_RESERVE)


POOLED_MARK = "pooled"
"""The last word of a pooled sandbox's command line, which the runner ignores: a waiting sandbox
of a warm pool is told from a session's kernel in a process listing."""


def node_argv(node: str, mode: Mode, *, pooled: bool = False) -> tuple[str, ...]:
    """Node's command line: the same for every run of a mode (a spare sandbox made ahead serves
    any run), every per-run setting is in the settings file."""
    reads = (f"{CONTROL_DIR}/", f"{PACKAGES_DIR}/", "/inputs/", f"{SANDBOX_WORKDIR}/",
             f"{SANDBOX_HOME}/", "/tmp/", "/dev/shm/")  # fmt: skip
    writes = (f"{SANDBOX_WORKDIR}/", f"{SANDBOX_HOME}/", "/tmp/", "/dev/shm/")
    return (
        node,
        "--experimental-permission",
        *(f"--allow-fs-read={p}" for p in reads),
        *(f"--allow-fs-write={p}" for p in writes),
        *(("--allow-worker",) if mode == "kernel" else ()),
        "--disallow-code-generation-from-strings",
        "--no-warnings",
        "--max-old-space-size=256",
        f"{CONTROL_DIR}/{RUNNER}",
        f"{CONTROL_DIR}/{SETTINGS}",
        *((POOLED_MARK,) if pooled else ()),
    )


def plan(request: RunRequest, dist: PyodideDist, mode: Mode, *, programs: bool = False) -> WasmPlan:
    """The plan of one sandbox running ``request`` (a run) or a kernel: a session's, or with
    ``programs`` a pooled sandbox's whose cells are programs. Rich outputs (the display module):
    a run's when it asks for them, into the workspace's output directory; a session kernel's
    always, one directory per cell under :data:`SESSION_OUTPUTS_DIR`."""
    mounts: list[list[str]] = [
        [SANDBOX_WORKDIR, SANDBOX_WORKDIR],
        [SANDBOX_HOME, SANDBOX_HOME],
        ["/tmp", "/tmp"],
        ["/dev/shm", "/dev/shm"],
    ]
    if request.inputs:
        mounts.append(["/inputs", "/inputs"])
    python_paths = []
    for pkg in request.packages:
        path = f"{PACKAGES_DIR}/{pkg.name}"
        mounts.append([path, path])
        python_paths.append(path)
    heap = heap_max(request)
    program = str(code_path("python"))
    settings: dict[str, object] = {
        "mode": mode,
        "pyodide_dir": pyodide_mount(dist),
        "snapshot": f"{pyodide_mount(dist)}/{dist.snapshot.name}" if dist.snapshot else None,
        "heap_max_bytes": heap,
        "memfs_bytes": request.effective_limits.tmp_bytes,
        "mounts": mounts,
        "python_paths": python_paths,
        "compiled_modules": sorted(COMPILED_MODULES),
        "env": {**common_env(), **dict(request.env)},
        "program": program if mode == "run" else None,
        "program_path": program,
        "cwd": SANDBOX_WORKDIR,
        "lockdown": f"{CONTROL_DIR}/{LOCKDOWN}",
        "display": None,
    }
    session = mode == "kernel" and not programs
    if session or request.display:
        settings["display"] = {
            "module": f"{CONTROL_DIR}/{DISPLAY}",
            "dir": SESSION_OUTPUTS_DIR if session else DISPLAY_DIR,
        }
    settings["programs"] = programs
    return WasmPlan(argv=node_argv(dist.node, mode), settings=settings, heap_max_bytes=heap)
