"""Curated runtimes: locked package sets built into separate, content-addressed environments.

``locks`` reads the lock files (three ship with sandcell), ``build`` installs one into a tree and
stores it by its hash, ``store`` finds and verifies a built runtime, ``tree`` hashes one.
``sandcell.runtimes`` turns a stored runtime into what a sandbox mounts.
"""

from sandcell.runtimes.store.build import build
from sandcell.runtimes.store.locks import SHIPPED, Lock, load_lock, shipped_lock
from sandcell.runtimes.store.store import (
    RuntimeManifest,
    StoredRuntime,
    find,
    list_runtimes,
    runtimes_dir,
    verify,
)

__all__ = [
    "SHIPPED",
    "Lock",
    "RuntimeManifest",
    "StoredRuntime",
    "build",
    "find",
    "list_runtimes",
    "load_lock",
    "runtimes_dir",
    "shipped_lock",
    "verify",
]
