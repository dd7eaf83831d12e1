"""Starts the whole-program checks of the selected unit tests as soon as collection ends (see
background.py), and kills those no test read when pytest ends."""

from __future__ import annotations

import pytest

from . import background


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        background.start_declared(session.items)


def pytest_unconfigure(config: pytest.Config) -> None:
    background.stop_all()
