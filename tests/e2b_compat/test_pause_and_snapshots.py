"""Sandboxes that last, through the official SDK: pause and resume by ``connect``, paused
sandboxes in ``list``, ``kill`` of a paused one, ``autoPause`` at the timeout, snapshots (create,
list, start from, delete), ``fork``, ``get_metrics``, each tenant's own, and a paused sandbox
that outlives a restart of the service.

The namespaces rung keeps a sandbox's files when it pauses (its interpreter starts empty on
resume); memory mode is tested on gVisor (test_gvisor.py).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import SandboxException, SandboxNotFoundException, SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService
from tests.service.server import ServiceProcess, add_tenant


def _states(job: str, *, api_key: str | None = None) -> dict[str, SandboxState]:
    opts = {"api_key": api_key} if api_key else {}
    listed = Sandbox.list(query=SandboxQuery(metadata={"job": job}), **opts).next_items()  # type: ignore[arg-type]
    return {s.sandbox_id: s.state for s in listed}


def _events(service: E2BService, key: str, sandbox_id: str) -> set[tuple[str, str]]:
    """The session events of ``sandbox_id`` in the record as the key's tenant sees it."""
    with service.proc.client(key) as client:
        found = set()
        for summary in client.get("/v1/audit", params={"limit": 200}).json():
            if summary["language"] != "session" or summary["session_id"] != sandbox_id:
                continue
            record = client.get(f"/v1/audit/{summary['run_id']}").json()["record"]
            found.add((record["event"], record["by"]))
        return found


def _wait_paused(sandbox_id: str) -> None:
    """Until the sandbox's timeout has paused it (the reaper's event, seen by the API)."""
    deadline = time.monotonic() + 60
    while Sandbox.get_info(sandbox_id).state is not SandboxState.PAUSED:
        if time.monotonic() > deadline:
            pytest.fail("the sandbox was not paused a minute after its timeout")
        time.sleep(0.2)


def test_pause_list_resume_and_kill(e2b_service: E2BService) -> None:
    sbx = Sandbox.create(metadata={"job": "pause"})
    try:
        sbx.files.write("/home/user/kept.txt", "kept across the pause")
        assert sbx.run_code("x = 41\nx").text == "41"
        assert sbx.pause() is True
        assert sbx.pause() is False  # already paused: E2B's 409
        assert not sbx.is_running()
        assert _states("pause") == {sbx.sandbox_id: SandboxState.PAUSED}
        running_only = Sandbox.list(
            query=SandboxQuery(metadata={"job": "pause"}, state=[SandboxState.RUNNING])
        ).next_items()
        assert running_only == []
        info = Sandbox.get_info(sbx.sandbox_id)
        assert (info.state, info.metadata) == (SandboxState.PAUSED, {"job": "pause"})
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}

        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.sandbox_id == sbx.sandbox_id
        assert _states("pause") == {sbx.sandbox_id: SandboxState.RUNNING}
        assert resumed.files.read("/home/user/kept.txt") == "kept across the pause"
        # Files mode (the namespaces rung): the interpreter came back empty.
        lost = resumed.run_code("x")
        assert lost.error is not None and lost.error.name == "NameError"
        # The pause and the resume are entries of the record, the tenant's and no other's.
        assert _events(e2b_service, e2b_service.alice, sbx.sandbox_id) == {
            ("pause", "e2b: tenant alice"),
            ("resume", "e2b: tenant alice"),
        }
        assert _events(e2b_service, e2b_service.bob, sbx.sandbox_id) == set()
        # The object that paused it goes on working: the sandbox kept its access token.
        assert sbx.run_code("6 * 7").text == "42"
        assert sbx.commands.run("cat kept.txt").stdout == "kept across the pause"

        metrics = sbx.get_metrics()
        assert metrics and metrics[-1].mem_total > 0 and metrics[-1].disk_total > 0
        assert metrics[-1].disk_used > 0 and metrics[-1].cpu_count >= 1

        # A paused sandbox is deleted by kill; then it is gone.
        sbx.beta_pause()
        assert sbx.get_metrics() == []
        assert Sandbox.kill(sbx.sandbox_id) is True
        assert Sandbox.kill(sbx.sandbox_id) is False
        assert _states("pause") == {}
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sbx.sandbox_id)
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_the_namespaces_rung_refuses_a_memory_pause(e2b_service: E2BService) -> None:
    with Sandbox.create() as sbx:
        with pytest.raises(SandboxException, match="keeps only its files"):
            sbx.pause(mode="full")
        with pytest.raises(SandboxException, match="keeps only its files"):
            sbx.create_snapshot(mode="full")
        assert sbx.run_code("'still running'").text == "'still running'"
    with pytest.raises(SandboxException, match="does not keep"):
        Sandbox.create(lifecycle={"on_timeout": {"action": "pause", "mode": "full"}})
    with pytest.raises(SandboxException, match="auto_resume is not served"):
        Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True})


def test_the_timeout_pauses_with_auto_pause(e2b_service: E2BService) -> None:
    sbx = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"}, metadata={"job": "auto"})
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sbx.files.write("/home/user/auto.txt", "paused by its timeout")
        _wait_paused(sbx.sandbox_id)
        assert _states("auto") == {sbx.sandbox_id: SandboxState.PAUSED}
        back = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert back.files.read("/home/user/auto.txt") == "paused by its timeout"
        # It keeps its lifecycle: its next timeout pauses it again.
        assert back.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_snapshots_start_sandboxes_and_are_deleted(e2b_service: E2BService) -> None:
    source = Sandbox.create(metadata={"job": "snap-source"})
    started: list[Sandbox] = []
    try:
        source.files.write("/home/user/data.csv", "a,b\n1,2\n")
        snap = source.create_snapshot(name="e2b-snap")
        assert (snap.snapshot_id, snap.names) == ("e2b-snap", ["e2b-snap"])
        unnamed = Sandbox.create_snapshot(source.sandbox_id)
        assert unnamed.snapshot_id.startswith("snapshot-")
        mine = {s.snapshot_id for s in source.list_snapshots().next_items()}
        assert mine == {"e2b-snap", unnamed.snapshot_id}
        named = Sandbox.list_snapshots(name="e2b-snap").next_items()
        assert [s.snapshot_id for s in named] == ["e2b-snap"]
        paged = Sandbox.list_snapshots(limit=1)
        assert len(paged.next_items()) == 1 and paged.has_next
        assert len(paged.next_items()) == 1 and not paged.has_next

        # The source goes on; a sandbox started from the snapshot has its files as they were.
        source.files.write("/home/user/data.csv", "changed after")
        copy = Sandbox.create("e2b-snap", metadata={"job": "snap-copy"})
        started.append(copy)
        assert copy.sandbox_id != source.sandbox_id
        assert copy.files.read("/home/user/data.csv") == "a,b\n1,2\n"
        info = copy.get_info()
        assert (info.template_id, info.metadata) == ("e2b-snap", {"job": "snap-copy"})
        assert copy.run_code("open('data.csv').read()").text == "'a,b\\n1,2\\n'"

        with pytest.raises(SandboxException, match="profiles' names"):
            source.create_snapshot(name="strict")
        assert Sandbox.delete_snapshot("e2b-snap") is True
        assert Sandbox.delete_snapshot("e2b-snap") is False
        assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
        assert Sandbox.list_snapshots().next_items() == []
        # Deleting a snapshot leaves the sandboxes started from it.
        assert copy.run_code("1 + 1").text == "2"
    finally:
        for box in [source, *started]:
            box.kill()


def test_fork_a_running_and_a_paused_sandbox(e2b_service: E2BService) -> None:
    parent = Sandbox.create(metadata={"job": "fork"})
    children: list[Sandbox] = []
    try:
        parent.files.write("/home/user/seed.txt", "from the parent")
        forks = parent.fork(count=2, timeout=120)
        assert all(isinstance(f, Sandbox) for f in forks)
        children += [f for f in forks if isinstance(f, Sandbox)]
        ids = {parent.sandbox_id, *(c.sandbox_id for c in children)}
        assert len(ids) == 3
        for child in children:
            assert child.files.read("/home/user/seed.txt") == "from the parent"
            assert child.get_info().metadata == {"job": "fork"}
        # Each copy is a sandbox of its own.
        children[0].files.write("/home/user/own.txt", "first copy")
        assert not children[1].files.exists("/home/user/own.txt")
        assert not parent.files.exists("/home/user/own.txt")

        # A paused sandbox forks too, and stays paused.
        parent.pause()
        (from_paused,) = Sandbox.fork(parent.sandbox_id, count=1)
        assert isinstance(from_paused, Sandbox)
        children.append(from_paused)
        assert from_paused.files.read("/home/user/seed.txt") == "from the parent"
        assert Sandbox.get_info(parent.sandbox_id).state is SandboxState.PAUSED
        assert _states("fork")[parent.sandbox_id] is SandboxState.PAUSED
    finally:
        for box in [parent, *children]:
            Sandbox.kill(box.sandbox_id)


def test_another_tenant_finds_nothing(e2b_service: E2BService) -> None:
    bob = e2b_service.bob
    sbx = Sandbox.create(metadata={"job": "tenancy"})
    try:
        sbx.create_snapshot(name="alice-only")
        sbx.pause()
        sid = sbx.sandbox_id
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sid, api_key=bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sid, api_key=bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.fork(sid, api_key=bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_metrics(sid, api_key=bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.pause(sid, api_key=bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.create_snapshot(sid, api_key=bob)
        assert Sandbox.kill(sid, api_key=bob) is False
        assert _states("tenancy", api_key=bob) == {}
        assert Sandbox.list_snapshots(api_key=bob).next_items() == []
        assert Sandbox.delete_snapshot("alice-only", api_key=bob) is False
        # Bob's template of that name is no snapshot of his: a fresh sandbox, without the file.
        with Sandbox.create("alice-only", api_key=bob) as his:
            assert his.run_code("import os\nos.listdir('.')").text == "[]"
        # Still alice's, untouched.
        assert _states("tenancy") == {sid: SandboxState.PAUSED}
        assert Sandbox.delete_snapshot("alice-only") is True
    finally:
        Sandbox.kill(sbx.sandbox_id)


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A home with a tenant (room for a memory image), for a service the test starts and stops
    itself."""
    yield tmp_path, add_tenant(tmp_path, "carol", max_stored_bytes=1024 * 1024 * 1024)


@pytest.mark.parametrize(
    ("backend", "mode"), [("namespaces", "filesystem"), ("gvisor", "full")], ids=["files", "memory"]
)
def test_a_paused_sandbox_outlives_a_restart(
    restartable: tuple[Path, str], backend: str, mode: str
) -> None:
    home, key = restartable
    if backend == "gvisor" and shutil.which("runsc") is None:
        pytest.skip("gVisor (runsc) is not installed on this host")
    args = ("--start", "cold", "--backend", backend)
    first = ServiceProcess(home, args=args).start()
    try:
        url = f"{first.url}/e2b"
        sbx = Sandbox.create(
            api_key=key, api_url=url, sandbox_url=url, metadata={"job": "restart"}, timeout=120
        )
        sbx.files.write("/home/user/kept.txt", "across a restart")
        sbx.run_code("x = 'in memory'")
        try:
            sbx.pause(mode=mode)  # type: ignore[arg-type]
        except SandboxException as exc:
            sbx.kill()
            pytest.skip(f"this host's {backend} rung does not pause in {mode} mode: {exc}")
    finally:
        assert first.stop() == -signal.SIGTERM
    second = ServiceProcess(home, args=args).start()
    try:
        url = f"{second.url}/e2b"
        opts = {"api_key": key, "api_url": url, "sandbox_url": url}
        listed = Sandbox.list(**opts).next_items()  # type: ignore[arg-type]
        assert [(s.sandbox_id, s.state) for s in listed] == [(sbx.sandbox_id, SandboxState.PAUSED)]
        assert listed[0].metadata == {"job": "restart"}
        back = Sandbox.connect(sbx.sandbox_id, **opts)  # type: ignore[arg-type]
        assert back.sandbox_id == sbx.sandbox_id
        assert back.files.read("/home/user/kept.txt") == "across a restart"
        # Same token as before the restart: the paused state kept it.
        assert back.traffic_access_token == sbx.traffic_access_token
        kept = back.run_code("x")
        if mode == "full":
            assert kept.text == "'in memory'"
        else:
            assert kept.error is not None and kept.error.name == "NameError"
        assert back.kill() is True
    finally:
        assert second.stop() == -signal.SIGTERM


def test_a_graceful_stop_pauses_auto_pause_sandboxes(restartable: tuple[Path, str]) -> None:
    home, key = restartable
    first = ServiceProcess(home, args=("--start", "cold")).start()
    try:
        url = f"{first.url}/e2b"
        opts = {"api_key": key, "api_url": url, "sandbox_url": url}
        kept = Sandbox.create(lifecycle={"on_timeout": "pause"}, timeout=600, **opts)  # type: ignore[arg-type]
        ended = Sandbox.create(timeout=600, **opts)  # type: ignore[arg-type]
        kept.files.write("/home/user/kept.txt", "paused by the stop")
    finally:
        assert first.stop() == -signal.SIGTERM
    second = ServiceProcess(home, args=("--start", "cold")).start()
    try:
        url = f"{second.url}/e2b"
        opts = {"api_key": key, "api_url": url, "sandbox_url": url}
        listed = Sandbox.list(**opts).next_items()  # type: ignore[arg-type]
        # The one whose timeout pauses it was paused by the stop; the other ended with it.
        assert [(s.sandbox_id, s.state) for s in listed] == [(kept.sandbox_id, SandboxState.PAUSED)]
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(ended.sandbox_id, **opts)  # type: ignore[arg-type]
        back = Sandbox.connect(kept.sandbox_id, **opts)  # type: ignore[arg-type]
        assert back.files.read("/home/user/kept.txt") == "paused by the stop"
        assert back.kill() is True
    finally:
        assert second.stop() == -signal.SIGTERM
