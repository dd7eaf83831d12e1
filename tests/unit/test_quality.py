"""The gates: ruff and mypy --strict are clean, and the public API is what ``__all__`` says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sandcell

from .background import Check, result, started_early

REPO = Path(__file__).resolve().parents[2]

MYPY = Check("mypy --strict", lambda: [sys.executable, "-m", "mypy"], cwd=REPO)
"""A minute of CPU in a fresh clone (no cache yet): started when the suite is collected."""


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", name, *args], cwd=REPO, capture_output=True, text=True, check=False
    )


def test_ruff_is_clean() -> None:
    r = _tool("ruff", "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean() -> None:
    r = _tool("ruff", "format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


@started_early(MYPY)
def test_mypy_strict_is_clean() -> None:
    r = result(MYPY)
    assert r.returncode == 0, r.stdout + r.stderr


def test_public_api_matches_all() -> None:
    public = {n for n in dir(sandcell) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(sandcell, n)).__name__ == "module"}
    assert set(sandcell.__all__) == public - modules
    for name in sandcell.__all__:
        assert getattr(sandcell, name) is not None
