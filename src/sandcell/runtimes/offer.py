"""What a runtime offers a program: the names it can import and the packages (with versions)
behind them, for the checks, the ``@runtime`` import allowlist and the agent's prompt.

``default`` is the environment sandcell runs in: everything installed there can be imported (so
the "not in the runtime" denial stays exact), but what it *offers* a profile's ``@runtime`` is
only the analysis basics sandcell pins (numpy, pandas, matplotlib): the rest of that environment
is sandcell's own dependencies, not a curated set. A built runtime offers exactly its lock's
packages, read from its manifest.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from sandcell.spec import DEFAULT_RUNTIME

__all__ = ["DEFAULT_OFFER", "Offer", "offer"]

DEFAULT_OFFER = ("numpy", "pandas", "matplotlib")
"""What ``default`` offers: the analysis basics pinned in sandcell's own dependencies."""


@dataclass(frozen=True, slots=True)
class Offer:
    runtime: str
    importable: frozenset[str]
    """Every top-level name a program can import: the standard library and all packages."""
    offered: frozenset[str]
    """The names ``@runtime`` allows."""
    distributions: tuple[tuple[str, str], ...]
    """(name, version) of the packages offered, sorted: what the agent's prompt lists."""
    distribution_names: frozenset[str]
    """Every installed distribution (a cached package's requirement met by the runtime)."""


def offer(name: str | None) -> Offer:
    """The offer of runtime ``name`` (None: ``default``). Raises ConfigError when a named
    runtime is not built (with the command that builds it)."""
    if name is None or name == DEFAULT_RUNTIME:
        return _default_offer()
    from sandcell.runtimes.store import find

    manifest = find(name).manifest
    key = (name, manifest.tree_sha256)
    found = _named.get(key)
    if found is None:
        imports = frozenset(manifest.imports)
        found = _named[key] = Offer(
            runtime=name,
            importable=frozenset(sys.stdlib_module_names) | imports,
            offered=imports,
            distributions=tuple(sorted(manifest.distributions.items())),
            distribution_names=frozenset(manifest.distributions),
        )
    return found


_named: dict[tuple[str, str], Offer] = {}


@functools.cache
def _default_offer() -> Offer:
    from sandcell.packages.runtime_lock import runtime_distributions_once, runtime_imports

    dists = runtime_distributions_once()
    return Offer(
        runtime=DEFAULT_RUNTIME,
        importable=runtime_imports(),
        offered=frozenset(DEFAULT_OFFER),
        distributions=tuple((n, dists[n][0]) for n in DEFAULT_OFFER if n in dists),
        distribution_names=frozenset(dists),
    )
