"""``sandcell wasm``: the wasm rung's Pyodide.

``sandcell wasm install`` fetches the pinned Pyodide through npm (once, at install time; a run
never fetches), checks it against the pinned hash, unpacks it and makes its memory snapshot, in
the directory :func:`sandcell.backends.wasm.dist.wasm_dir` names (as root: /var/lib/sandcell/wasm,
readable by every user). ``sandcell wasm show [--json]`` prints what a run would use, or why the
rung is unavailable here and the fix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from sandcell import status
from sandcell.errors import IsolationUnavailable

if TYPE_CHECKING:
    from sandcell.backends.wasm.dist import PyodideDist


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("wasm", help="install or show the wasm rung's Pyodide")
    wasm_sub = p.add_subparsers(dest="wasm_command", required=True)
    wasm_sub.add_parser("install", help="fetch (npm), check and install the pinned Pyodide")
    show = wasm_sub.add_parser("show", help="show the installed Pyodide, or why there is none")
    show.add_argument("--json", action="store_true", help="print one JSON object")


def _facts(found: PyodideDist) -> dict[str, object]:
    return {
        "installed": True,
        "version": found.version,
        "python": found.python,
        "dir": str(found.directory),
        "snapshot": str(found.snapshot) if found.snapshot else None,
        "node": found.node,
        "node_version": found.node_version,
    }


def handle(args: argparse.Namespace) -> int:
    from sandcell.backends.wasm import dist

    if args.wasm_command == "install":
        t0 = time.monotonic()
        print(
            f"installing Pyodide {dist.PYODIDE_VERSION} into {dist.dist_dir()} ...",
            file=sys.stderr,
        )
        # IsolationUnavailable (no Node.js, no npm, a tarball that does not match the pin)
        # reaches the caller's guard, which prints reason and fix with the config exit status.
        facts = _facts(dist.install())
        print(
            f"installed in {time.monotonic() - t0:.0f} s: Pyodide {facts['version']} "
            f"(CPython {facts['python']}) in {facts['dir']}, snapshot "
            f"{facts['snapshot'] or 'none'}, Node.js {facts['node_version']} ({facts['node']})"
        )
        return 0
    try:
        doc = _facts(dist.find())
    except IsolationUnavailable as exc:
        doc = {"installed": False, "error": exc.reason, "fix": exc.fix, "dir": str(dist.dist_dir())}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        for key, value in doc.items():
            print(f"{key:20} {value}")
    return 0 if doc["installed"] else status.EXIT_CONFIG


__all__ = ["add_parser", "handle"]
