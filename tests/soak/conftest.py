"""The soak driver (bench/soak.py) loaded as a module, and a private TMPDIR for each test, so
that whatever sandcell leaves in the temp directory is exactly what the test finds there."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sandcell_bench_soak", REPO / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def soak() -> ModuleType:
    if os.geteuid() != 0:
        pytest.skip("the soak tests run sandboxes as root; run as root")
    return _load_soak()


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short, right under /tmp: the microVM backend's Unix sockets live in run directories under
    # TMPDIR, and a socket path must fit in 107 bytes (pytest's tmp_path is too deep for that).
    tmp = Path(tempfile.mkdtemp(prefix="sc-soak-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
