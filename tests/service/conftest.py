"""A service process shared by a module's tests, and the tenants it knows."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.service.server import ServiceProcess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="the service tests run sandboxes as root; run as root")
        for item in items:
            if "tests/service/" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-home")


@pytest.fixture(scope="module")
def service(home: Path) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(home, args=("--start", "cold", "--max-body-mb", "1")).start()
    yield proc
    assert proc.stop() == -signal.SIGTERM
