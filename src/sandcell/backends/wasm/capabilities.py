"""What the wasm rung cannot run, refused before the run with the reason and the rungs that can.

A run is never moved to another rung: a request the rung cannot serve is a ConfigError that says
what is missing and where it exists. The rung runs Python only (no processes, so no bash), has no
way out (no network allowlist, no governed tools: their sockets need a process that speaks them),
and loads pure-Python code only: Pyodide's builds of numpy or pandas are not in the registries
this project installs from, and wheels with compiled code from the cache are built for the
host's CPU, not for WebAssembly.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sandcell.errors import ConfigError
from sandcell.spec import NODE_LANGUAGES, MiB, RunRequest

OTHER_RUNGS = "namespaces, gvisor or microvm"
NO_OUTSIDE = (
    "the wasm rung has no network and no governed tools: its programs cannot reach outside; "
    f"use a profile without network or tools, or the {OTHER_RUNGS} rung (--backend)"
)
COMPILED_MODULES = frozenset(
    {
        "numpy", "pandas", "scipy", "matplotlib", "sklearn", "torch", "polars", "pyarrow",
        "lxml", "PIL", "cv2", "shapely", "statsmodels", "psutil", "cryptography", "yaml",
    }
)  # fmt: skip
"""Top-level modules with compiled code that programs commonly import (the runner refuses any
other at import time, with the same message)."""
_NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")


MEMORY_FLOOR = 256 * MiB
"""The smallest memory limit the rung takes: Node.js with Pyodide restored is ~160 MiB before
the program's first line (a lower limit would end every run in the cgroup's OOM kill)."""
CPU_FLOOR_S = 2.0
"""The smallest CPU-time limit: Node.js and Pyodide spend ~0.7 s of CPU starting, and the
limit (RLIMIT_CPU) counts the whole process."""


def check(request: RunRequest) -> None:
    """Raise ConfigError when the rung cannot run ``request`` as asked."""
    limits = request.effective_limits
    if limits.memory_bytes < MEMORY_FLOOR:
        raise ConfigError(
            f"the wasm rung needs a memory limit of at least {MEMORY_FLOOR // MiB} MiB (Node.js "
            f"and Pyodide take ~160 MiB before the program starts), not "
            f"{limits.memory_bytes / MiB:g} MiB; raise --memory, or use the {OTHER_RUNGS} rung"
        )
    if limits.cpu_time_s < CPU_FLOOR_S:
        raise ConfigError(
            f"the wasm rung needs a CPU-time limit of at least {CPU_FLOOR_S:g} s (Node.js and "
            f"Pyodide spend ~0.7 s starting), not {limits.cpu_time_s:g} s; raise --cpu-time, or "
            f"use the {OTHER_RUNGS} rung"
        )
    if request.language != "python":
        # Node.js runs there, but as Pyodide's host: a program's JavaScript would run beside
        # the Wasm sandbox, not in it.
        why = (
            "its Node.js only hosts Python's WebAssembly interpreter (Pyodide)"
            if request.language in NODE_LANGUAGES
            else "it has no processes and no shell"
        )
        raise ConfigError(
            f"the wasm rung runs Python only, not {request.language}: {why}; run "
            f"{request.language} on the {OTHER_RUNGS} rung (--backend)"
        )
    for pkg in request.packages:
        native = _native_file(pkg)
        if native is not None:
            raise ConfigError(
                f"package {pkg.name} has compiled code ({native}), which WebAssembly cannot "
                f"load; the wasm rung runs pure-Python packages only; use the {OTHER_RUNGS} "
                "rung (--backend)"
            )
    needed = sorted(imported_roots(request.code) & COMPILED_MODULES)
    if needed:
        raise ConfigError(
            f"the program imports {', '.join(needed)}, which the wasm rung does not have (it "
            "runs the standard library and pure-Python packages; no WebAssembly builds of "
            "numpy or pandas are installed); run it on the "
            f"{OTHER_RUNGS} rung (--backend), whose runtimes have them"
        )


def imported_roots(code: str) -> set[str]:
    """The top-level names ``code`` imports (none when it does not parse: the run then shows
    Python's own SyntaxError)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.partition(".")[0])
    return roots


def _native_file(directory: Path) -> str | None:
    for path in directory.rglob("*"):
        if path.name.endswith(_NATIVE_SUFFIXES) or ".so." in path.name:
            return str(path.relative_to(directory))
    return None
