"""sandcell's data directory on the host: records, artifacts, approvals, the wheel cache.

A module of its own, below everything that stores something, so that no store has to import the
executor (which imports the stores) to find where it lives.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["data_dir"]


def data_dir() -> Path:
    """Where records and artifacts live: ``$SANDCELL_HOME``, else the user's data directory."""
    explicit = os.environ.get("SANDCELL_HOME")
    return Path(explicit) if explicit else platformdirs.user_data_path("sandcell")
