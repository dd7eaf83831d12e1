"""A real ``sandcell serve`` shared by the E2B tests, its tenants, and the E2B environment
variables that point the official SDKs at it."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox
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


@pytest.fixture(scope="package")
def gvisor_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A second service, on the gVisor rung: its E2B URL and tenant alice's key."""
    if shutil.which("runsc") is None:
        pytest.skip("gVisor (runsc) is not installed on this host")
    home = tmp_path_factory.mktemp("e2b-gvisor-home")
    # Room for a paused sandbox's memory (tens of MB) in its stored bytes.
    key = add_tenant(home, "alice", max_stored_bytes=1024 * 1024 * 1024)
    proc = ServiceProcess(home, args=("--start", "cold", "--backend", "gvisor")).start()
    yield f"{proc.url}/e2b", key
    assert proc.stop() == -signal.SIGTERM


def gvisor_sandbox(gvisor_service: tuple[str, str]) -> Sandbox:
    """A sandbox of the gVisor service; a skip, saying why, where this host cannot run gVisor."""
    url, key = gvisor_service
    try:
        return Sandbox.create(api_key=key, api_url=url, sandbox_url=url)
    except SandboxException as exc:
        if "gvisor" in str(exc).lower() and ("unavailable" in str(exc) or "503" in str(exc)):
            pytest.skip(f"gVisor is not usable on this host: {exc}")
        raise


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
