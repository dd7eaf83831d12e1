"""A home deleted or replaced under a running executor (as under ``sandcell serve``): nothing
more runs, with an error that says why, instead of runs whose records go into unlinked files
and are lost at the next start (home_guard.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandcell import Executor, Outcome, RunRequest
from sandcell.errors import AuditError


def test_runs_and_cells_stop_when_the_home_is_deleted(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs sandboxes as root")
    home = tmp_path / "home"
    with Executor(home=home, profile="unchecked") as ex:
        assert ex.run(RunRequest(code="print(1)")).outcome is Outcome.OK
        with ex.session() as s:
            assert s.run("x = 1").outcome is Outcome.OK
            shutil.rmtree(home)
            with pytest.raises(AuditError, match=f"home {home} was deleted"):
                s.run("print(x)")
        with pytest.raises(AuditError, match="records of its runs would be lost"):
            ex.run(RunRequest(code="print(2)"))
        with pytest.raises(AuditError, match="restart sandcell"):
            ex.session()
        home.mkdir()  # another directory at the same path is not the home it opened
        with pytest.raises(AuditError, match=f"home {home} was replaced"):
            ex.run(RunRequest(code="print(3)"))
