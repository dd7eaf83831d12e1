"""Packages beyond the runtime: a local wheel cache prepared ahead of time, and the resolution of
a run's imports against the runtime, that cache and the profile's ``allowed_packages``.

Installing a package is running code, so nothing is installed while a run runs. The runtime's
own packages are pinned (:func:`write_runtime_lock` records them, :func:`check_runtime_lock`
reports drift). A package outside the runtime is added ahead of time, on the host, where the
network is allowed: :meth:`WheelCache.prepare` downloads the wheel of an exact pin (never an
sdist: building one runs its code), hashes it, checks it names what was asked for, extracts its
importable part into its own directory and records it in ``lock.json``. A run that imports it
gets that directory mounted read-only, only if its profile lists the package; any other import
of something absent is denied with a ``py.package`` finding (:func:`resolve_packages`).

This module is the public face of four parts, one job each: reading and unpacking one wheel
safely (:mod:`sandcell.packages.wheels`), the cache and its lock
(:mod:`sandcell.packages.wheel_cache`), the runtime's own packages and pins
(:mod:`sandcell.packages.runtime_lock`), and the resolution of a run's imports
(:mod:`sandcell.packages.resolution`).
"""

from __future__ import annotations

from sandcell.packages.resolution import Resolution, imports_of, resolve_packages
from sandcell.packages.runtime_lock import (
    check_runtime_lock,
    runtime_distributions,
    runtime_imports,
    write_runtime_lock,
)
from sandcell.packages.wheel_cache import CachedPackage, WheelCache
from sandcell.packages.wheels import normalize_name

__all__ = [
    "CachedPackage",
    "Resolution",
    "WheelCache",
    "check_runtime_lock",
    "imports_of",
    "normalize_name",
    "resolve_packages",
    "runtime_distributions",
    "runtime_imports",
    "write_runtime_lock",
]
