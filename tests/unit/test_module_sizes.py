"""The floor plan's size rule: no module of the package passes 800 lines.

A module past that size has become a hallway (several jobs behind one name): split it by job
rather than raise the limit. The executor in particular is a thin surface over the run pipeline.
"""

from __future__ import annotations

from pathlib import Path

import sandcell

MAX_LINES = 800
EXECUTOR_MAX_LINES = 400
PACKAGE = Path(sandcell.__file__).resolve().parent


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_no_module_passes_800_lines() -> None:
    sizes = {p.relative_to(PACKAGE).as_posix(): _lines(p) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 100, "the package's modules were not found"
    over = {name: n for name, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"


def test_the_executor_stays_a_thin_surface() -> None:
    n = _lines(PACKAGE / "executor.py")
    assert n < EXECUTOR_MAX_LINES, f"executor.py has {n} lines; the pipeline lives in its package"
