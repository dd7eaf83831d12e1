"""The store of conversations waiting for an approval, and the agent state kept in it; the store
runs against both databases (``store_backend``) unless a test is about the SQLite file itself."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from sandcell.agent._task import Task, task_from_state, task_to_state
from sandcell.agent.budget import Budget, Spending
from sandcell.agent.paused import PausedStore, ResumeError
from sandcell.agent.transcript import Attempt, Event
from sandcell.models.base import Message, TokenUsage, ToolCall
from sandcell.policy.profiles import load_profile
from sandcell.spec import Artifact, InputFile

pytestmark = pytest.mark.usefixtures("store_backend")


def _task() -> Task:
    prof = load_profile("strict")
    spend = Spending(Budget(max_steps=7))
    spend.steps, spend.tokens, spend.sandbox_s = (
        2,
        TokenUsage(input_tokens=10, output_tokens=3),
        0.5,
    )
    call = ToolCall(id="c1", name="run_code", arguments='{"code": "print(1)"}')
    return Task(
        question="Rate?",
        profile=prof,
        inputs=(InputFile(host_path=Path("/data/sales.csv"), name="sales.csv"),),
        exports=("out/*.png",),
        limits=prof.limits.defaults,
        schema={"type": "object"},
        invariants=("result['x'] > 0",),
        spend=spend,
        messages=[
            Message(role="system", content="s"),
            Message(role="assistant", content="", tool_calls=(call,)),
        ],
        protocol="native",
        attempts=[
            Attempt(
                index=1,
                step=1,
                language="python",
                code="print(1)\n",
                run_id="r1",
                outcome="ok",
                findings=({"rule_id": "py.x"},),
                artifacts=(
                    Artifact(path="out/a.png", sha256="0" * 64, size=3, media_type="image/png"),
                ),
            )
        ],
        evidence={"r1": ["1\n"]},
        events=[Event(kind="ran", step=1, message="m", attempt=1)],
        failures=1,
        held=True,
        pending_call="c1",
    )


@pytest.mark.store_free
def test_the_state_round_trips() -> None:
    task = _task()
    state = task_to_state(task, model_settings={"name": "openai:m", "api_key_env": "K"})
    back = task_from_state(state, profile=load_profile("analysis"), budget=None)
    assert back.profile.name == "strict"  # the stored profile, loaded again
    assert back.spend.budget == Budget(max_steps=7)
    assert (back.spend.steps, back.spend.tokens, back.spend.sandbox_s) == (
        2,
        task.spend.tokens,
        0.5,
    )
    kept = "question inputs exports limits schema invariants messages protocol attempts evidence"
    for name in (*kept.split(), "events", "failures", "held", "pending_call"):
        assert getattr(back, name) == getattr(task, name), name
    replaced = task_from_state(state, profile=task.profile, budget=Budget(max_steps=9))
    assert replaced.spend.budget.max_steps == 9 and replaced.spend.steps == 2


@pytest.mark.store_free
def test_a_state_it_cannot_read_is_a_resume_error() -> None:
    state = task_to_state(_task(), model_settings={})
    with pytest.raises(ResumeError, match="cannot be read"):
        task_from_state(
            {**state, "messages": [{"role": "robot"}]}, profile=_task().profile, budget=None
        )
    with pytest.raises(ResumeError, match="changed since the question"):
        task_from_state(
            {**state, "profile": {"name": "strict", "source": "builtin:strict", "sha256": "x"}},
            profile=load_profile("analysis"),
            budget=None,
        )


def test_save_get_claim_once(tmp_path: Path) -> None:
    path = tmp_path / "home" / "agent.sqlite3"
    with PausedStore(path) as store:
        saved = store.save("abc123def456", {"question": "q", "spent": {"steps": 3}})
        assert (saved.status, saved.question, saved.steps) == ("waiting", "q", 3)
        assert store.get("ABC123DEF456").approval_id == "abc123def456"
        assert store.claim("abc123def456").status == "resumed"
        with pytest.raises(ResumeError, match="already resumed"):
            store.claim("abc123def456")
        with pytest.raises(ResumeError, match="no conversation waits"):
            store.get("000000000000")


@pytest.mark.sqlite_only
def test_the_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "home" / "agent.sqlite3"
    with PausedStore(path) as store:
        store.save("abc123def456", {"question": "q"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_two_racing_resumes_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite3"
    with PausedStore(path) as store:
        store.save("a1", {"question": "q"})
    wins: list[str] = []
    losses: list[str] = []
    start = threading.Barrier(4)

    def resume() -> None:
        with PausedStore(path) as mine:
            start.wait()
            try:
                mine.claim("a1")
                wins.append("won")
            except ResumeError as exc:
                losses.append(str(exc))

    threads = [threading.Thread(target=resume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 3
    assert all("already resumed" in loss for loss in losses)


@pytest.mark.sqlite_only
def test_a_foreign_database_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "agent.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(ResumeError, match="not a sandcell"):
        PausedStore(path)
