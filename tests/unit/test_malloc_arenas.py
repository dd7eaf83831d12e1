"""A replica's malloc arenas (sandcell.cluster.malloc_arenas): with the limit, threads share at
most that many; without it, glibc gives each new thread one (what let a replica's resident
memory grow under load). Each case in a fresh process: the limit holds for the process's life."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

_PROGRAM = """
import ctypes, ctypes.util, sys, threading
from sandcell.cluster.malloc_arenas import limit_malloc_arenas
if sys.argv[1] == "limit":
    assert limit_malloc_arenas(2)
barrier = threading.Barrier(8)
kept = []
def work():
    kept.append(bytearray(100_000))  # from malloc (over pymalloc's sizes, under mmap's)
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()
"""


def _arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))


def test_threads_share_at_most_the_limit_of_arenas() -> None:
    unlimited = _arenas("none")
    if unlimited == 0:
        pytest.skip("the C library is not glibc (no malloc_stats arenas)")
    assert unlimited > 2
    assert _arenas("limit") <= 2
