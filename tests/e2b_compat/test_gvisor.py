"""One E2B sandbox on the gVisor rung: the same SDK calls, a service started with
``--backend gvisor``."""

from __future__ import annotations

import pytest
from e2b import CommandExitException, SandboxException, SandboxState
from e2b_code_interpreter import Sandbox
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


def test_a_gvisor_sandbox_pauses_with_its_memory(gvisor_service: tuple[str, str]) -> None:
    url, key = gvisor_service
    sbx = gvisor_sandbox(gvisor_service)
    try:
        assert sbx.run_code("x = 41\nimport random\nx").text == "41"
        sbx.files.write("/home/user/g.txt", "kept on gvisor")
        ctx = sbx.create_code_context()
        sbx.run_code("y = 'in the context'", context=ctx)
        try:
            assert sbx.pause(mode="full") is True
        except SandboxException as exc:
            if "keeps only its files" in str(exc) or "memory" in str(exc).lower():
                pytest.skip(f"this host's gVisor rung does not pause with memory: {exc}")
            raise
        info = Sandbox.get_info(sbx.sandbox_id, api_key=key, api_url=url)
        assert info.state is SandboxState.PAUSED
        back = Sandbox.connect(sbx.sandbox_id, api_key=key, api_url=url, sandbox_url=url)
        # Memory mode: the interpreter's variables, its code contexts and the files are back.
        assert back.run_code("x + 1").text == "42"
        assert back.run_code("y", context=ctx).text == "'in the context'"
        assert back.files.read("/home/user/g.txt") == "kept on gvisor"
        # A copy with its memory, too.
        (child,) = back.fork(count=1)
        assert isinstance(child, Sandbox)
        try:
            assert child.run_code("x * 2").text == "82"
        finally:
            child.kill()
    finally:
        Sandbox.kill(sbx.sandbox_id, api_key=key, api_url=url)
