"""Packages from the wheel cache in microVMs: sent in with the job, verified on the host first,
held read-only in the guest under ``/packages/<name>`` and importable after the runtime's own,
as on the namespaces backend. Pooled VMs take such runs (root through the API, an ordinary user
through the CLI and the policy gate); a cache entry changed after it was added is refused.

The wheels are made here (tests/unit/test_packages.py's ``make_wheel``): nothing is downloaded.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, run_as_user
from tests.unit.test_packages import make_wheel

from sandcell import Executor, RunRequest
from sandcell.backends.microvm import MicroVMBackend, probe
from sandcell.backends.warm import WarmConfig
from sandcell.errors import ConfigError
from sandcell.packages import CachedPackage, WheelCache
from sandcell.spec import Outcome

status = probe()
pytestmark = pytest.mark.skipif(not status.usable, reason=f"microVM backend: {status.detail}")

_MODULE = b"VALUE = 'from the cache'\n"
_SHOW = """
import sys, tinypkg
print(tinypkg.VALUE)
print(tinypkg.__file__)
site = max(i for i, p in enumerate(sys.path) if p.endswith("site-packages"))
print(sys.path.index("/packages/tinypkg-1.0") > site)
"""


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executor]:
    home = tmp_path_factory.mktemp("microvm-packages-home")
    backend = MicroVMBackend(warm=WarmConfig(mode="pool", pool_size=1))
    with Executor(home=home, profile="unchecked", backend=backend) as ex:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            stats = backend.warm_stats()
            assert stats is not None and stats.pool is not None
            if stats.pool.ready or stats.template_state.get("error"):
                break
            time.sleep(0.2)
        yield ex


def _cached(root: Path, where: Path) -> CachedPackage:
    wheel = make_wheel(where, files={"tinypkg/__init__.py": _MODULE})
    [pkg] = WheelCache(root).prepare_files([wheel])
    return pkg


def test_a_cache_package_imports_in_a_pooled_vm(pooled: Executor, tmp_path: Path) -> None:
    pkg = _cached(tmp_path / "cache", tmp_path / "wheel")
    r = pooled.run(RunRequest(code=_SHOW, packages=(pkg.path,)))
    assert r.outcome is Outcome.OK, (r.reason, r.stderr)
    assert r.stdout.splitlines() == [
        "from the cache",
        "/packages/tinypkg-1.0/tinypkg/__init__.py",
        "True",  # after the runtime's own site-packages
    ]
    assert r.start.mode == "pool", r.start
    assert r.enforcement is not None and "packages" in r.enforcement.layers


def test_the_package_directory_is_read_only_for_the_program(
    pooled: Executor, tmp_path: Path
) -> None:
    pkg = _cached(tmp_path / "cache", tmp_path / "wheel")
    code = """
import errno, os
root = "/packages/tinypkg-1.0"
st = os.stat(root + "/tinypkg/__init__.py")
print("owner", st.st_uid, oct(st.st_mode & 0o777))
print("readonly", bool(os.statvfs(root).f_flag & os.ST_RDONLY))
attempts = {
    "overwrite": lambda: open(root + "/tinypkg/__init__.py", "w"),
    "create": lambda: open(root + "/tinypkg/evil.py", "x"),
    "create_top": lambda: open("/packages/evil.py", "x"),
    "mkdir": lambda: os.mkdir(root + "/sub"),
    "chmod": lambda: os.chmod(root + "/tinypkg/__init__.py", 0o666),
    "unlink": lambda: os.unlink(root + "/tinypkg/__init__.py"),
    "rename": lambda: os.rename(root + "/tinypkg", root + "/moved"),
}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "ALLOWED")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
import tinypkg
print("value", tinypkg.VALUE)
"""
    r = pooled.run(RunRequest(code=code, packages=(pkg.path,)))
    assert r.outcome is Outcome.OK, (r.reason, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0] == "owner 0 0o444", lines
    assert lines[1] == "readonly True", lines
    results = dict(line.split(" ", 1) for line in lines[2:-1])
    assert set(results) == {
        "overwrite",
        "create",
        "create_top",
        "mkdir",
        "chmod",
        "unlink",
        "rename",
    }
    assert all(v in ("EROFS", "EACCES", "EPERM") for v in results.values()), results
    assert lines[-1] == "value from the cache"


@pytest.mark.parametrize("damage", ["module", "extra_file", "wheel"])
def test_a_tampered_cache_entry_is_refused(pooled: Executor, tmp_path: Path, damage: str) -> None:
    pkg = _cached(tmp_path / "cache", tmp_path / "wheel")
    if damage == "module":
        (pkg.path / "tinypkg" / "__init__.py").write_text("VALUE = 'tampered'\n")
    elif damage == "extra_file":
        (pkg.path / "tinypkg" / "sneaky.py").write_text("import os\n")
    else:
        wheel = tmp_path / "cache" / "wheels" / pkg.wheel
        wheel.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(ConfigError, match=r"tinypkg .*sandcell packages remove tinypkg"):
        pooled.run(RunRequest(code="import tinypkg; print(tinypkg.VALUE)", packages=(pkg.path,)))


def test_a_session_vm_gets_the_package_and_keeps_it_read_only(
    pooled: Executor, tmp_path: Path
) -> None:
    # The public Session admits an empty request (no imports, so no packages); a session
    # request that carries packages reaches the backend like this.
    pkg = _cached(tmp_path / "cache", tmp_path / "wheel")
    backend = pooled.backend
    assert isinstance(backend, MicroVMBackend)
    request = RunRequest(code="", packages=(pkg.path,))
    cells = backend.session_sandbox(request, session_id=uuid.uuid4().hex)
    try:
        cells.start()
        first = cells.run_cell(_SHOW, timeout_s=60, hard_deadline=None)
        assert first.outcome is Outcome.OK, (first.reason, first.stderr)
        assert first.stdout.decode().splitlines() == [
            "from the cache",
            "/packages/tinypkg-1.0/tinypkg/__init__.py",
            "True",
        ]
        write = "open('/packages/tinypkg-1.0/tinypkg/__init__.py', 'w')"
        second = cells.run_cell(write, timeout_s=60, hard_deadline=None)
        assert second.outcome is Outcome.ERROR, (second.outcome, second.stdout)
        assert b"Read-only file system" in second.stderr, second.stderr
    finally:
        cells.teardown()


def test_a_tampered_entry_refuses_the_session_before_a_vm_starts(
    pooled: Executor, tmp_path: Path
) -> None:
    pkg = _cached(tmp_path / "cache", tmp_path / "wheel")
    (pkg.path / "tinypkg" / "__init__.py").write_text("VALUE = 'tampered'\n")
    backend = pooled.backend
    assert isinstance(backend, MicroVMBackend)
    request = RunRequest(code="", packages=(pkg.path,))
    with pytest.raises(ConfigError, match="does not match its lock"):
        backend.session_sandbox(request, session_id=uuid.uuid4().hex)


def test_a_directory_outside_any_cache_is_refused(pooled: Executor, tmp_path: Path) -> None:
    loose = tmp_path / "site" / "tinypkg-1.0"
    (loose / "tinypkg").mkdir(parents=True)
    (loose / "tinypkg" / "__init__.py").write_text("VALUE = 1\n")
    with pytest.raises(ConfigError, match="not a package of a wheel cache"):
        pooled.run(RunRequest(code="import tinypkg", packages=(loose,)))


def test_a_cold_vm_gets_the_package_too(tmp_path: Path) -> None:
    pkg = _cached(tmp_path / "cache", tmp_path / "wheel")
    with Executor(home=tmp_path / "home", profile="unchecked", backend=MicroVMBackend()) as ex:
        r = ex.run(RunRequest(code=_SHOW, packages=(pkg.path,)))
    assert r.outcome is Outcome.OK, (r.reason, r.stderr)
    assert r.stdout.splitlines()[0] == "from the cache"
    assert r.start.mode == "cold"


def test_an_ordinary_user_imports_an_allowed_package_in_a_pooled_vm(
    unpriv: UnprivEnv, tmp_path: Path
) -> None:
    for p in (tmp_path, *tmp_path.parents):
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)
    wheel = make_wheel(tmp_path / "wheel", files={"tinypkg/__init__.py": _MODULE})
    wheel.parent.chmod(0o755)
    wheel.chmod(0o644)
    added = run_as_user(unpriv, ["packages", "add", "--wheel", str(wheel)])
    assert added.returncode == 0, added.stderr.decode(errors="replace")
    builtin = Path(__file__).parents[2] / "src/sandcell/policy/builtin/unchecked.toml"
    text = builtin.read_text().replace("allowed_packages = []", 'allowed_packages = ["tinypkg"]')
    assert 'allowed_packages = ["tinypkg"]' in text
    profile = tmp_path / "with-tinypkg.toml"
    profile.write_text(text)
    profile.chmod(0o644)
    args = ["run", "--json", "--backend=microvm", "--start=pool", f"--profile={profile}"]
    proc = run_as_user(unpriv, [*args, "-c", _SHOW], timeout=600)
    if proc.returncode == 78 and b"is unavailable" in proc.stderr:
        pytest.skip(f"microVMs as {unpriv.user}: {proc.stderr.decode(errors='replace').strip()}")
    out = json.loads(proc.stdout or b"{}")
    assert out.get("outcome") == "ok", (proc.returncode, proc.stderr, out.get("reason"))
    assert str(out["stdout"]).splitlines() == [
        "from the cache",
        "/packages/tinypkg-1.0/tinypkg/__init__.py",
        "True",
    ]
    start = out.get("start")
    assert isinstance(start, dict) and start.get("mode") == "pool", start
