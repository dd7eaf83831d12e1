"""Background commands, terminals and directory watches through the official SDKs (sync and
async) against ``sandcell serve`` (namespaces rung).

Every wait is for what the test expects to see (a line of output, an event, the end); the
deadline only ends a test whose feature is broken instead of letting it hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import AsyncSandbox as AsyncBaseSandbox
from e2b import (
    CommandExitException,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    SandboxException,
)
from e2b import Sandbox as BaseSandbox
from e2b.sandbox.filesystem.watch_handle import FilesystemEvent
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService, gvisor_sandbox

DEADLINE_S = 60.0
TICKS = "for i in $(seq 1 100000); do echo tick $i; sleep 0.1; done"


@pytest.fixture(scope="module")
def sbx(e2b_service: E2BService) -> Iterator[Sandbox]:
    # Module-scoped: made before the environment variables are set for each test.
    url = e2b_service.url
    sandbox = Sandbox.create(api_key=e2b_service.alice, api_url=url, sandbox_url=url)
    yield sandbox
    sandbox.kill()


def _until(chunks: Iterator[tuple[Any, Any, Any]], needle: str, *, pty: bool = False) -> str:
    """What a handle's iterator gives until ``needle`` shows (stdout, or the terminal's
    bytes)."""
    seen = ""
    deadline = time.monotonic() + DEADLINE_S
    while needle not in seen:
        assert time.monotonic() < deadline, (needle, seen)
        stdout, _, terminal = next(chunks)
        if pty and terminal is not None:
            seen += terminal.decode("utf-8", errors="replace")
        elif not pty and stdout is not None:
            seen += stdout
    return seen


def _events_until(poll: Any, wanted: set[tuple[str, FilesystemEventType]]) -> list[FilesystemEvent]:
    seen: list[FilesystemEvent] = []
    deadline = time.monotonic() + DEADLINE_S
    while not wanted <= {(e.name, e.type) for e in seen}:
        assert time.monotonic() < deadline, (wanted, seen)
        seen += poll()
    return seen


# -- sync -------------------------------------------------------------------------------------


def test_a_background_command_outlives_its_client_and_is_read_from_another(
    sbx: Sandbox,
) -> None:
    handle = sbx.commands.run(TICKS, background=True, timeout=0)
    # The client goes away; the command does not.
    handle.disconnect()
    listed = {p.pid: p for p in sbx.commands.list()}
    assert handle.pid in listed
    mine = listed[handle.pid]
    assert (mine.cmd, mine.args, mine.cwd) == ("/bin/bash", ["-l", "-c", TICKS], "/home/user")

    # A second SDK object for the same sandbox reads it from the start of its output.
    other = BaseSandbox.connect(sbx.sandbox_id)
    reader = other.commands.connect(handle.pid, timeout=0)
    seen = _until(iter(reader), "tick 3\n")
    assert seen.startswith("tick 1\ntick 2\n")

    assert other.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as ended:
        reader.wait()
    assert ended.value.exit_code == 128 + 9
    assert "tick 3\n" in ended.value.stdout
    assert handle.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(handle.pid) is False


def test_output_dropped_before_it_was_read_is_said(sbx: Sandbox) -> None:
    # 3 MB written with no reader: the sandbox keeps the last 1 MiB of it.
    handle = sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' x", background=True)
    handle.disconnect()
    deadline = time.monotonic() + DEADLINE_S
    while handle.pid in {p.pid for p in sbx.commands.list()}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    result = sbx.commands.connect(handle.pid).wait()
    assert result.stdout == "x" * (1024 * 1024)
    dropped = 3_000_000 - 1024 * 1024
    assert f"[sandcell: {dropped} bytes of this process's stdout were dropped" in result.stderr


def test_stdin_reaches_cat_and_closing_it_ends_cat(sbx: Sandbox) -> None:
    cat = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "first line\n")
    sbx.commands.send_stdin(cat.pid, b"second line\n")
    sbx.commands.stream_input(cat.pid, ["third ", b"line\n"])
    sbx.commands.close_stdin(cat.pid)
    result = cat.wait()
    assert (result.exit_code, result.stdout) == (0, "first line\nsecond line\nthird line\n")


def test_a_tagless_pid_that_never_ran_is_not_found(sbx: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sbx.commands.connect(99_999)
    with pytest.raises(SandboxException):
        sbx.commands.send_stdin(99_999, "x")


def test_a_terminal_is_a_tty_and_follows_a_resize(sbx: Sandbox) -> None:
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    chunks = iter(terminal)
    sbx.pty.send_stdin(terminal.pid, b"echo tty=$(tty) size=$(stty size)\n")
    seen = _until(chunks, "size=24 80", pty=True)
    assert "tty=/dev/pts/" in seen
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(terminal.pid, b"echo now=$(stty size)\n")
    _until(chunks, "now=40 120", pty=True)
    assert any(p.pid == terminal.pid for p in sbx.commands.list())
    sbx.pty.send_stdin(terminal.pid, b"exit 0\n")
    assert terminal.wait().exit_code == 0


def test_watch_dir_sees_what_a_command_changes(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched/deeper")
    flat = sbx.files.watch_dir("/home/user/watched")
    deep = sbx.files.watch_dir("/home/user/watched", recursive=True)
    sbx.commands.run("echo one > watched/new.txt && echo two > watched/deeper/low.txt")
    sbx.commands.run("mv watched/new.txt watched/moved.txt && chmod 600 watched/moved.txt")
    seen = _events_until(
        flat.get_new_events,
        {
            ("new.txt", FilesystemEventType.CREATE),
            ("new.txt", FilesystemEventType.WRITE),
            ("new.txt", FilesystemEventType.RENAME),
            ("moved.txt", FilesystemEventType.CREATE),
            ("moved.txt", FilesystemEventType.CHMOD),
        },
    )
    assert not any(e.name.startswith("deeper/") for e in seen)
    _events_until(deep.get_new_events, {("deeper/low.txt", FilesystemEventType.CREATE)})
    sbx.commands.run("rm watched/moved.txt")
    _events_until(flat.get_new_events, {("moved.txt", FilesystemEventType.REMOVE)})
    flat.stop()
    deep.stop()
    with pytest.raises(NotFoundException):
        sbx.files.watch_dir("/home/user/not-there")


def test_a_denied_background_command_starts_nothing_and_says_why(sbx: Sandbox) -> None:
    before = {p.pid for p in sbx.commands.list()}
    with pytest.raises(SandboxException, match=r"denied by profile 'strict'.*sh\.destroy"):
        sbx.commands.run("rm -rf /", background=True)
    with pytest.raises(SandboxException, match=r"needs approval [0-9a-f]+ .*sh\.network"):
        sbx.commands.run("curl http://example.com", background=True)
    assert {p.pid for p in sbx.commands.list()} == before


def test_a_background_command_is_a_run_of_the_tenant(e2b_service: E2BService) -> None:
    with Sandbox.create() as box:
        handle = box.commands.run("echo in the record", background=True)
        assert handle.wait().stdout == "in the record\n"
        sandbox_id = box.sandbox_id
    with e2b_service.proc.client(e2b_service.alice) as client:
        records = client.get("/v1/audit", params={"limit": 100}).json()
        bash = [r for r in records if r["session_id"] == sandbox_id and r["language"] == "bash"]
        assert len(bash) == 2, bash  # its start, and its end (newest first)
        end, start = (client.get(f"/v1/audit/{r['run_id']}").json()["record"] for r in bash)
        assert start["code"] == end["code"] == "echo in the record"
        assert start["reason"] == f"started in the background as pid {handle.pid}"
        # What it printed and how it ended are in the record, as a foreground command's were.
        assert (end["outcome"], end["exit_code"], end["stdout"]) == ("ok", 0, "in the record\n")
        assert end["reason"].endswith(f"(started by run {start['run_id']})")


def test_a_commands_timeout_ends_it(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 600", background=True, timeout=1)
    with pytest.raises(SandboxException):
        handle.wait()
    # Killed at its timeout, as envd does, not only left by its stream.
    deadline = time.monotonic() + DEADLINE_S
    while handle.pid in {p.pid for p in sbx.commands.list()}:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_memory_pause_keeps_a_background_command(gvisor_service: tuple[str, str]) -> None:
    url, key = gvisor_service
    sbx = gvisor_sandbox(gvisor_service)
    try:
        handle = sbx.commands.run(TICKS, background=True, timeout=0)
        handle.disconnect()
        _until(iter(sbx.commands.connect(handle.pid, timeout=0)), "tick 2\n")
        try:
            sbx.pause(mode="full")
        except SandboxException as exc:
            if "keeps only its files" in str(exc) or "memory" in str(exc).lower():
                pytest.skip(f"this host's gVisor rung does not pause with memory: {exc}")
            raise
        back = Sandbox.connect(sbx.sandbox_id, api_key=key, api_url=url, sandbox_url=url)
        # The same process, its output kept, and it goes on counting.
        assert handle.pid in {p.pid for p in back.commands.list()}
        chunks = iter(back.commands.connect(handle.pid, timeout=0))
        seen = _until(chunks, "tick 1\n")
        last = int(seen.strip().split("\n")[-1].split()[-1])
        _until(chunks, f"tick {last + 5}\n")
        assert back.commands.kill(handle.pid) is True
    finally:
        Sandbox.kill(sbx.sandbox_id, api_key=key, api_url=url)


# -- async ------------------------------------------------------------------------------------


def test_async_background_pty_stdin_and_watch(e2b_service: E2BService) -> None:
    async def main() -> None:
        sbx = await AsyncBaseSandbox.create()
        try:
            lines: list[str] = []
            ticks = await sbx.commands.run(
                TICKS, background=True, timeout=0, on_stdout=lines.append
            )
            other = await AsyncBaseSandbox.connect(sbx.sandbox_id)
            assert ticks.pid in {p.pid for p in await other.commands.list()}
            await _wait_for(lambda: "tick 2\n" in "".join(lines))
            assert await other.commands.kill(ticks.pid) is True
            with pytest.raises(CommandExitException):
                await ticks.wait()

            cat = await sbx.commands.run("cat", background=True, stdin=True)
            await sbx.commands.send_stdin(cat.pid, "to cat\n")
            await sbx.commands.close_stdin(cat.pid)
            assert (await cat.wait()).stdout == "to cat\n"

            screen = bytearray()
            terminal = await sbx.pty.create(
                PtySize(rows=24, cols=80), on_data=screen.extend, timeout=0
            )
            await sbx.pty.send_stdin(terminal.pid, b"echo tty=$(tty)\n")
            await _wait_for(lambda: b"tty=/dev/pts/" in screen)
            await sbx.pty.resize(terminal.pid, PtySize(rows=50, cols=132))
            await sbx.pty.send_stdin(terminal.pid, b"echo size=$(stty size)\n")
            await _wait_for(lambda: b"size=50 132" in screen)
            assert await sbx.pty.kill(terminal.pid) is True

            events: list[FilesystemEvent] = []
            await sbx.files.make_dir("/home/user/seen")
            watch = await sbx.files.watch_dir("/home/user/seen", events.append, timeout=0)
            await sbx.commands.run("echo hi > seen/made.txt")
            await _wait_for(
                lambda: (
                    ("made.txt", FilesystemEventType.CREATE) in {(e.name, e.type) for e in events}
                )
            )
            await watch.stop()

            with pytest.raises(SandboxException, match="denied by profile 'strict'"):
                await sbx.commands.run("rm -rf /", background=True)
        finally:
            await sbx.kill()

    asyncio.run(main())


async def _wait_for(ready: Any) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
