"""Shared by the adapter tests: the frameworks' own event loops are closed after each test."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _close_the_frameworks_loop() -> Iterator[None]:
    """pydantic-ai's ``run_sync`` (and smolagents) keep an event loop set on the main thread and
    never close it; left open, it is garbage-collected in whatever test runs next, where its
    ResourceWarning (an error here) can even land inside an ``ast.parse`` and break it."""
    yield
    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = policy.get_event_loop()
        except RuntimeError:  # none is set (a loop was set and then unset before)
            return
    if not loop.is_running():
        loop.close()
    policy.set_event_loop(None)
