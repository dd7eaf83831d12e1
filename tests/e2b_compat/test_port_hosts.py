"""E2B's ``get_host(port)`` against a real ``sandcell serve``, with the official SDK unchanged:
the name it returns (``PORT-SANDBOXID.<domain>``) sent as the Host of a request to the service
reaches the server the sandbox's program started, with the sandbox's traffic token, only on
the template profile's ``[ingress] ports``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b_code_interpreter import Sandbox
from tests.contract.sessions.test_ports import SERVE
from tests.service.server import ServiceProcess, add_tenant

PROFILE = """
approval = "never"
[ingress]
ports = [8000, 8001]
[runtime]
allowed_imports = ["*"]
[checks]
disabled = ["py.network", "py.import", "py.subprocess", "py.process"]
"""


@pytest.fixture(scope="module")
def ports_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A service whose tenant may use the profile ``web-ports``: its URL and the key."""
    home: Path = tmp_path_factory.mktemp("e2b-ports-home")
    (home / "profiles").mkdir()
    (home / "profiles" / "web-ports.toml").write_text(PROFILE)
    key = add_tenant(home, "porter", profiles=("web-ports", "strict"))
    proc = ServiceProcess(home, args=("--start", "cold")).start()
    yield proc.url, key
    assert proc.stop() == -signal.SIGTERM


def test_get_host_reaches_the_sandboxs_server(ports_service: tuple[str, str]) -> None:
    url, key = ports_service
    sbx = Sandbox.create(
        template="web-ports", api_key=key, api_url=f"{url}/e2b", sandbox_url=f"{url}/e2b"
    )
    try:
        served = sbx.run_code(SERVE.format(body="from-e2b", port=8000))
        assert served.error is None and "serving" in "".join(served.logs.stdout), served
        host = sbx.get_host(8000)
        assert host.startswith(f"8000-{sbx.sandbox_id}."), host
        token = sbx.traffic_access_token
        assert token, "the create answer carries a traffic token"
        with httpx.Client(base_url=url, timeout=60) as web:
            got = web.get("/page.txt", headers={"Host": host, "E2B-Traffic-Access-Token": token})
            assert got.status_code == 200 and got.text == "from-e2b\n", got.text
            # No token, a wrong one: refused before anything reaches the sandbox.
            assert web.get("/page.txt", headers={"Host": host}).status_code == 401
            wrong = {"Host": host, "X-Access-Token": "not-the-token"}
            assert web.get("/page.txt", headers=wrong).status_code == 401
            closed = web.get("/", headers={"Host": sbx.get_host(8001), "X-Access-Token": token})
            assert closed.status_code == 502 and "nothing accepted" in closed.text, closed.text
            unlisted = web.get("/", headers={"Host": sbx.get_host(9000), "X-Access-Token": token})
            assert unlisted.status_code == 403, unlisted.text
            # Any other host is the service as before.
            assert web.get("/healthz").status_code == 200
    finally:
        sbx.kill()
    with httpx.Client(base_url=url, timeout=60) as web:
        gone = web.get("/page.txt", headers={"Host": host, "X-Access-Token": token})
        assert gone.status_code == 502, gone.text
