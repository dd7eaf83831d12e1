"""The Node.js runtime: JavaScript and TypeScript programs.

``sandcell runtime build node`` (``build.py``) stores the pinned Node.js binary and the locked
npm packages (``locked.py``, ``lock/``) as one content-addressed tree in the runtime store, beside
the Python runtimes. Inside the sandbox Node sits at ``/opt/sandcell/node/bin/node`` and the
packages at ``/node_modules``, where Node's module resolution finds them by walking up from the
program's directory (``/sandcell``) or the workspace (``/sandbox``): no ``NODE_PATH``, which a
program's environment may not set. The boot step of every run is Python, so the runtime also
carries this environment's own Python runtime (its interpreter and mounts).

Every JavaScript or TypeScript run uses the runtime ``node`` whatever Python runtime the request
names (``default``, ``analysis``...); ``node@<tree sha256>`` names one exact build (a replay).
The tree is verified before its first use in a process, like a named Python runtime; a missing
or changed one is refused with the command that builds it. Node starts with its permission
model on (``flags.NODE_FLAGS``).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from sandcell.errors import ConfigError
from sandcell.runtimes import Runtime, _minimal_roots, _own_python_runtime
from sandcell.runtimes.node.flags import NODE_FLAGS
from sandcell.runtimes.node.locked import NODE_RUNTIME, locked_packages
from sandcell.runtimes.store.store import StoredRuntime

__all__ = [
    "NODE_RUNTIME",
    "SANDBOX_NODE",
    "SANDBOX_NODE_MODULES",
    "locked_packages",
    "node_runtime",
    "node_tree",
    "stored_node",
]

SANDBOX_NODE = "/opt/sandcell/node"
"""Where the Node.js installation (``bin/node``, ``LICENSE``) appears in the sandbox."""
SANDBOX_NODE_MODULES = "/node_modules"
"""Where the locked packages appear: above every directory a program runs from."""


def _ref(name: str | None) -> str:
    """The store reference for a request's runtime name: ``node@<tree>`` stays exact, anything
    else (a Python runtime's name, ``default``, None) means the current ``node``."""
    if name is not None and name.startswith(f"{NODE_RUNTIME}@"):
        return name
    return NODE_RUNTIME


def stored_node(name: str | None = None) -> StoredRuntime:
    """The stored Node runtime for ``name`` (see :func:`node_runtime`), verified."""
    from sandcell.runtimes.store import find, verify

    ref = _ref(name)
    try:
        stored = find(ref)
    except ConfigError as exc:
        raise ConfigError(f"JavaScript and TypeScript need the Node runtime: {exc}") from None
    if stored.manifest.kind != "node":
        raise ConfigError(
            f"the runtime {NODE_RUNTIME!r} on this host is a Python runtime, not Node.js; rebuild "
            "it with: sandcell runtime build node"
        )
    verify(stored)
    return stored


def node_tree(name: str | None = None) -> Path:
    """The verified host directory of the Node runtime (``node/``, ``node_modules/``), e.g. for
    an image that copies it into a guest at the same sandbox paths."""
    return stored_node(name).tree


def node_runtime(name: str | None = None) -> Runtime:
    """The Node runtime for a request naming runtime ``name`` (None, ``default`` or a Python
    runtime's name: the current ``node``; ``node@<tree>``: that build)."""
    stored = stored_node(name)
    m = stored.manifest
    return _node_runtime(
        str(stored.tree), m.tree_sha256, m.lock_sha256, m.lock_source, m.implementation
    )


@functools.cache
def _node_runtime(
    tree: str, tree_sha256: str, lock_sha256: str, lock_source: str, implementation: str
) -> Runtime:
    py = _own_python_runtime()
    node_dir = os.path.join(tree, "node")
    modules = os.path.join(tree, "node_modules")
    interpreter = os.path.join(node_dir, "bin", "node")
    identity = f"{implementation}, runtime {NODE_RUNTIME} {tree_sha256[:12]} (lock {lock_source})"
    digest = hashlib.sha256(f"{identity}\n{tree_sha256}\n{py.sha256}".encode()).hexdigest()
    return Runtime(
        name=NODE_RUNTIME,
        language="javascript",
        interpreter=interpreter,
        python=py.python,
        ro_dirs=_minimal_roots([*py.ro_dirs, tree]),
        symlinks=py.symlinks,
        env={"PATH": f"{os.path.dirname(interpreter)}:/usr/local/bin:/usr/bin:/bin"},
        identity=identity,
        sha256=digest,
        mounts=(*py.mounts, (node_dir, SANDBOX_NODE), (modules, SANDBOX_NODE_MODULES)),
        files=py.files,
        sandbox_python=py.sandbox_python,
        sandbox_interpreter=f"{SANDBOX_NODE}/bin/node",
        interpreter_args=NODE_FLAGS,
        sandbox_env={
            "PATH": f"{SANDBOX_NODE}/bin:/usr/local/bin:/usr/bin:/bin",
            # The boot step is Python: a moved shared libpython must still be found.
            **{k: v for k, v in py.sandbox_env.items() if k == "LD_LIBRARY_PATH"},
        },
        tree_sha256=tree_sha256,
        lock_sha256=lock_sha256,
        # Node's files hold no Python bytecode: nothing to rewrite for the sandbox's paths.
        prebuilt_bytecode=(
            *py.prebuilt_bytecode,
            os.path.realpath(node_dir),
            os.path.realpath(modules),
        ),
    )
