"""The gVisor backend runs each program in the runtime its request names, on real runsc sandboxes.

Cold runs, the warm pool (made of ``WarmConfig.runtime``: a run in another runtime starts cold
and says why; preload names the runtime lacks are left out), session cells (Python, and Bash
through the session's kernel) and Bash runs all mount the request's runtime at the neutral
``/opt/sandcell/venv``: ``datascience`` offers scipy and scikit-learn at the versions its lock
pins, ``minimal`` has no numpy.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.conftest import backend_unavailable, runtime_required

from sandcell.backends.base import BackendResult
from sandcell.backends.warm import WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.runtimes import python_runtime
from sandcell.runtimes.store import find
from sandcell.sessions.bash_cell import bash_cell
from sandcell.spec import Limits, Outcome, RunRequest

NEUTRAL_VENV = "/opt/sandcell/venv"
SCIENCE = (
    "import sys, scipy, sklearn\n"
    "from scipy import stats\n"
    "from sklearn.linear_model import LinearRegression\n"
    "fit = LinearRegression().fit([[0], [1], [2]], [1, 3, 5])\n"
    "print(sys.prefix)\n"
    "print(scipy.__version__, sklearn.__version__)\n"
    "print(round(float(fit.coef_[0]), 6), stats.ttest_ind([1, 2, 3], [1, 2, 3]).pvalue)\n"
)


def _need_runtime(name: str) -> None:
    """Skip (fail where sandboxes are required) when the runtime is not built here."""
    runtime_required(name)
    python_runtime(name)  # verified: a tampered build fails the test, it does not skip it


def _backend(warm: WarmConfig | None = None) -> object:
    from sandcell.backends.gvisor import GVisorBackend

    try:
        return GVisorBackend(warm=warm)
    except IsolationUnavailable as exc:
        backend_unavailable("gvisor", str(exc))
        raise  # not reached: backend_unavailable skips or fails


def _run(backend: object, request: RunRequest, run_id: str = "rt") -> BackendResult:
    result: BackendResult = backend.run(  # type: ignore[attr-defined]
        request, run_id=run_id, collect=lambda ws: ((), ())
    )
    return result


def _science_versions() -> str:
    dists = find("datascience").manifest.distributions
    return f"{dists['scipy']} {dists['scikit-learn']}"


def _assert_science(r: BackendResult) -> None:
    assert r.outcome is Outcome.OK, r.stderr.decode(errors="replace")
    assert r.stdout.decode().splitlines() == [NEUTRAL_VENV, _science_versions(), "2.0 1.0"]


@pytest.fixture(scope="module")
def cold() -> Iterator[object]:
    b = _backend()
    yield b
    b.close()  # type: ignore[attr-defined]


def test_cold_run_in_datascience(cold: object) -> None:
    _need_runtime("datascience")
    _assert_science(_run(cold, RunRequest(code=SCIENCE, runtime="datascience")))


def test_minimal_cannot_import_numpy(cold: object) -> None:
    _need_runtime("minimal")
    r = _run(
        cold, RunRequest(code="import sys\nprint(sys.prefix)\nimport numpy", runtime="minimal")
    )
    assert r.outcome is Outcome.ERROR, r.stderr
    assert r.stdout.decode() == f"{NEUTRAL_VENV}\n"
    assert b"No module named 'numpy'" in r.stderr


def test_default_runtime_is_unchanged(cold: object) -> None:
    # None and "default" are sandcell's own environment, with numpy as before.
    for runtime in (None, "default"):
        r = _run(cold, RunRequest(code="import numpy; print('ok')", runtime=runtime))
        assert r.outcome is Outcome.OK and r.stdout == b"ok\n", r.stderr


def test_bash_run_in_datascience(cold: object) -> None:
    _need_runtime("datascience")
    code = (
        f"echo bash; {NEUTRAL_VENV}/bin/python -c 'import sys, scipy, sklearn; print(sys.prefix)'"
    )
    r = _run(cold, RunRequest(code=code, language="bash", runtime="datascience"))
    assert r.outcome is Outcome.OK, r.stderr
    assert r.stdout.decode().splitlines() == ["bash", NEUTRAL_VENV]


def test_pool_run_in_datascience() -> None:
    _need_runtime("datascience")
    warm = WarmConfig(
        mode="pool", pool_size=1, refill=False, runtime="datascience", preload=("numpy", "scipy")
    )
    b = _backend(warm)
    try:
        r = _run(b, RunRequest(code=SCIENCE, runtime="datascience"), run_id="ds-pool")
        _assert_science(r)
        assert r.start.mode == "pool", r.enforcement.layers.get("warm_start")
        assert r.start.preloaded == ("numpy", "scipy")
        assert b.warm_stats().runtime == "datascience"  # type: ignore[attr-defined]
    finally:
        b.close()  # type: ignore[attr-defined]


def test_default_pool_serves_datascience_cold() -> None:
    _need_runtime("datascience")
    b = _backend(WarmConfig(mode="pool", pool_size=1, refill=False, preload=()))
    try:
        r = _run(b, RunRequest(code=SCIENCE, runtime="datascience"), run_id="ds-cold")
        _assert_science(r)
        assert r.start.mode == "cold"
        why = r.enforcement.layers["warm_start"]
        assert "runtime default" in why and "runtime datascience" in why, why
        # The pool itself still serves its own runtime.
        r = _run(b, RunRequest(code="import numpy; print('ok')"), run_id="default-pool")
        assert r.outcome is Outcome.OK and r.stdout == b"ok\n", r.stderr
        assert r.start.mode == "pool"
    finally:
        b.close()  # type: ignore[attr-defined]


def test_minimal_pool_leaves_out_preload_it_lacks() -> None:
    _need_runtime("minimal")
    # The default preload is numpy and pandas: minimal has neither, and the pool still starts.
    b = _backend(WarmConfig(mode="pool", pool_size=1, refill=False, runtime="minimal"))
    try:
        assert b.warm_stats().preload == ()  # type: ignore[attr-defined]
        r = _run(b, RunRequest(code="import json; print(json.dumps(1))", runtime="minimal"))
        assert r.outcome is Outcome.OK and r.stdout == b"1\n", r.stderr
        assert r.start.mode == "pool" and r.start.preloaded == ()
    finally:
        b.close()  # type: ignore[attr-defined]


def test_session_cells_in_datascience(cold: object) -> None:
    _need_runtime("datascience")
    request = RunRequest(code="", runtime="datascience", limits=Limits(wall_time_s=120))
    sandbox = cold.session_sandbox(request, session_id="rt-ds")  # type: ignore[attr-defined]
    try:
        sandbox.start()
        first = sandbox.run_cell(
            "import sys, scipy\nfrom sklearn.linear_model import LinearRegression\n"
            "v = scipy.__version__\nprint(sys.prefix)",
            timeout_s=120,
            hard_deadline=None,
        )
        assert first.outcome is Outcome.OK, first.stderr
        assert first.stdout.decode() == f"{NEUTRAL_VENV}\n"
        second = sandbox.run_cell(
            "print(v, LinearRegression.__name__)", timeout_s=60, hard_deadline=None
        )
        assert second.outcome is Outcome.OK, second.stderr
        scipy_version = find("datascience").manifest.distributions["scipy"]
        assert second.stdout.decode() == f"{scipy_version} LinearRegression\n"
        program = f"{NEUTRAL_VENV}/bin/python -c 'import sklearn, sys; print(sys.prefix)'"
        bash = sandbox.run_cell(
            bash_cell(program, env={}, cwd=None), timeout_s=60, hard_deadline=None
        )
        assert bash.outcome is Outcome.OK, bash.stderr
        assert bash.stdout.decode() == f"{NEUTRAL_VENV}\n"
    finally:
        sandbox.teardown()
