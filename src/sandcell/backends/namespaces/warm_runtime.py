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
"""

from __future__ import annotations

from sandcell.spec import DEFAULT_RUNTIME, RunRequest

__all__ = ["importable_preload", "runtime_imports", "runtime_mismatch", "runtime_name"]


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
    from sandcell.runtime_offer import offer

    return offer(name).importable


def importable_preload(preload: tuple[str, ...], runtime: str | None) -> tuple[str, ...]:
    """``preload`` without the modules the runtime cannot import (by top-level package)."""
    if not preload:
        return preload
    names = runtime_imports(runtime)
    return tuple(m for m in preload if m.partition(".")[0] in names)
