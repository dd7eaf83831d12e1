"""The namespaces backend runs each program in the runtime its request names, on every start mode.

A named runtime (``sandcell runtime build NAME``) is its own stored tree of packages, bound as the
neutral venv's site-packages (``/opt/sandcell/venv``): a program in ``datascience`` sees exactly
that runtime's distributions (scipy, scikit-learn, ...), one in ``minimal`` sees none, one in
``default`` sees sandcell's own environment. Checked on real sandboxes, as root and as the
ordinary user: cold runs, bash runs, template and pool starts of a template made of the runtime,
a pool of another runtime that starts the run cold instead (and says why), and a session's
python and bash cells.

The backend is called directly with ``RunRequest.runtime`` set: what decides the runtime of a
run (the profile, ``--runtime``) is the executor's and has its own tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from tests.conftest import runtime_required

from sandcell.backends.base import BackendResult
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.backends.namespaces.session import SessionSandbox
from sandcell.backends.warm import WarmConfig
from sandcell.runtimes.store import find
from sandcell.sessions.bash_cell import bash_cell
from sandcell.spec import Limits, Outcome, RunRequest

if TYPE_CHECKING:
    from conftest import UnprivEnv

VENV = "/opt/sandcell/venv"
SITE = f"{VENV}/lib/python3."
LIMITS = Limits().with_(wall_time_s=120.0)
"""Importing scipy and scikit-learn on a busy 2-core host can take seconds."""

# What the program sees of its runtime: where it lives, and every distribution it can import.
PROBE = textwrap.dedent(
    """
    import importlib.metadata as md, json, re, sys
    import numpy, scipy
    dists = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
             for d in md.distributions()}
    print(json.dumps({"prefix": sys.prefix, "numpy": numpy.__file__, "scipy": scipy.__file__,
                      "numpy_version": numpy.__version__, "dists": dists}))
    """
).strip()
NO_NUMPY = "import numpy"


def _built(name: str) -> dict[str, str]:
    """The distributions of the runtime ``name``; skips when this host has not built it (fails
    where CI requires it)."""
    runtime_required(name)
    return dict(find(name).manifest.distributions)


@pytest.fixture(scope="module")
def datascience() -> dict[str, str]:
    return _built("datascience")


@pytest.fixture(scope="module")
def minimal() -> dict[str, str]:
    return _built("minimal")


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the root sandboxes of this module need root; this test run is not root")


def _backend(warm: WarmConfig | None) -> Iterator[NamespacesBackend]:
    _root()
    backend = NamespacesBackend(warm=warm)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="module")
def cold(datascience: dict[str, str]) -> Iterator[NamespacesBackend]:
    yield from _backend(None)


@pytest.fixture(scope="module")
def science_template(datascience: dict[str, str]) -> Iterator[NamespacesBackend]:
    yield from _backend(
        WarmConfig(mode="template", runtime="datascience", preload=("numpy", "scipy"))
    )


@pytest.fixture(scope="module")
def science_pool(datascience: dict[str, str]) -> Iterator[NamespacesBackend]:
    yield from _backend(WarmConfig(mode="pool", pool_size=1, runtime="datascience"))


@pytest.fixture(scope="module")
def default_pool(datascience: dict[str, str]) -> Iterator[NamespacesBackend]:
    yield from _backend(WarmConfig(mode="pool", pool_size=1, preload=("numpy",)))


def _run(
    backend: NamespacesBackend, code: str, runtime: str | None, language: str = "python"
) -> BackendResult:
    request = RunRequest(
        code=code,
        language=language,  # type: ignore[arg-type]
        runtime=runtime,
        limits=LIMITS,
    )
    return backend.run(request, run_id=f"rt-{uuid.uuid4().hex[:12]}", collect=lambda _p: ((), ()))


def _seen(stdout: str | bytes) -> dict[str, Any]:
    text = stdout.decode() if isinstance(stdout, bytes) else stdout
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines, "the program printed nothing"
    value: dict[str, Any] = json.loads(lines[-1])
    return value


def _assert_datascience(seen: dict[str, Any], dists: dict[str, str]) -> None:
    """The program ran in the stored datascience tree, at the neutral venv path."""
    assert seen["prefix"] == VENV
    assert seen["numpy"].startswith(SITE) and seen["scipy"].startswith(SITE), seen
    assert seen["numpy_version"] == dists["numpy"]
    # Exactly the runtime's distributions: none of sandcell's own environment.
    assert seen["dists"] == dists


# -- root ------------------------------------------------------------------------------------


def test_cold_run_in_datascience(cold: NamespacesBackend, datascience: dict[str, str]) -> None:
    r = _run(cold, PROBE, "datascience")
    assert r.outcome is Outcome.OK, r.stderr
    assert r.start.mode == "cold"
    _assert_datascience(_seen(r.stdout), datascience)


def test_bash_run_in_datascience(cold: NamespacesBackend) -> None:
    r = _run(
        cold,
        f"{VENV}/bin/python -c 'import sklearn, sys; print(sys.prefix, sklearn.__name__)'",
        "datascience",
        language="bash",
    )
    assert r.outcome is Outcome.OK, r.stderr
    assert r.stdout == f"{VENV} sklearn\n".encode()


@pytest.mark.parametrize("start", ["template", "pool"])
def test_warm_run_in_datascience(
    start: str, request: pytest.FixtureRequest, datascience: dict[str, str]
) -> None:
    backend: NamespacesBackend = request.getfixturevalue(f"science_{start}")
    r = _run(backend, PROBE, "datascience")
    assert r.outcome is Outcome.OK, r.stderr
    assert r.start.mode == start, r.enforcement.layers.get("warm_start")
    assert r.start.template is not None and r.start.template.startswith("datascience[")
    _assert_datascience(_seen(r.stdout), datascience)


def test_minimal_cannot_import_numpy_where_default_can(
    cold: NamespacesBackend, minimal: dict[str, str]
) -> None:
    r = _run(cold, NO_NUMPY, "minimal")
    assert r.outcome is Outcome.ERROR
    assert b"ModuleNotFoundError: No module named 'numpy'" in r.stderr, r.stderr
    for runtime in (None, "default"):
        r = _run(cold, "import numpy; print(numpy.__name__)", runtime)
        assert (r.outcome, r.stdout) == (Outcome.OK, b"numpy\n"), r.stderr


def test_minimal_template_drops_what_it_cannot_import(minimal: dict[str, str]) -> None:
    # numpy and pandas (the default preload) are not in minimal: the template starts without.
    _root()
    backend = NamespacesBackend(warm=WarmConfig(mode="template", runtime="minimal"))
    try:
        r = _run(backend, NO_NUMPY, "minimal")
        assert r.start.mode == "template", r.enforcement.layers.get("warm_start")
        assert r.start.preloaded == ()
        assert r.outcome is Outcome.ERROR
        assert b"ModuleNotFoundError: No module named 'numpy'" in r.stderr, r.stderr
    finally:
        backend.close()


def test_pool_of_another_runtime_starts_the_run_cold(
    default_pool: NamespacesBackend, datascience: dict[str, str]
) -> None:
    r = _run(default_pool, PROBE, "datascience")
    assert r.outcome is Outcome.OK, r.stderr
    assert r.start.mode == "cold"
    assert r.enforcement.layers["warm_start"] == (
        "not used: the pool serves runtime default; this run is in runtime datascience"
    )
    _assert_datascience(_seen(r.stdout), datascience)
    # Its own runtime's runs still come from the pool.
    r = _run(default_pool, "import numpy; print(numpy.__name__)", None)
    assert (r.outcome, r.stdout, r.start.mode) == (Outcome.OK, b"numpy\n", "pool"), r.stderr


def test_session_cells_in_datascience(cold: NamespacesBackend) -> None:
    request = RunRequest(code="", runtime="datascience", limits=LIMITS)
    sandbox = SessionSandbox(cold, request, session_id=f"rt-{uuid.uuid4().hex[:12]}")
    sandbox.start()
    try:
        cells = [
            "import sklearn, sys\nprint(sys.prefix, sklearn.__name__)",
            # A bash cell runs in the same sandbox: the runtime's interpreter is on its PATH.
            bash_cell(
                "python -c 'import sklearn, sys; print(sys.prefix, sklearn.__name__)'",
                env={},
                cwd=None,
            ),
        ]
        for code in cells:
            cell = sandbox.run_cell(code, timeout_s=120.0, hard_deadline=None)
            assert cell.outcome is Outcome.OK, cell.stderr
            assert cell.stdout == f"{VENV} sklearn\n".encode()
    finally:
        sandbox.teardown()


# -- the ordinary user -----------------------------------------------------------------------

# Runs one program as the unprivileged user, through the backend (rootless: the workspace
# helper), and prints what came back as one JSON line.
_AS_USER = textwrap.dedent(
    """
    import json, sys, uuid
    from sandcell.backends.namespaces import NamespacesBackend, WarmConfig
    from sandcell.backends.namespaces.session import SessionSandbox
    from sandcell.spec import IsolationMode, Limits, RunRequest
    start, runtime, mode, code = sys.argv[1:5]
    request = RunRequest(code=code, runtime=runtime, mode=IsolationMode(mode),
                         limits=Limits().with_(wall_time_s=120.0))
    warm = WarmConfig(mode=start, pool_size=1, runtime=runtime) if start == "pool" else None
    backend = NamespacesBackend(warm=warm)
    try:
        if start == "session":
            sandbox = SessionSandbox(backend, request, session_id=uuid.uuid4().hex[:12])
            sandbox.start()
            try:
                r = sandbox.run_cell(code, timeout_s=120.0, hard_deadline=None)
            finally:
                sandbox.teardown()
            started = "session"
        else:
            r = backend.run(request, run_id=uuid.uuid4().hex[:12], collect=lambda p: ((), ()))
            started = r.start.mode
    finally:
        backend.close()
    print(json.dumps({"outcome": r.outcome.value, "stdout": r.stdout.decode(),
                      "stderr": r.stderr.decode(), "start": started}))
    """
).strip()


def _as_user(env: UnprivEnv, start: str, runtime: str, code: str) -> dict[str, Any]:
    cmd = [
        "runuser", "-u", env.user, "--", "env", "-i",
        "PATH=/usr/bin:/bin", f"HOME={env.home}", f"PYTHONPATH={env.pythonpath}",
        f"SANDCELL_HOME={env.home}", f"SANDCELL_RUNS={env.runs}",
        *([f"PYTHONPYCACHEPREFIX={env.pycache}"] if env.pycache is not None else []),
        env.python, "-c", _AS_USER, start, runtime, env.mode.value, code,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return _seen(proc.stdout)


@pytest.mark.parametrize("start", ["cold", "pool", "session"])
def test_user_runs_in_datascience(
    start: str, unpriv: UnprivEnv, datascience: dict[str, str]
) -> None:
    r = _as_user(unpriv, start, "datascience", PROBE)
    assert r["outcome"] == Outcome.OK.value, r["stderr"]
    if start == "pool":
        # A run the prepared children do not fit is forked from the template at call time.
        assert r["start"] in ("pool", "template")
    _assert_datascience(_seen(r["stdout"]), datascience)


def test_user_minimal_cannot_import_numpy(unpriv: UnprivEnv, minimal: dict[str, str]) -> None:
    r = _as_user(unpriv, "cold", "minimal", NO_NUMPY)
    assert r["outcome"] == Outcome.ERROR.value
    assert "ModuleNotFoundError: No module named 'numpy'" in r["stderr"], r["stderr"]
