"""Two run records compared field by field (no sandbox needed: the records are built here)."""

from __future__ import annotations

import hashlib

from sandcell.replay import compare_records
from sandcell.replay.compare import MAX_DIFF_LINES


def _record(stdout: str, **extra: object) -> dict[str, object]:
    return {
        "outcome": "ok",
        "exit_code": 0,
        "signal": None,
        "stdout": stdout,
        "stdout_sha256": hashlib.sha256(stdout.encode()).hexdigest(),
        "stderr": "",
        "stderr_sha256": hashlib.sha256(b"").hexdigest(),
        "artifacts": [],
        "runtime": {"sha256": "r1"},
        "backend": {"name": "namespaces"},
        "inputs": [],
        **extra,
    }


def test_equal_records_match() -> None:
    comparison = compare_records(_record("a\n"), _record("a\n"))
    assert comparison.matched and comparison.differing == ()


def test_long_stdout_diff_is_cut_and_counted() -> None:
    a = "".join(f"line {i}\n" for i in range(100))
    b = "".join(f"line {i} changed\n" for i in range(100))
    comparison = compare_records(_record(a), _record(b))
    [stdout] = [c for c in comparison.checks if c.field == "stdout"]
    assert not stdout.matched
    assert len(stdout.diff) == MAX_DIFF_LINES + 1
    assert stdout.diff[-1].endswith("more diff lines")


def test_same_text_other_bytes_is_still_a_difference() -> None:
    other = {**_record("x"), "stdout_sha256": "f" * 64}
    comparison = compare_records(_record("x"), other)
    assert comparison.differing == ("stdout",)
    [stdout] = [c for c in comparison.checks if c.field == "stdout"]
    assert stdout.diff == ("(the recorded text is the same; the raw bytes differ)",)


def test_artifacts_added_removed_and_changed() -> None:
    def art(path: str, digest: str) -> dict[str, object]:
        return {"path": path, "sha256": digest * 64}

    a = _record("", artifacts=[art("keep", "a"), art("gone", "b"), art("edit", "c")])
    b = _record("", artifacts=[art("keep", "a"), art("new", "d"), art("edit", "e")])
    comparison = compare_records(a, b)
    [artifacts] = [c for c in comparison.checks if c.field == "artifacts"]
    assert artifacts.diff == (
        "only in the original: gone",
        "only in the replay: new",
        f"changed: edit (sha256 {'c' * 12} -> {'e' * 12})",
    )


def test_context_differences_do_not_count_as_result_differences() -> None:
    comparison = compare_records(_record("x"), _record("x", backend={"name": "gvisor"}))
    assert comparison.matched
    [backend] = [c for c in comparison.context if c.field == "backend.name"]
    assert not backend.matched and backend.replay == "gvisor"


def test_rich_outputs_differ_by_their_text() -> None:
    def shown(value: str) -> dict[str, object]:
        return {"kind": "value", "data": {"text/plain": value}, "artifacts": []}

    comparison = compare_records(
        _record("", outputs=[shown("1")]), _record("", outputs=[shown("2"), shown("3")])
    )
    assert comparison.differing == ("outputs",)
    [outputs] = [c for c in comparison.checks if c.field == "outputs"]
    assert outputs.diff[-1] == "original has 1 output(s), replay 2"
    assert outputs.diff[0].startswith("#0: original value ")
