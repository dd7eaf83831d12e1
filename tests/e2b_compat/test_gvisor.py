"""One E2B sandbox on the gVisor rung: the same SDK calls, a service started with
``--backend gvisor``."""

from __future__ import annotations

import pytest
from e2b import CommandExitException, SandboxException
from tests.e2b_compat.conftest import gvisor_sandbox


def test_a_sandbox_on_gvisor(gvisor_service: tuple[str, str]) -> None:
    sbx = gvisor_sandbox(gvisor_service)
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
