"""A CI-sized soak: a mixed load through the executor and through a real ``sandcell serve``,
then the books (bench/soak.py has the full-sized run and what each check means); on the upper
rungs (gVisor, microVM) the smallest mix that holds every kind, with the same books
(``bench/soak.py --backend gvisor|microvm`` for the full size)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from tests.conftest import backend_unavailable

from sandcell.errors import IsolationUnavailable

RUNS_EXECUTOR = 200
RUNS_SERVICE = 120
CONCURRENCY = 4
RUNS_UPPER = 12
"""The first plan (bench/soak.py ``plan``) with every kind in it: the suite's time is tight."""


def _assert_balanced(figures: dict[str, object], runs: int) -> None:
    assert figures["problems"] == []
    assert figures["requests"] == figures["results"] == figures["records"] == runs
    assert figures["chain_ok"] is True
    left = figures["leftovers"]
    assert isinstance(left, dict)
    assert left == {key: [] for key in left}
    # Every kind of the mix was exercised, so the books cover each outcome.
    kinds = figures["kinds"]
    assert isinstance(kinds, dict)
    assert set(kinds) == {
        "ok",
        "error",
        "timeout",
        "memory_bomb",
        "fork_bomb",
        "output_flood",
        "export",
        "denied",
        "approval",
    }


def _assert_no_runaway_memory(rss_kib: list[int]) -> None:
    """Only gross growth: the first samples include warm-up (imports, pools, caches), so the
    second half of the load is compared with the first, with a wide margin."""
    start, middle, end = rss_kib
    assert start > 0
    assert end - middle <= max(64 * 1024, middle // 2), rss_kib


def test_soak_through_the_executor(soak: ModuleType, private_tmp: Path, tmp_path: Path) -> None:
    figures = soak.soak_executor(tmp_path / "home", RUNS_EXECUTOR, CONCURRENCY)
    print(figures)
    _assert_balanced(figures, RUNS_EXECUTOR)
    _assert_no_runaway_memory(figures["rss_kib"])


def test_soak_through_the_service(soak: ModuleType, private_tmp: Path, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="the service extra is not installed")
    figures = soak.soak_service(tmp_path / "home", RUNS_SERVICE, CONCURRENCY)
    print(figures)
    _assert_balanced(figures, RUNS_SERVICE)
    _assert_no_runaway_memory(figures["rss_kib"])


@pytest.mark.parametrize("backend", ["gvisor", "microvm"])
def test_soak_on_the_upper_rungs(
    soak: ModuleType, private_tmp: Path, tmp_path: Path, backend: str
) -> None:
    try:
        figures = soak.soak_executor(tmp_path / "home", RUNS_UPPER, 2, backend=backend)
    except IsolationUnavailable as exc:
        backend_unavailable(backend, str(exc))
    print(figures)
    _assert_balanced(figures, RUNS_UPPER)


def test_the_leftover_check_sees_a_leftover(soak: ModuleType, private_tmp: Path) -> None:
    """The books above would pass vacuously if the snapshot saw nothing: it does see."""
    import os
    import subprocess

    me = os.getpid()
    before = soak.snapshot(private_tmp, [soak.owner_tag(me)], [me])
    child = subprocess.Popen(["sleep", "30"])
    try:
        (private_tmp / "sandcell-0").mkdir()
        (private_tmp / "sandcell-0" / "run-file").write_text("left")
        left = soak.leftovers(before, soak.snapshot(private_tmp, [soak.owner_tag(me)], [me]))
    finally:
        child.kill()
        child.wait()
    assert [p.split()[0] for p in left["processes"]] == [str(child.pid)]
    assert left["temp"] == ["sandcell-0/run-file"]
