"""``result_from_dict`` rebuilds exactly the result ``result_to_dict`` wrote (the client SDK
reads results from the service's JSON with it)."""

from __future__ import annotations

import json

import pytest

from sandcell.errors import ConfigError
from sandcell.spec import (
    Artifact,
    DisplayOutput,
    Enforcement,
    IsolationMode,
    Outcome,
    RejectedExport,
    RunResult,
    RuntimeRef,
    StartInfo,
    Usage,
    result_from_dict,
    result_to_dict,
)

_PNG = Artifact(path="display/0001.png", sha256="b" * 64, size=10, media_type="image/png")


def _full() -> RunResult:
    """A result with every field set to something other than its default."""
    return RunResult(
        run_id="r1",
        outcome=Outcome.INVALID_OUTPUT,
        exit_code=3,
        signal=None,
        stdout="out ✓\n",
        stderr="err\n",
        stdout_truncated=True,
        stderr_truncated=False,
        usage=Usage(wall_ms=12.5, cpu_ms=7.25, peak_memory_bytes=1 << 20),
        artifacts=(Artifact(path="a.csv", sha256="a" * 64, size=3, media_type="text/csv"),),
        rejected_exports=(RejectedExport(path="big.bin", reason="over the size limit"),),
        enforcement=Enforcement(
            backend="namespaces",
            layers={"seccomp": "bpf, 45 syscalls", "cgroup": "v1"},
            mode=IsolationMode.RLIMITS,
            weakened=("memory",),
        ),
        reason="the result failed validation",
        started_at="2026-12-01T00:00:00.000000+00:00",
        policy={"profile": {"name": "strict"}, "findings": [{"rule": "x"}]},
        validation={"valid": False, "errors": ["bad"], "value": {"n": 1}},
        leaks=({"kind": "aws", "stream": "stdout", "line": 1, "preview": "AKIA…"},),
        outputs=(
            DisplayOutput(kind="value", data={"text/plain": "42"}),
            DisplayOutput(kind="figure", data={"text/plain": "<Figure>"}, artifacts=(_PNG,)),
        ),
        start=StartInfo(mode="pool", template="t1", preloaded=("numpy",), wait_ms=1.5),
        session_id="s1",
        network={"connections": [], "totals": {"bytes": 0}},
        tools={"calls": [{"tool": "search"}]},
        runtime=RuntimeRef(name="datascience", tree_sha256="c" * 64, lock_sha256="d" * 64),
    )


@pytest.mark.parametrize(
    "result",
    [
        _full(),
        RunResult(
            run_id="r2",
            outcome=Outcome.DENIED,
            exit_code=None,
            signal=9,
            stdout="",
            stderr="",
            stdout_truncated=False,
            stderr_truncated=False,
            usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
            artifacts=(),
            rejected_exports=(),
            enforcement=None,
        ),
    ],
)
def test_round_trip_through_json(result: RunResult) -> None:
    as_json = json.loads(json.dumps(result_to_dict(result)))
    assert result_from_dict(as_json) == result
    assert result_to_dict(result_from_dict(as_json)) == as_json


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"outcome": "exploded"}, "'exploded' is not a valid Outcome"),
        ({"usage": []}, "'usage' is not an object"),
        ({"artifacts": [{"path": "a"}]}, "without its 'sha256' field"),
        ({"outputs": "x"}, "'outputs' is not a list"),
        ({"runtime": "datascience"}, "'runtime' is not an object"),
        ({"runtime": {"name": "datascience"}}, "without its 'tree_sha256' field"),
    ],
)
def test_a_form_that_does_not_fit_names_what_is_wrong(
    change: dict[str, object], needle: str
) -> None:
    data = {**result_to_dict(_full()), **change}
    with pytest.raises(ConfigError, match=needle):
        result_from_dict(data)
    missing = result_to_dict(_full())
    del missing["run_id"]
    with pytest.raises(ConfigError, match="without its 'run_id' field"):
        result_from_dict(missing)
