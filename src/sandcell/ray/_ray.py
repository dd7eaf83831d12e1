"""Ray, imported only when asked for: sandcell without the ``ray`` extra stays as it is."""

from __future__ import annotations

from types import ModuleType

from sandcell.errors import ConfigError

SLOTS = "sandcell_slots"
"""The custom Ray resource a node offers for sandboxes: how many it runs at once."""

INSTALL = "pip install 'sandcell[ray]'"


def import_ray() -> ModuleType:
    """The ``ray`` module; a ConfigError with the install command when it is missing."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"running on Ray needs the ray package, which is not installed; install it: {INSTALL}"
        ) from None
    return ray


__all__ = ["INSTALL", "SLOTS", "import_ray"]
