"""One E2B sandbox on the gVisor rung: the same SDK calls, a service started with
``--backend gvisor``."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator

import pytest
from e2b import CommandExitException, SandboxException
from e2b_code_interpreter import Sandbox
from tests.service.server import ServiceProcess, add_tenant


@pytest.fixture(scope="module")
def gvisor_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    if shutil.which("runsc") is None:
        pytest.skip("gVisor (runsc) is not installed on this host")
    home = tmp_path_factory.mktemp("e2b-gvisor-home")
    key = add_tenant(home, "alice")
    proc = ServiceProcess(home, args=("--start", "cold", "--backend", "gvisor")).start()
    yield f"{proc.url}/e2b", key
    assert proc.stop() == -signal.SIGTERM


def test_a_sandbox_on_gvisor(gvisor_service: tuple[str, str]) -> None:
    url, key = gvisor_service
    try:
        sbx = Sandbox.create(api_key=key, api_url=url, sandbox_url=url)
    except SandboxException as exc:
        if "gvisor" in str(exc).lower() and ("unavailable" in str(exc) or "503" in str(exc)):
            pytest.skip(f"gVisor is not usable on this host: {exc}")
        raise
    try:
        # gVisor's own kernel answers (its sentry reports release 4.4.0), not the host's.
        assert sbx.run_code("import platform\nplatform.release()").text == "'4.4.0'"
        sbx.files.write("/home/user/g.txt", "on gvisor")
        assert sbx.commands.run("cat g.txt").stdout == "on gvisor"
        assert sbx.files.read("/home/user/g.txt") == "on gvisor"
        with pytest.raises(CommandExitException):
            sbx.commands.run("exit 2")
        # gVisor's file systems hold no user extended attributes: metadata is refused, saying
        # so, and no file is left behind (on namespaces it is kept: test_files_anywhere).
        with pytest.raises(SandboxException, match="could not keep the file's metadata"):
            sbx.files.write("/home/user/m.txt", "m", metadata={"k": "v"})
        assert not sbx.files.exists("/home/user/m.txt")
        # Paths outside the workspace are gVisor's own.
        sbx.files.write("/tmp/g.txt", "tmp")
        assert sbx.commands.run("cat /tmp/g.txt").stdout == "tmp"
    finally:
        sbx.kill()
