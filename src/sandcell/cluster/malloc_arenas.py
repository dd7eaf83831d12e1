"""Fewer malloc arenas in a replica: its resident memory then stays flat under load.

A replica on a cluster is a Ray driver: Ray's core worker adds a few dozen native threads to the
service's own, and glibc gives threads their own malloc arenas (up to eight per core). Memory
freed in one arena is not reused by a thread allocating from another, so under a steady load
the resident size of a replica kept growing while the Python heap stayed flat: about 15 KiB per
run over 2,000 runs through the cluster (bench/soak_cluster.py: +27 MiB over the second half of
10,000 runs), and flat at two arenas. Set once, before Ray's threads start; the arenas already
made stay. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["ARENAS", "limit_malloc_arenas"]

ARENAS = 2
_M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most arenas (``<malloc.h>``)."""


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Ask glibc for at most ``arenas`` malloc arenas; whether it took it (False where the C
    library is not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc: its allocator is not arena-per-thread the same way
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))
