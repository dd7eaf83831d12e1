"""The Node.js runtime: JavaScript and TypeScript programs (being built; see flags.py)."""

from __future__ import annotations

from sandcell.errors import ConfigError
from sandcell.runtimes import Runtime


def node_runtime(name: str | None = None) -> Runtime:
    """The Node runtime ``name`` (None or ``default``: ``node``)."""
    raise ConfigError(
        "JavaScript and TypeScript need the Node runtime; build it with: sandcell runtime build node"
    )
