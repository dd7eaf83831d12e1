"""sandcell's data directory on the host: records, artifacts, approvals, the wheel cache.

A module of its own, below everything that stores something, so that no store has to import the
executor (which imports the stores) to find where it lives.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["SHARED_DIR_ENV", "bulk_dir", "data_dir"]

SHARED_DIR_ENV = "SANDCELL_SHARED_DIR"


def data_dir() -> Path:
    """Where records and artifacts live: ``$SANDCELL_HOME``, else the user's data directory."""
    explicit = os.environ.get("SANDCELL_HOME")
    return Path(explicit) if explicit else platformdirs.user_data_path("sandcell")


def bulk_dir(home: Path) -> Path:
    """Where the bulk bytes of ``home`` live: artifacts, uploaded inputs, paused states and
    snapshots, all content-addressed or keyed by fresh ids.

    ``$SANDCELL_SHARED_DIR`` when set (a directory every node and replica of a cluster mounts,
    NFS in production: a run on one node leaves its artifacts where any replica serves them,
    and a state paused on one node resumes on another), else ``home`` itself.
    """
    shared = os.environ.get(SHARED_DIR_ENV)
    return Path(shared).expanduser() if shared else home
