"""The official SDKs' async sandboxes (``AsyncSandbox``) against ``sandcell serve``."""

from __future__ import annotations

import asyncio

import pytest
from e2b import AsyncSandbox as AsyncBaseSandbox
from e2b import (
    CommandExitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from e2b_code_interpreter import AsyncSandbox
from tests.e2b_compat.conftest import E2BService


def test_async_sandbox_runs_code_files_and_commands(e2b_service: E2BService) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(metadata={"mode": "async"})
        try:
            printed: list[str] = []

            async def on_stdout(message: object) -> None:
                printed.append(getattr(message, "line", ""))

            ex = await sbx.run_code("print('streamed')\n2 ** 10", on_stdout=on_stdout)
            assert ex.text == "1024"
            assert printed == ["streamed\n"]
            error = await sbx.run_code("raise ValueError('bad value')")
            assert error.error is not None
            assert (error.error.name, error.error.value) == ("ValueError", "bad value")

            await sbx.files.write("/home/user/notes.txt", "async notes")
            assert await sbx.files.read("/home/user/notes.txt") == "async notes"
            assert await sbx.files.exists("/home/user/notes.txt")
            assert [e.name for e in await sbx.files.list("/home/user")] == ["notes.txt"]
            # The sandbox's own /etc, which strict asks a person about before code reads it.
            with pytest.raises(SandboxException, match="needs approval"):
                await sbx.files.read("/etc/shadow")

            # A context's variables are its own; restarting it empties it.
            ctx = await sbx.create_code_context()
            await sbx.run_code("y = 'ctx'", context=ctx)
            await sbx.run_code("y = 'main'")
            assert (await sbx.run_code("y", context=ctx)).text == "'ctx'"
            await sbx.restart_code_context(ctx)
            emptied = await sbx.run_code("y", context=ctx)
            assert emptied.error is not None and emptied.error.name == "NameError"
            assert (await sbx.run_code("y")).text == "'main'"
            await sbx.remove_code_context(ctx)

            out: list[str] = []
            result = await sbx.commands.run("wc -c < notes.txt", on_stdout=out.append)
            assert result.stdout.strip() == "11"
            assert "".join(out) == result.stdout
            with pytest.raises(CommandExitException) as info:
                await sbx.commands.run("false")
            assert info.value.exit_code == 1
            info_now = await sbx.get_info()
            assert info_now.metadata == {"mode": "async"}
        finally:
            assert await sbx.kill() is True
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.connect(sbx.sandbox_id)

    asyncio.run(main())


def test_async_base_sandbox_and_isolation(e2b_service: E2BService) -> None:
    async def main() -> None:
        sbx = await AsyncBaseSandbox.create()
        try:
            result = await sbx.commands.run("echo base sandbox")
            assert result.stdout == "base sandbox\n"
            with pytest.raises(SandboxNotFoundException):
                await AsyncBaseSandbox.connect(sbx.sandbox_id, api_key=e2b_service.bob)
            assert await AsyncBaseSandbox.kill(sbx.sandbox_id, api_key=e2b_service.bob) is False
        finally:
            await sbx.kill()

    asyncio.run(main())


def test_async_pause_resume_snapshot_fork_and_metrics(e2b_service: E2BService) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(metadata={"job": "async-lasting"})
        others: list[AsyncSandbox] = []
        try:
            await sbx.files.write("/home/user/a.txt", "async kept")
            assert await sbx.pause() is True
            assert await sbx.pause() is False
            query = SandboxQuery(metadata={"job": "async-lasting"})
            listed = await AsyncSandbox.list(query=query).next_items()
            assert [(s.sandbox_id, s.state) for s in listed] == [
                (sbx.sandbox_id, SandboxState.PAUSED)
            ]
            back = await AsyncSandbox.connect(sbx.sandbox_id)
            assert back.sandbox_id == sbx.sandbox_id
            assert await back.files.read("/home/user/a.txt") == "async kept"
            samples = await back.get_metrics()
            assert samples and samples[-1].mem_total > 0

            snap = await back.create_snapshot(name="async-snap")
            names = [s.snapshot_id for s in await AsyncSandbox.list_snapshots().next_items()]
            assert names == ["async-snap"]
            copy = await AsyncSandbox.create(snap.snapshot_id)
            others.append(copy)
            assert await copy.files.read("/home/user/a.txt") == "async kept"
            forks = await back.fork(count=1)
            others += [f for f in forks if isinstance(f, AsyncSandbox)]
            assert len(others) == 2
            assert (await others[1].run_code("open('a.txt').read()")).text == "'async kept'"
            assert await AsyncSandbox.delete_snapshot("async-snap") is True
        finally:
            for box in [sbx, *others]:
                await AsyncSandbox.kill(box.sandbox_id)

    asyncio.run(main())
