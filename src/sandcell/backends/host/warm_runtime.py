"""Which runtime a warm template serves, and which of its preload names that runtime can import.

A template (and the pool forked from it) is one interpreter with one runtime's packages already
imported: it can serve only runs in that runtime (``WarmConfig.runtime``, None meaning
``default``). A run in another runtime starts cold, and the record says why
(:func:`runtime_mismatch`).

The preload list is a configuration shared by every runtime a host serves (``numpy`` and
``pandas`` by default), but ``minimal`` has neither: a name the runtime does not provide is left
out of the template's imports (:func:`importable_preload`), so the template still starts, and
the start info of each run names what was really preloaded. The standard library is always
importable.

A named runtime may be rebuilt or replaced while the template lives (:func:`runtime_stamp`,
``runtime_store/stamp.py``): its runs then start cold, in the build the store holds now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandcell.spec import DEFAULT_RUNTIME, RunRequest

if TYPE_CHECKING:
    from sandcell.runtimes.store.stamp import TreeStamp

__all__ = [
    "importable_preload",
    "runtime_changed",
    "runtime_imports",
    "runtime_mismatch",
    "runtime_name",
    "runtime_stamp",
]


def runtime_name(name: str | None) -> str:
    """The runtime ``name`` stands for (None is ``default``)."""
    return name or DEFAULT_RUNTIME


def runtime_mismatch(request: RunRequest, served: str | None, what: str) -> str | None:
    """Why ``request`` cannot start from a ``what`` ("template", "pool") made of the runtime
    ``served``, or None when the runtimes are the same."""
    wanted, have = runtime_name(request.runtime), runtime_name(served)
    if wanted == have:
        return None
    return f"the {what} serves runtime {have}; this run is in runtime {wanted}"


def runtime_imports(name: str | None) -> frozenset[str]:
    """Top-level module names the runtime ``name`` provides, the standard library included."""
    from sandcell.runtimes.offer import offer

    return offer(name).importable


def importable_preload(preload: tuple[str, ...], runtime: str | None) -> tuple[str, ...]:
    """``preload`` without the modules the runtime cannot import (by top-level package)."""
    if not preload:
        return preload
    names = runtime_imports(runtime)
    return tuple(m for m in preload if m.partition(".")[0] in names)


def runtime_stamp(name: str | None) -> TreeStamp | None:
    """The build of the named runtime ``name`` that a template is about to be made from (None
    for ``default``, this environment's own, which is not a stored tree). Take it before
    resolving the runtime: a rebuild in between then reads as a change, never the reverse."""
    if runtime_name(name) == DEFAULT_RUNTIME:
        return None
    from sandcell.runtimes.store import find
    from sandcell.runtimes.store.stamp import TreeStamp

    return TreeStamp.of(find(runtime_name(name)))


def runtime_changed(stamp: TreeStamp | None, what: str) -> str | None:
    """Why a run cannot start from a ``what`` made of the build ``stamp`` names: the store no
    longer holds that build as it was (None: it does, or the runtime is ``default``)."""
    why = stamp.changed() if stamp is not None else None
    if why is None:
        return None
    return f"{why} since the {what} was made; this run starts cold in the build stored now"
