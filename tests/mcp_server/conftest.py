"""Fixtures for the MCP server tests: a fresh data directory, and the SDK (skip without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("mcp.client.stdio", reason="the MCP SDK is not installed (sandcell[tools])")


@pytest.fixture
def mcp_home(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the MCP server tests run real sandboxes as root; this test run is not root")
    home = tmp_path / "home"
    home.mkdir()
    return home
