"""The session contract's one rung fixture: ``rung`` (the rung's name) and ``ex`` (its root
executor, shared with the rest of the suite). See rungs.py.

``ex`` names the namespaces executor on every rung, so tests/conftest.py counts these tests as
sandbox tests (a run where all of them skipped fails where sandboxes are required); it is the
suite's one session-wide executor, built once whatever the rung."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.contract.sessions.rungs import RUNGS, executor_for

from sandcell import Executor


@pytest.fixture(params=RUNGS)
def rung(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ex(
    rung: str,
    executor: Executor,
    ladder_executors: dict[tuple[str, str], Executor],
    root_home: Path,
) -> Executor:
    return executor_for(rung, executor, ladder_executors, root_home)
