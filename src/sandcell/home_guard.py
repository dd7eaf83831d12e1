"""An executor writes its records only into the data directory it opened.

A long-lived process (``sandcell serve``) whose home is deleted, or replaced by another
directory at the same path, kept running and writing: each run's record, artifact and approval
went into files already unlinked, lost at the next start, while every answer looked normal. A
run whose record cannot be kept must not start, so each run and session checks first that the
home is still the directory it opened (same device and inode); when it is not, the run is
refused with :class:`~sandcell.errors.AuditError`, which says to restart on a home that exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import AuditError

__all__ = ["HomeGuard"]


@dataclass(frozen=True, slots=True)
class HomeGuard:
    """The home directory as it was opened."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> HomeGuard:
        """The guard of ``path``, which exists (the stores were just opened in it)."""
        st = os.stat(path)
        return cls(path=path, device=st.st_dev, inode=st.st_ino)

    def check(self) -> None:
        """Raise AuditError when the home is gone or is another directory now."""
        try:
            st = os.stat(self.path)
        except OSError:
            why = "was deleted"
        else:
            if (st.st_dev, st.st_ino) == (self.device, self.inode):
                return
            why = "was replaced by another directory"
        raise AuditError(
            f"the sandcell home {self.path} {why} while this process ran: the records of its "
            "runs would be lost, so nothing runs; restart sandcell (the service: sandcell serve) "
            "on a home that exists"
        )
