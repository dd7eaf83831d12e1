"""``Sandbox.list`` with E2B's query (order, startedAfter, template, cursor pages), a shorter
``set_timeout``, and a ``run_code`` whose sandbox ends under it, through the official SDK."""

from __future__ import annotations

import uuid

import pytest
from e2b import SandboxNotFoundException, SandboxQuery, TimeoutException
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService


def _ids(query: SandboxQuery, **kwargs: object) -> list[str]:
    paginator = Sandbox.list(query=query, **kwargs)  # type: ignore[arg-type]
    found: list[str] = []
    while paginator.has_next:
        found += [s.sandbox_id for s in paginator.next_items()]
    return found


def test_list_orders_and_filters_by_start_and_template(e2b_service: E2BService) -> None:
    job = {"job": uuid.uuid4().hex}
    first = Sandbox.create(metadata=job)
    second = Sandbox.create(template="unchecked", metadata=job)
    third = Sandbox.create(metadata=job)
    made = [first, second, third]
    try:
        ids = [s.sandbox_id for s in made]
        assert _ids(SandboxQuery(metadata=job)) == ids
        assert _ids(SandboxQuery(metadata=job), order="desc") == ids[::-1]
        assert _ids(SandboxQuery(metadata=job, template="unchecked")) == [second.sandbox_id]
        since = second.get_info().started_at
        assert _ids(SandboxQuery(metadata=job, started_after=since)) == ids[1:]
    finally:
        for sbx in made:
            sbx.kill()


def test_pages_go_on_after_a_sandbox_that_ended_meanwhile(e2b_service: E2BService) -> None:
    job = {"job": uuid.uuid4().hex}
    made = [Sandbox.create(metadata=job) for _ in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata=job), limit=2)
        first_page = [s.sandbox_id for s in paginator.next_items()]
        assert first_page == [s.sandbox_id for s in made[:2]]
        # With an offset for a token, the third would now be skipped.
        made[0].kill()
        assert paginator.has_next
        assert [s.sandbox_id for s in paginator.next_items()] == [made[2].sandbox_id]
        assert not paginator.has_next
    finally:
        for sbx in made:
            sbx.kill()


def test_a_shorter_timeout_ends_the_sandbox_and_the_cell_running_in_it(
    e2b_service: E2BService,
) -> None:
    sbx = Sandbox.create(timeout=600)

    def on_stdout(message: object) -> None:
        if "ready" in str(getattr(message, "line", "")):
            sbx.set_timeout(1)

    # The cell would sleep 10 minutes: only the timeout, once it passes, ends it.
    with pytest.raises(TimeoutException, match="killed while the request was in progress"):
        sbx.run_code(
            "import time\nprint('ready', flush=True)\ntime.sleep(600)", on_stdout=on_stdout
        )
    assert not sbx.is_running()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_run_code_in_a_sandbox_killed_meanwhile_raises_the_sdks_timeout(
    e2b_service: E2BService,
) -> None:
    sbx = Sandbox.create()

    def on_stdout(message: object) -> None:
        if "ready" in str(getattr(message, "line", "")):
            assert Sandbox.kill(sbx.sandbox_id) is True

    with pytest.raises(TimeoutException, match="killed while the request was in progress"):
        sbx.run_code(
            "import time\nprint('ready', flush=True)\ntime.sleep(600)", on_stdout=on_stdout
        )
    assert not sbx.is_running()
