"""Shared fixtures: real sandboxes, as root (in-process executor) and as an ordinary user (the CLI).

``sandbox`` is parametrized over the identities this host can test. As root, runs go through one
in-process :class:`Executor`; as the unprivileged user, through ``sandcell run --json`` started with
``runuser``, so the whole rootless path (workspace helper, rlimits mode) is exercised. A host that
cannot do one of them skips those tests with the reason; CI creates the user so both run.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandcell import (
    ConfigError,
    Executor,
    IsolationMode,
    IsolationUnavailable,
    Limits,
    RunRequest,
    input_from_path,
    result_to_dict,
)
from sandcell.backends.registry import LADDER
from sandcell.backends.warm import WarmConfig
from sandcell.spec import MiB

UNPRIV_USER = os.environ.get("SANDCELL_TEST_USER", "sandcell-test")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sandbox:
    """Runs code in a real sandbox as one identity and returns the ``--json`` result as a dict."""

    identity: str
    run: Callable[..., dict[str, object]]
    home: Path
    start: str = "cold"
    """How the sandbox starts: ``cold``, ``template`` or ``pool`` (warm starts, python only)."""
    backend: str = "namespaces"
    """The rung of the isolation ladder: ``namespaces``, ``gvisor`` or ``microvm``."""


@pytest.fixture(scope="session")
def root_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandcell-home")


@pytest.fixture(scope="session")
def executor(root_home: Path) -> Iterator[Executor]:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor fixture runs as root; this test run is not root")
    # The sandbox is what these fixtures test: the "unchecked" profile lets every program through
    # the static checks (which have their own tests) to the sandbox itself.
    with Executor(home=root_home, profile="unchecked") as ex:
        yield ex


def _warm_executor(root_home: Path, mode: str) -> Iterator[Executor]:
    if os.geteuid() != 0:
        pytest.skip("the in-process executor fixture runs as root; this test run is not root")
    warm = WarmConfig(mode=mode)  # type: ignore[arg-type]
    with Executor(home=root_home, profile="unchecked", warm=warm) as ex:
        yield ex


@pytest.fixture(scope="session")
def executor_template(root_home: Path) -> Iterator[Executor]:
    """The root executor with warm starts from a template (numpy and pandas preloaded)."""
    yield from _warm_executor(root_home, "template")


@pytest.fixture(scope="session")
def executor_pool(root_home: Path) -> Iterator[Executor]:
    """The root executor with a warm pool of pre-isolated sandboxes."""
    yield from _warm_executor(root_home, "pool")


REQUIRED_BACKENDS_ENV = "SANDCELL_REQUIRE_BACKENDS"
"""Comma-separated backends that must run (CI sets it): their tests fail instead of skipping."""


def backend_unavailable(backend: str, reason: str) -> None:
    """Skip for a backend this host cannot run, unless CI requires it: then fail."""
    required = {b.strip() for b in os.environ.get(REQUIRED_BACKENDS_ENV, "").split(",")}
    if backend in required:
        pytest.fail(f"backend {backend} is required here (${REQUIRED_BACKENDS_ENV}): {reason}")
    pytest.skip(f"backend {backend} is not usable on this host: {reason}")


def runtime_required(name: str) -> None:
    """Skip a test that needs the built runtime ``name`` where it is not built, unless CI
    requires sandboxes (``.ci/run`` builds every shipped runtime): then fail."""
    from sandcell.errors import ConfigError
    from sandcell.runtimes.store import find

    try:
        find(name)
    except ConfigError as exc:
        if _sandbox_required():
            pytest.fail(f"runtime {name} is required here (.ci/run builds it): {exc}")
        pytest.skip(f"runtime {name} is not built on this host: {exc}")


@pytest.fixture(scope="session")
def ladder_executors(root_home: Path) -> Iterator[dict[tuple[str, str], Executor]]:
    """Root executors of the upper rungs (gvisor, microvm), built on first use per start mode,
    each kept for the session. A backend the host cannot provide is remembered as a skip."""
    if os.geteuid() != 0:
        pytest.skip("the in-process executor fixture runs as root; this test run is not root")
    built: dict[tuple[str, str], Executor] = {}
    yield built
    for ex in built.values():
        ex.close()


def settle_pools(executors: Mapping[tuple[str, str], Executor], timeout: float = 120) -> None:
    """Wait until every warm pool of the suite's ladder executors is full and idle, so a test
    that compares this process's descriptors or children before and after is not disturbed by
    a pool refilling in the background."""
    deadline = time.monotonic() + timeout
    for ex in executors.values():
        stats_of = getattr(ex.backend, "warm_stats", None)
        while stats_of is not None and time.monotonic() < deadline:
            stats = stats_of()
            pool = getattr(stats, "pool", stats)  # the microVM's WarmStats nests its pool
            # The namespaces rung's Node pool beside its template's (size 0 until a JS run).
            node = getattr(stats, "node_pool", None)
            if (pool is None or pool.ready >= pool.size) and (
                node is None or node.ready >= node.size
            ):
                break
            time.sleep(0.1)
        else:
            if stats_of is not None:
                pytest.fail(f"the {ex.backend.name} pool did not fill within {timeout:g} s")


def ladder_executor(
    cache: dict[tuple[str, str], Executor], root_home: Path, backend: str, start: str
) -> Executor:
    key = (backend, start)
    if key not in cache:
        # Two sandboxes waiting: enough for one test at a time, and idle guests cost CPU.
        warm = None if start == "cold" else WarmConfig(mode=start, pool_size=2)  # type: ignore[arg-type]
        try:
            cache[key] = Executor(home=root_home, profile="unchecked", backend=backend, warm=warm)
        except IsolationUnavailable as exc:
            backend_unavailable(backend, str(exc))
    return cache[key]


def _readable_by(user: str, path: Path) -> bool:
    return (
        subprocess.run(
            ["runuser", "-u", user, "--", "test", "-r", str(path)], capture_output=True, check=False
        ).returncode
        == 0
    )


@dataclass(frozen=True)
class UnprivEnv:
    user: str
    python: str
    pythonpath: str
    home: Path
    runs: Path
    mode: IsolationMode = IsolationMode.STRICT
    pycache: Path | None = None
    """The user's own bytecode cache (``PYTHONPYCACHEPREFIX``): it may not write the checkout's
    ``__pycache__``, so without one every ``sandcell`` it starts compiles sandcell again."""


@pytest.fixture(scope="session")
def unpriv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UnprivEnv]:
    """An ordinary user that can run this checkout's sandcell (staged where it can read it)."""
    if os.geteuid() != 0:
        pytest.skip("switching to an unprivileged user needs root (run the suite as root)")
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed (util-linux)")
    try:
        pwd.getpwnam(UNPRIV_USER)
    except KeyError:
        pytest.skip(f"user {UNPRIV_USER} does not exist; create it: useradd -m {UNPRIV_USER}")
    real_python = Path(os.path.realpath(sys.executable))
    if not _readable_by(UNPRIV_USER, real_python):
        pytest.skip(
            f"the base interpreter {real_python} is not readable by {UNPRIV_USER}; build the "
            "test venv from a system Python (/usr/bin/python3), as .ci/run does"
        )
    stage = Path(f"/tmp/sandcell-unpriv-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(mode=0o755)
    venv = Path(sys.prefix)
    if _readable_by(UNPRIV_USER, venv / "pyvenv.cfg") and _readable_by(UNPRIV_USER, REPO / "src"):
        python, src = str(venv / "bin" / "python"), REPO / "src"
    else:
        shutil.copytree(venv, stage / "venv", symlinks=True)
        shutil.copytree(REPO / "src", stage / "src", symlinks=True)
        python, src = str(stage / "venv" / "bin" / "python"), stage / "src"
    home = stage / "home"
    runs = stage / "runs"
    pycache = stage / "pycache"
    for d in (home, runs, pycache):
        d.mkdir()
        shutil.chown(d, UNPRIV_USER, UNPRIV_USER)
        d.chmod(0o700)
    env = UnprivEnv(
        user=UNPRIV_USER, python=python, pythonpath=str(src), home=home, runs=runs, pycache=pycache
    )
    yield UnprivEnv(**{**env.__dict__, "mode": _user_mode(env)})
    shutil.rmtree(stage, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _shared_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where ``PYTHONDONTWRITEBYTECODE`` is set, every sandcell program the suite starts as root
    (the CLI, services, session servers: hundreds of them) would compile all of sandcell again
    from source. For the session they share one bytecode cache outside the checkout instead
    (``PYTHONPYCACHEPREFIX``): still nothing is written in the tree, and the same code runs."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        yield
        return
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    try:
        yield
    finally:
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        os.environ["PYTHONDONTWRITEBYTECODE"] = saved


def run_as_user(
    env: UnprivEnv,
    args: Sequence[str],
    *,
    stdin: bytes = b"",
    timeout: float = 120,
    extra_env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.CompletedProcess[bytes]:
    """``sandcell ARGS`` as the unprivileged user, with a clean environment (plus the user's
    bytecode cache, and ``extra_env`` and ``pass_fds``, for tests that check those do not reach
    the sandbox)."""
    cmd = [
        "runuser", "-u", env.user, "--", "env", "-i",
        "PATH=/usr/bin:/bin", f"HOME={env.home}", f"PYTHONPATH={env.pythonpath}",
        f"SANDCELL_HOME={env.home}", f"SANDCELL_RUNS={env.runs}",
        *([f"PYTHONPYCACHEPREFIX={env.pycache}"] if env.pycache is not None else []),
        *(f"{k}={v}" for k, v in (extra_env or {}).items()),
        env.python, "-m", "sandcell", *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, input=stdin, capture_output=True, timeout=timeout, check=False, pass_fds=pass_fds
    )


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: bytes = b"",
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``sandcell ARGS`` in a subprocess of this interpreter; stdout and stderr decoded."""
    proc = subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        input=stdin,
        capture_output=True,
        env=dict(env),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    return subprocess.CompletedProcess(
        proc.args,
        proc.returncode,
        proc.stdout.decode("utf-8", errors="replace"),
        proc.stderr.decode("utf-8", errors="replace"),
    )


def _cli_args(
    code: str,
    *,
    lang: str,
    inputs: Sequence[Path],
    exports: Sequence[str],
    limits: dict[str, float],
) -> list[str]:
    args = ["run", "--json", "--profile", "unchecked", "--lang", lang, "-c", code]
    for p in inputs:
        args += ["--input", str(p)]
    for g in exports:
        args += ["--export", g]
    flag = {
        "wall_time_s": "--timeout",
        "cpu_time_s": "--cpu-time",
        "memory_mb": "--memory",
        "max_pids": "--pids",
        "max_open_files": "--open-files",
        "max_file_mb": "--file-size",
        "workspace_mb": "--workspace",
        "stdout_bytes": "--max-stdout",
        "stderr_bytes": "--max-stderr",
    }
    for key, value in limits.items():
        args += [flag[key], str(value)]
    return args


def _limits(limits: dict[str, float]) -> Limits:
    conv = dict(limits)
    for key, new in (
        ("memory_mb", "memory_bytes"),
        ("max_file_mb", "max_file_bytes"),
        ("workspace_mb", "workspace_bytes"),
    ):
        if key in conv:
            conv[new] = int(conv.pop(key) * MiB)
    return Limits().with_(**conv)


# identity[-backend][-start]: the backend is a rung of the isolation ladder (namespaces when
# absent); python runs of the warm modes start from a template or a pool (bash, and what else a
# warm start cannot serve, start cold there and say so).
SANDBOX_PARAMS = [
    "root",
    "user",
    "root-template",
    "root-pool",
    "user-pool",
    "root-gvisor",
    "user-gvisor",
    "root-gvisor-pool",
    # A cold microVM boots a guest kernel per run (seconds under TCG): the whole suite runs on
    # pooled VMs, restored from a snapshot; tests/contract/test_microvm.py covers cold boots.
    "root-microvm-pool",
    "user-microvm-pool",
    # Python in WebAssembly inside a namespaces sandbox: pooled as root (the start a caller
    # keeps warm), cold as the user (the rootless launch of Node and Pyodide's snapshot).
    "root-wasm-pool",
    "user-wasm",
]


def parse_sandbox_param(param: str) -> tuple[str, str, str]:
    """``"root-microvm-pool"`` -> ``("root", "microvm", "pool")``."""
    identity, *rest = param.split("-")
    backend = rest.pop(0) if rest and rest[0] in LADDER else None
    start = rest.pop(0) if rest else "cold"
    assert not rest and start in ("cold", "template", "pool"), param
    return identity, backend or "namespaces", start


CONTRACT_PARAMS = [p for p in SANDBOX_PARAMS if p == "user" or p.startswith("root")]
"""The behaviour contract's cases: every rung and start mode as root, the ordinary user once.
The user's path differs from root's on the host side (the CLI, the rootless launch, the weaker
mode), which the user's namespaces case and every escape test on every rung exercise; running
each behavioural check again as the user on each rung only repeated those (minutes of suite)."""


NODE_PARAMS = [
    "root",
    "user",
    "root-pool",
    "root-gvisor",
    "user-gvisor",
    "root-microvm-pool",
    "user-microvm-pool",
]
"""The cases of JavaScript and TypeScript programs: every rung that runs them, root and user.
On namespaces ``root-pool`` takes the Node pool's waiting sandboxes (``node_pool.py``: Node
started ahead, the program handed over) once a first run has filled it; the templates are Python
interpreters and the user's rlimits mode starts Node cold, so their cases would repeat the cold
one. gVisor starts Node cold (its pool is Python's), the microVM from a pooled VM (its runner
execs Node); the wasm rung refuses them before the run."""


@pytest.fixture(params=NODE_PARAMS)
def node_sandbox(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    """The ``sandbox`` fixture's runner on :data:`NODE_PARAMS`, where the Node runtime is built
    (``sandcell runtime build node``; a skip here, a failure where CI requires sandboxes)."""
    runtime_required("node")
    return make_sandbox(request, root_home, tmp_path)


@pytest.fixture(params=SANDBOX_PARAMS)
def sandbox(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    """A runner for real sandboxed runs, once as root and once as an ordinary user, on every
    rung, each also with warm starts (``root-template``, ``root-pool``, ``user-pool``...).

    ``run(code, lang="python", inputs=(), exports=(), stdin=b"", **limits)`` where limits are
    ``wall_time_s, cpu_time_s, memory_mb, max_pids, max_open_files, max_file_mb, workspace_mb,
    stdout_bytes, stderr_bytes``. Returns the JSON result. The user identity runs in the weaker
    ``rlimits`` mode when this host gives ordinary users no cgroups (recorded in the result).
    """
    return make_sandbox(request, root_home, tmp_path)


def make_sandbox(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    """The ``sandbox`` fixture's runner for ``request.param`` (a :data:`SANDBOX_PARAMS` entry);
    a module that runs another set of cases defines its own ``sandbox`` fixture with it."""
    identity, backend, start = parse_sandbox_param(str(request.param))
    runner = _make_runner(
        request, root_home, tmp_path, identity=identity, backend=backend, start=start
    )
    if backend != "wasm":
        return runner

    def run_wasm(code: str, *, lang: str = "python", **kwargs: object) -> dict[str, object]:
        # The wasm rung runs Python only: a bash case does not apply there (its refusal before
        # the run has its own test, tests/contract/test_wasm.py).
        if lang != "python":
            pytest.skip(f"the wasm rung runs Python only, not {lang}: no processes, no shell")
        return runner.run(code, lang=lang, **kwargs)

    return Sandbox(
        identity=runner.identity, run=run_wasm, home=runner.home, start=start, backend=backend
    )


WASM_HAS_NO = {
    "processes": (
        "no processes: Python in WebAssembly cannot fork, exec, wait for or signal another "
        "process (Pyodide has no os.fork or subprocess; os.kill is Emscripten's stub, which "
        "refuses every signal with EPERM and makes no system call); tests/escapes/"
        "test_wasm_escapes.py tries them"
    ),
    "sockets": (
        "no sockets of the kernel: socket() is Emscripten's emulation, which hands back an "
        "object for any family and type without a system call, so the attempt 'succeeds' "
        "while nothing reaches the kernel; tests/escapes/test_wasm_escapes.py proves no "
        "connection arrives"
    ),
    "unix_sockets": (
        "no Unix sockets: Pyodide's socket module has no AF_UNIX (family 1 gets Emscripten's "
        "emulated socket, whose connect fails 'bad family' without a system call), so no host "
        "socket can be named"
    ),
    "dns": (
        "no resolver: Emscripten's getaddrinfo makes up an address (172.29.x.x) for any name "
        "without sending a query, and its UDP sockets reach no kernel; tests/escapes/"
        "test_wasm_escapes.py proves no connection arrives"
    ),
    "interfaces": (
        "no network interfaces: socket.if_nameindex is Emscripten's netlink emulation (it makes "
        "no system call) and /proc/net does not exist in Pyodide's filesystem"
    ),
    "ioctl": (
        "no terminal ioctls: Pyodide has no fcntl or termios modules and its stdin is no "
        "terminal, so TIOCSTI cannot be attempted"
    ),
    "outside": (
        "no network and no governed tools: a run with an allowlist or tools is refused before "
        "it starts (tests/contract/test_wasm.py), so there is no proxy or gateway to attack"
    ),
    "links": (
        "no links: in Pyodide's mount of the workspace os.symlink is refused (EACCES, for any "
        "target) and os.link does not exist, so the attack cannot make what the export would "
        "have to refuse"
    ),
    "special_files": (
        "no special files: Pyodide has no os.mkfifo, no os.mknod and no AF_UNIX sockets, so "
        "the attack cannot make a FIFO, a device node or a socket file for the export to refuse"
    ),
    "big_files": (
        "no file over 2 GiB: Pyodide's file offsets are 32-bit (truncate(10 GiB) raises "
        "OverflowError before any call), so the 10 GiB sparse file cannot be made"
    ),
    "packages": (
        "no compiled packages: the wasm rung refuses numpy, pandas and matplotlib before the "
        "run (tests/contract/test_wasm.py asserts the refusal)"
    ),
}
"""What the wasm rung does not have, so that a test of it cannot apply there: the reasons."""


def wasm_cannot(sandbox: Sandbox, what: str) -> None:
    """Skip on the wasm rung a test of something it has none of (``what``: a key of
    :data:`WASM_HAS_NO`), saying why; on every other rung the test runs as written."""
    if sandbox.backend == "wasm":
        pytest.skip(f"the wasm rung has {WASM_HAS_NO[what]}")


def _make_runner(
    request: pytest.FixtureRequest,
    root_home: Path,
    tmp_path: Path,
    *,
    identity: str,
    backend: str,
    start: str,
) -> Sandbox:
    if identity == "root":
        if backend == "namespaces":
            ex: Executor = request.getfixturevalue(
                "executor" if start == "cold" else f"executor_{start}"
            )
        else:
            ex = ladder_executor(
                request.getfixturevalue("ladder_executors"), root_home, backend, start
            )

        def run_root(
            code: str,
            *,
            lang: str = "python",
            inputs: Sequence[Path] = (),
            exports: Sequence[str] = (),
            stdin: bytes = b"",
            profile: str | None = None,
            host_env: Mapping[str, str] | None = None,
            **limits: float,
        ) -> dict[str, object]:
            req = RunRequest(
                code=code,
                language=lang,  # type: ignore[arg-type]
                inputs=tuple(input_from_path(p) for p in inputs),
                exports=tuple(exports),
                stdin=stdin,
                limits=_limits(limits),
            )
            with _host_environ(host_env or {}):
                return result_to_dict(ex.run(req, profile=profile))

        return Sandbox(identity="root", run=run_root, home=root_home, start=start, backend=backend)

    env: UnprivEnv = request.getfixturevalue("unpriv")
    for p in (tmp_path, *tmp_path.parents):
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)
    mode = env.mode

    def run_user(
        code: str,
        *,
        lang: str = "python",
        inputs: Sequence[Path] = (),
        exports: Sequence[str] = (),
        stdin: bytes = b"",
        profile: str | None = None,
        host_env: Mapping[str, str] | None = None,
        **limits: float,
    ) -> dict[str, object]:
        args = _cli_args(code, lang=lang, inputs=inputs, exports=exports, limits=limits)
        if profile is not None:
            args[args.index("unchecked")] = profile
        if mode is IsolationMode.RLIMITS:
            args.insert(1, "--isolation=rlimits")
        if start != "cold":
            args.insert(1, f"--start={start}")
        if backend != "namespaces":
            args.insert(1, f"--backend={backend}")
        if stdin:
            stdin_file = tmp_path / f"stdin-{os.urandom(4).hex()}"
            stdin_file.write_bytes(stdin)
            stdin_file.chmod(0o644)
            args += ["--stdin", str(stdin_file)]
        proc = run_as_user(env, args, extra_env=host_env)
        if proc.returncode == 78 and b"is unavailable" in proc.stderr and backend != "namespaces":
            backend_unavailable(backend, proc.stderr.decode(errors="replace").strip())
        if proc.returncode == 78 and not proc.stdout:
            # The CLI's "refused before running" status: the same error the API raises.
            raise ConfigError(proc.stderr.decode(errors="replace").strip())
        try:
            out: dict[str, object] = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise AssertionError(
                f"sandcell as {env.user} printed no JSON (exit {proc.returncode}): "
                f"{proc.stderr.decode(errors='replace')}"
            ) from None
        return out

    return Sandbox(identity="user", run=run_user, home=env.home, start=start, backend=backend)


@contextlib.contextmanager
def _host_environ(values: Mapping[str, str]) -> Iterator[None]:
    """The executor's process environment with ``values`` set (a tool's credential is read by
    the host's gateway from there), restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _user_mode(env: UnprivEnv) -> IsolationMode:
    """The mode the ordinary user's tests run in: what sandcell gives that user here, which must
    be what this host is expected to give (:func:`_expected_user_mode`), never a silent fallback
    to the weaker ``rlimits`` mode."""
    probe = run_as_user(env, ["run", "--json", "-c", "pass"])
    if probe.returncode == 0:
        got = IsolationMode.STRICT
    elif b"cgroups is unavailable" in probe.stderr:
        got = IsolationMode.RLIMITS
    else:
        raise AssertionError(f"sandcell cannot run as {env.user}: {probe.stderr.decode()}")
    expected, why = _expected_user_mode(env)
    if expected is None:
        if _sandbox_required():
            raise AssertionError(
                f"sandcell gives {env.user} the {got.value} mode here, and nothing says which mode "
                f"this host must give ({why}); set SANDCELL_TEST_USER_MODE=strict or rlimits"
            )
        import warnings

        warnings.warn(
            f"{env.user} runs in the {got.value} mode, unchecked ({why}); set "
            "SANDCELL_TEST_USER_MODE to check it",
            stacklevel=1,
        )
        return got
    if got is not expected:
        raise AssertionError(
            f"sandcell gives {env.user} the {got.value} mode, but this host must give "
            f"{expected.value} ({why}): {probe.stderr.decode(errors='replace').strip()}"
        )
    return got


def _expected_user_mode(env: UnprivEnv) -> tuple[IsolationMode | None, str]:
    """The mode the ordinary user must get here, and why: ``SANDCELL_TEST_USER_MODE`` when set,
    else a fact of a cgroup v1 host (the user may create run cgroups only where the kernel lets
    it write every controller sandcell uses); None where no such fact is known (cgroup v2, whose
    delegation a test cannot see from outside)."""
    declared = os.environ.get("SANDCELL_TEST_USER_MODE")
    if declared:
        try:
            return IsolationMode(declared), f"SANDCELL_TEST_USER_MODE={declared}"
        except ValueError:
            raise AssertionError(
                f"SANDCELL_TEST_USER_MODE={declared!r}: give strict or rlimits"
            ) from None
    from sandcell.backends.host.cgroups import GROUP_PREFIX, V1_CONTROLLERS

    v1: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _dev, point, fstype, opts, *_ = line.split()
        for ctrl in opts.split(",") if fstype == "cgroup" else ():
            v1.setdefault(ctrl, Path(point))
    if not set(V1_CONTROLLERS) <= set(v1):
        return None, "not a cgroup v1 host"
    places = [
        v1[c] / GROUP_PREFIX if (v1[c] / GROUP_PREFIX).exists() else v1[c] for c in V1_CONTROLLERS
    ]
    closed = [str(p) for p in places if not _writable_by(env.user, p)]
    if closed:
        return IsolationMode.RLIMITS, f"cgroup v1, and {env.user} cannot write {', '.join(closed)}"
    return IsolationMode.STRICT, f"cgroup v1, and {env.user} can write every controller"


def _writable_by(user: str, path: Path) -> bool:
    return (
        subprocess.run(
            ["runuser", "-u", user, "--", "test", "-w", str(path)], capture_output=True, check=False
        ).returncode
        == 0
    )


def _sandbox_required() -> bool:
    """CI, or a run that says every sandbox test must really run (``.ci/run`` sets it)."""
    ci = os.environ.get("CI", "").lower() in ("1", "true")
    return ci or os.environ.get("SANDCELL_REQUIRE_SANDBOX") == "1"


# --- A run where every sandbox test skipped is a failure where sandboxes are required ----------

_SANDBOX_FIXTURES = frozenset(
    {"sandbox", "attack", "executor", "executor_template", "executor_pool", "unpriv"}
)
_SANDBOX_TESTS = {"wanted": 0, "ran": 0}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _SANDBOX_TESTS["wanted"] = sum(
        1 for item in items if _SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def pytest_runtest_call(item: pytest.Item) -> None:
    # Called only once every fixture was set up: the test really got a sandbox.
    if _SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())):
        _SANDBOX_TESTS["ran"] += 1


def _no_sandbox_ran() -> str | None:
    wanted, ran = _SANDBOX_TESTS["wanted"], _SANDBOX_TESTS["ran"]
    if _sandbox_required() and wanted and not ran:
        return (
            f"{wanted} sandbox tests were collected and none ran (all skipped: not root, or no "
            f"user {UNPRIV_USER}?); CI=1 or SANDCELL_REQUIRE_SANDBOX=1 requires them"
        )
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _no_sandbox_ran() is not None:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    message = _no_sandbox_ran()
    if message is not None:
        terminalreporter.section("sandbox tests required", sep="=", red=True, bold=True)
        terminalreporter.write_line(f"FAILED: {message}", red=True)


# --- No real model requests from tests -------------------------------------------------------
# Model adapters are tested against local servers; nothing a test does may reach a real provider
# (it would cost money, leak prompts and make results depend on the internet).

_MODEL_ENV_PREFIXES = ("OPENAI_", "ANTHROPIC_")


def _loopback(address: object) -> bool:
    host = address[0] if isinstance(address, tuple) and address else address
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.fixture(scope="session")
def _empty_model_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model-config") / "config.toml"
    path.write_text("# tests/conftest.py: no model is configured during tests\n")
    return path


@pytest.fixture(autouse=True)
def _no_model_requests(monkeypatch: pytest.MonkeyPatch, _empty_model_config: Path) -> None:
    """Blocks connections to anything but loopback and unix sockets, and hides model settings.

    ``OPENAI_*``, ``ANTHROPIC_*`` and ``SANDCELL_MODEL`` are removed and ``SANDCELL_CONFIG`` points
    at an empty file, so neither this process nor a CLI subprocess that inherits the environment
    finds a key or a developer's model config. The connect guard covers this process only.
    """
    for name in list(os.environ):
        if name.startswith(_MODEL_ENV_PREFIXES) or name == "SANDCELL_MODEL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("SANDCELL_CONFIG", str(_empty_model_config))

    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def refuse(sock: socket.socket, address: object) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
            raise PermissionError(
                errno.EACCES,
                f"tests may not connect to {address!r}: only loopback and unix sockets "
                "(tests/conftest.py _no_model_requests)",
            )

    def connect(sock: socket.socket, address: object) -> None:
        refuse(sock, address)
        real_connect(sock, address)  # type: ignore[arg-type]

    def connect_ex(sock: socket.socket, address: object) -> int:
        refuse(sock, address)
        return real_connect_ex(sock, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


# --- A real PostgreSQL for the shared-state store (tests/pg_server.py) ------------------------

if TYPE_CHECKING:
    from tests.pg_server import PostgresServer

REQUIRED_POSTGRES_ENV = "SANDCELL_REQUIRE_POSTGRES"
"""``1`` (CI sets it): a test that needs PostgreSQL fails where it cannot start one."""


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster for the session (a start costs about a second); tests each take a
    database of their own from it (``postgres_url``). A test that stops or restarts it must
    leave it running."""
    # Imported here: only the tests that use PostgreSQL need psycopg.
    from tests.pg_server import PostgresServer, PostgresServerError, unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        server = PostgresServer()
        try:
            server.start()
        except PostgresServerError as exc:
            server.close()
            reason = str(exc)
        else:
            try:
                yield server
            finally:
                server.close()
            return
    if os.environ.get(REQUIRED_POSTGRES_ENV) == "1":
        pytest.fail(f"PostgreSQL is required here (${REQUIRED_POSTGRES_ENV}=1): {reason}")
    pytest.skip(f"PostgreSQL is not usable on this host: {reason}")


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database of this test's own, dropped afterwards."""
    with _fresh_database(postgres_server) as url:
        yield url


@contextlib.contextmanager
def _fresh_database(server: PostgresServer, template: str = "template0") -> Iterator[str]:
    """A new database on ``server``, a copy of ``template``, dropped when the block ends."""
    if not server.is_running():
        server.start()  # an earlier test stopped it and failed before starting it again
    name = f"test_{uuid.uuid4().hex[:16]}"
    url = server.create_database(name, template=template)
    yield url
    if not server.is_running():
        server.start()
    server.drop_database(name)


# --- One store contract, two databases (tests/store_backend.py) -------------------------------

if TYPE_CHECKING:
    from tests.store_backend import StoreBackend


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test using ``store_backend`` runs once per database: ``[sqlite]`` and ``[postgres]``;
    one marked ``sqlite_only`` (it is about the SQLite file itself) runs on SQLite alone, and so
    does one marked ``store_free`` (pure logic in a store module: a second database would run
    the same code again)."""
    if "store_backend" not in metafunc.fixturenames:
        return
    from tests.store_backend import BACKENDS

    only_sqlite = any(
        metafunc.definition.get_closest_marker(name) is not None
        for name in ("sqlite_only", "store_free")
    )
    names = ["sqlite"] if only_sqlite else list(BACKENDS)
    metafunc.parametrize("store_backend", names, indirect=True, ids=names)


@pytest.fixture(scope="session")
def _migrated_template(postgres_server: PostgresServer) -> Iterator[str]:
    """A database migrated to this sandcell's schemas once per session, which each store test's
    database copies: a copy costs about a third less than migrating every one. (Migrating a
    fresh database is tested in tests/unit/test_store_postgres.py.)"""
    from sandcell.db.migrate import upgrade

    name = f"store_template_{uuid.uuid4().hex[:12]}"
    upgrade(postgres_server.create_database(name))  # its connection is closed on return
    yield name
    if not postgres_server.is_running():
        postgres_server.start()
    postgres_server.drop_database(name)


@pytest.fixture
def store_backend(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StoreBackend]:
    """Where the test's stores live: SQLite files under the home (``$SANDCELL_DATABASE_URL``
    unset), or a fresh PostgreSQL database of the test's own, already at this sandcell's
    schema version. Used through ``pytestmark = pytest.mark.usefixtures("store_backend")`` so
    it is set up before the test's other fixtures open stores."""
    from tests.store_backend import StoreBackend

    if request.param == "sqlite":
        monkeypatch.delenv("SANDCELL_DATABASE_URL", raising=False)
        yield StoreBackend("sqlite")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    template: str = request.getfixturevalue("_migrated_template")
    with _fresh_database(server, template) as url:
        monkeypatch.setenv("SANDCELL_DATABASE_URL", url)
        yield StoreBackend("postgres", url)


@pytest.fixture(scope="module")
def own_server(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """A PostgreSQL of the module's own, which its tests stop and start (the session's shared
    one is never down); ``postgres_server`` is asked for first: it skips or fails where
    PostgreSQL is not usable."""
    from tests.pg_server import PostgresServer

    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
