"""Which build of a named runtime something long-lived was made from, and whether the store
still holds that build, unreplaced.

A named runtime changes under a running service in two ways: ``sandcell runtime build`` points
the name at a new tree (another hash), or replaces a stored tree that had changed since it was
built (a new directory takes the old one's path). A warm template that imported from the old
tree, and the pool forked from it, would go on serving runs from it: from a removed tree, every
import not made yet fails, until the service restarts. A :class:`TreeStamp` taken when the
template is made says, at each run, whether the name still points at that hash and the
directory at its path is still the same one (device and inode: a replaced tree is a new
directory). A run that finds it changed starts cold, in the build the store holds now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import ConfigError
from sandcell.runtimes.store.store import StoredRuntime, find

__all__ = ["TreeStamp"]


@dataclass(frozen=True, slots=True)
class TreeStamp:
    """One build of runtime ``name`` as it was when something was made from it."""

    name: str
    tree_sha256: str
    tree: Path
    device: int
    inode: int

    @classmethod
    def of(cls, stored: StoredRuntime) -> TreeStamp:
        """The stamp of ``stored`` now. Raises OSError when its tree is gone."""
        st = os.stat(stored.tree)
        return cls(
            name=stored.manifest.name,
            tree_sha256=stored.manifest.tree_sha256,
            tree=stored.tree,
            device=st.st_dev,
            inode=st.st_ino,
        )

    def changed(self) -> str | None:
        """Why the store no longer holds this build as it was (None: it does)."""
        try:
            now = find(self.name).manifest.tree_sha256
        except ConfigError as exc:
            return f"runtime {self.name} can no longer be found ({exc})"
        if now != self.tree_sha256:
            return f"runtime {self.name} was rebuilt ({self.tree_sha256[:12]} -> {now[:12]})"
        try:
            st = os.stat(self.tree)
        except OSError:
            return f"the files of runtime {self.name} ({self.tree}) are gone"
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            return f"the files of runtime {self.name} at {self.tree} were replaced"
        return None
