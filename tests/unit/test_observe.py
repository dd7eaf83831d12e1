"""How the namespaces backend names the end of a run from what the launcher saw."""

from __future__ import annotations

from sandcell.backends.host.observe import classify
from sandcell.backends.host.process import Launched
from sandcell.spec import Limits, Outcome, RunRequest


def _launched(*, started: bool, stopped_by: str | None, exit_code: int | None) -> Launched:
    return Launched(
        started=started,
        exit_code=exit_code,
        signal=None,
        stdout=b"",
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
        stopped_by=stopped_by,
        wall_ms=12.0,
        cpu_ms_rusage=1.0,
        maxrss_bytes_rusage=0,
    )


def test_a_wall_time_shorter_than_the_start_is_a_timeout() -> None:
    request = RunRequest(code="print(1)", limits=Limits(wall_time_s=0.01))
    outcome, reason = classify(
        _launched(started=False, stopped_by="wall_time", exit_code=None), None, request
    )
    assert outcome is Outcome.TIMEOUT
    assert "before the program started" in reason


def test_a_sandbox_that_never_started_on_its_own_is_an_infra_error() -> None:
    request = RunRequest(code="print(1)")
    outcome, reason = classify(
        _launched(started=False, stopped_by=None, exit_code=1), None, request
    )
    assert outcome is Outcome.INFRA_ERROR
    assert "did not start the program" in reason
