"""What a run's record and its result say of the runtime it ran in, from one place.

The record keeps the runtime's identity and hash, and for a built runtime the name asked for,
its tree and its lock; the result (``--json``, the HTTP body, a session cell) names the built
runtime by those same three values, or says None for sandcell's own environment. Both are
made here so that they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandcell.runtimes import Runtime
from sandcell.spec import NODE_LANGUAGES, RuntimeRef

__all__ = ["ref_from_record", "runtime_record", "runtime_ref"]


def _selected(requested: str | None) -> str:
    # A pinned request (``name@tree``) is recorded by its name; the tree hash says the rest.
    return (requested or "").split("@")[0]


def runtime_record(runtime: Runtime, requested: str | None) -> dict[str, object]:
    """The record's ``runtime``: ``requested`` is the runtime the admitted request named."""
    return {
        "name": runtime.name,
        "identity": runtime.identity,
        "sha256": runtime.sha256,
        # A built runtime: the tree it is stored as and the lock it was built from.
        **(
            {
                # A JavaScript or TypeScript run is in the Node runtime whatever Python runtime
                # the request named: its record names ``node``, so a replay pins that tree.
                "selected": runtime.name
                if runtime.language in NODE_LANGUAGES
                else _selected(requested),
                "tree_sha256": runtime.tree_sha256,
                "lock_sha256": runtime.lock_sha256,
            }
            if runtime.tree_sha256
            else {}
        ),
    }


def runtime_ref(runtime: Runtime, requested: str | None) -> RuntimeRef | None:
    """The result's ``runtime``: None for sandcell's own environment."""
    return ref_from_record(runtime_record(runtime, requested))


def ref_from_record(section: object) -> RuntimeRef | None:
    """The result's ``runtime`` from a record's (None when the record names no built runtime,
    as for sandcell's own environment or a record of unexpected shape)."""
    if not isinstance(section, Mapping):
        return None
    tree = section.get("tree_sha256")
    if not isinstance(tree, str) or not tree:
        return None
    name = section.get("selected") or section.get("name")
    lock = section.get("lock_sha256")
    return RuntimeRef(
        name=str(name or ""), tree_sha256=tree, lock_sha256=lock if isinstance(lock, str) else ""
    )
