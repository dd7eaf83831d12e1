"""A real ``sandcell serve`` shared by the E2B tests, its tenants, and the E2B environment
variables that point the official SDKs at it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.service.server import ServiceProcess, add_tenant


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="the E2B tests run sandboxes as root; run as root")
        for item in items:
            if "tests/e2b_compat/" in str(item.fspath):
                item.add_marker(skip)


@dataclass(frozen=True)
class E2BService:
    proc: ServiceProcess
    alice: str
    """The key of tenant alice (strict profile, the E2B environment's key)."""
    bob: str
    """The key of tenant bob (strict profile)."""

    @property
    def url(self) -> str:
        return f"{self.proc.url}/e2b"


@pytest.fixture(scope="package")
def e2b_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BService]:
    home: Path = tmp_path_factory.mktemp("e2b-home")
    alice = add_tenant(home, "alice", profiles=("strict", "unchecked"), max_concurrent=6)
    bob = add_tenant(home, "bob")
    proc = ServiceProcess(home, args=("--start", "cold")).start()
    yield E2BService(proc=proc, alice=alice, bob=bob)
    assert proc.stop() == -signal.SIGTERM


@pytest.fixture(autouse=True)
def e2b_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the SDKs at the service by environment variables only, as a user would."""
    if "e2b_service" not in request.fixturenames:
        return
    service: E2BService = request.getfixturevalue("e2b_service")
    monkeypatch.setenv("E2B_API_URL", service.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", service.url)
    monkeypatch.setenv("E2B_API_KEY", service.alice)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
